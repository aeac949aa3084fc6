# oneDNN, the CPU engine's convolution library, as the imported target distribute_dnnl::dnnl, with
# the OpenMP runtime it is built on (the engine sets each replica thread's OpenMP thread count).
# Found by header and library rather than by oneDNN's own package file, which on Debian also asks
# for OpenCL. Shared by the build and by the installed package's config.
#
# Looked for first in the prefixes the includer lists in _distribute_dnnl_hints (the build:
# DISTRIBUTE_DNNL_ROOT where set; the installed config: the prefix the build used), then on the system
# (Debian's libdnnl-dev). The library is taken from the
# prefix the headers were found in, so headers of one version never meet the library of another.
# Either oneDNN 2.x or 3.x; it must be built on OpenMP (oneDNN's DNNL_CPU_THREADING_RUNTIME), as
# only then does it follow the thread counts the engine sets.
#
# Sets DISTRIBUTE_DNNL_VERSION (major.minor.patch) and DISTRIBUTE_DNNL_PREFIX (the prefix holding
# include/oneapi/dnnl) where found, DISTRIBUTE_DNNL_NOT_FOUND_REASON where not.
if(NOT TARGET distribute_dnnl::dnnl)
  # Found again when the prefixes to look in change (DISTRIBUTE_DNNL_ROOT set or cleared after the
  # first configure): the cached paths belong to the old search.
  if(NOT "${_distribute_dnnl_hints}" STREQUAL "${_DISTRIBUTE_DNNL_SEARCHED}")
    unset(DISTRIBUTE_DNNL_INCLUDE_DIR CACHE)
    unset(DISTRIBUTE_DNNL_LIBRARY CACHE)
    set(_DISTRIBUTE_DNNL_SEARCHED "${_distribute_dnnl_hints}" CACHE INTERNAL "the prefixes oneDNN was last looked for in")
  endif()
  find_path(DISTRIBUTE_DNNL_INCLUDE_DIR oneapi/dnnl/dnnl.h
    HINTS ${_distribute_dnnl_hints}
    PATH_SUFFIXES include
    DOC "oneDNN's headers (the folder holding oneapi/dnnl/dnnl.h)")
  unset(DISTRIBUTE_DNNL_VERSION)
  unset(DISTRIBUTE_DNNL_PREFIX)
  set(DISTRIBUTE_DNNL_NOT_FOUND_REASON "")
  if(DISTRIBUTE_DNNL_INCLUDE_DIR)
    get_filename_component(DISTRIBUTE_DNNL_PREFIX "${DISTRIBUTE_DNNL_INCLUDE_DIR}" DIRECTORY)
    find_library(DISTRIBUTE_DNNL_LIBRARY NAMES dnnl
      HINTS "${DISTRIBUTE_DNNL_PREFIX}"
      PATH_SUFFIXES lib lib64
      DOC "oneDNN's library, of the same prefix as its headers")
    file(STRINGS "${DISTRIBUTE_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_version.h" _distribute_dnnl_version_lines
      REGEX "^#define DNNL_VERSION_(MAJOR|MINOR|PATCH) ")
    foreach(_distribute_part IN ITEMS MAJOR MINOR PATCH)
      string(REGEX REPLACE ".*#define DNNL_VERSION_${_distribute_part} ([0-9]+).*" "\\1" _distribute_dnnl_${_distribute_part}
        "${_distribute_dnnl_version_lines}")
    endforeach()
    set(DISTRIBUTE_DNNL_VERSION "${_distribute_dnnl_MAJOR}.${_distribute_dnnl_MINOR}.${_distribute_dnnl_PATCH}")
    file(STRINGS "${DISTRIBUTE_DNNL_INCLUDE_DIR}/oneapi/dnnl/dnnl_config.h" _distribute_dnnl_runtime
      REGEX "^#define DNNL_CPU_THREADING_RUNTIME ")
    if(NOT _distribute_dnnl_runtime MATCHES "DNNL_RUNTIME_OMP")
      string(REGEX REPLACE "^#define DNNL_CPU_THREADING_RUNTIME +" "" _distribute_dnnl_runtime "${_distribute_dnnl_runtime}")
      set(DISTRIBUTE_DNNL_NOT_FOUND_REASON
        "the oneDNN in ${DISTRIBUTE_DNNL_PREFIX} is built on ${_distribute_dnnl_runtime}, not OpenMP")
    endif()
    unset(_distribute_dnnl_version_lines)
    unset(_distribute_dnnl_runtime)
    unset(_distribute_part)
  endif()
  find_package(OpenMP QUIET COMPONENTS CXX)
  if(NOT DISTRIBUTE_DNNL_INCLUDE_DIR OR NOT DISTRIBUTE_DNNL_LIBRARY)
    set(DISTRIBUTE_DNNL_NOT_FOUND_REASON "oneDNN not found")
  elseif(NOT OpenMP_CXX_FOUND)
    set(DISTRIBUTE_DNNL_NOT_FOUND_REASON "OpenMP not found")
  endif()
  if(NOT DISTRIBUTE_DNNL_NOT_FOUND_REASON)
    add_library(distribute_dnnl::dnnl INTERFACE IMPORTED)
    set_target_properties(distribute_dnnl::dnnl PROPERTIES
      INTERFACE_INCLUDE_DIRECTORIES "${DISTRIBUTE_DNNL_INCLUDE_DIR}"
      INTERFACE_LINK_LIBRARIES "${DISTRIBUTE_DNNL_LIBRARY};OpenMP::OpenMP_CXX"
      INTERFACE_COMPILE_DEFINITIONS "DISTRIBUTE_USE_DNNL=1")
  endif()
endif()
