# oneDNN, the CPU engine's convolution library, as the imported target distribute_dnnl::dnnl, with
# the OpenMP runtime it is built on (the engine sets each replica thread's OpenMP thread count).
# Found by header and library rather than by oneDNN's own package file, which on Debian also asks
# for OpenCL. Shared by the build and by the installed package's config.
if(NOT TARGET distribute_dnnl::dnnl)
  find_path(DISTRIBUTE_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.hpp)
  find_library(DISTRIBUTE_DNNL_LIBRARY NAMES dnnl)
  find_package(OpenMP QUIET COMPONENTS CXX)
  if(DISTRIBUTE_DNNL_INCLUDE_DIR AND DISTRIBUTE_DNNL_LIBRARY AND OpenMP_CXX_FOUND)
    add_library(distribute_dnnl::dnnl INTERFACE IMPORTED)
    set_target_properties(distribute_dnnl::dnnl PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${DISTRIBUTE_DNNL_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${DISTRIBUTE_DNNL_LIBRARY};OpenMP::OpenMP_CXX"
      INTERFACE_COMPILE_DEFINITIONS "DISTRIBUTE_USE_DNNL=1")
  endif()
endif()
