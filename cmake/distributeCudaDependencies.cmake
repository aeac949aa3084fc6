# NCCL and cuDNN as imported targets, NCCL::NCCL and CUDNN::CUDNN. FindCUDAToolkit knows neither; both
# usually sit beside the toolkit (its lib/ or lib64/), in a system prefix, or in a Python
# environment's nvidia packages (point NCCL_ROOT / CUDNN_ROOT, or CMAKE_PREFIX_PATH, there).
# And the cudnn-frontend headers with what they need, as distribute_cudnn::frontend (below).
#
# Used by the top-level CMakeLists.txt and, installed, by distributeConfig.cmake. Needs CUDAToolkit
# found first. Either library may be missing: NCCL::NCCL then does not exist, distribute::cuda links
# without it and <distribute/cuda/comm/nccl.cuh> is unavailable (config.hpp probes <nccl.h>).

set(_distribute_cuda_hints "")
if(CUDAToolkit_LIBRARY_ROOT)
  list(APPEND _distribute_cuda_hints "${CUDAToolkit_LIBRARY_ROOT}")
endif()
if(CUDAToolkit_TARGET_DIR)
  list(APPEND _distribute_cuda_hints "${CUDAToolkit_TARGET_DIR}")
endif()
if(CUDAToolkit_LIBRARY_DIR)
  get_filename_component(_distribute_cuda_libparent "${CUDAToolkit_LIBRARY_DIR}" DIRECTORY)
  list(APPEND _distribute_cuda_hints "${_distribute_cuda_libparent}")
endif()

function(_distribute_find_cuda_library name header library target)
  string(TOUPPER "${name}" upper)
  find_path(DISTRIBUTE_${upper}_INCLUDE_DIR ${header}
    HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV ${upper}_ROOT ${_distribute_cuda_hints}
    PATH_SUFFIXES include)
  find_library(DISTRIBUTE_${upper}_LIBRARY ${library}
    HINTS ${CUDAToolkit_LIBRARY_DIR} ENV ${upper}_ROOT ${_distribute_cuda_hints}
    PATH_SUFFIXES lib lib64 lib/x64)
  if(DISTRIBUTE_${upper}_INCLUDE_DIR AND DISTRIBUTE_${upper}_LIBRARY AND NOT TARGET ${target})
    add_library(${target} SHARED IMPORTED)
    set_target_properties(${target} PROPERTIES
      IMPORTED_LOCATION "${DISTRIBUTE_${upper}_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${DISTRIBUTE_${upper}_INCLUDE_DIR}")
  endif()
endfunction()

_distribute_find_cuda_library(nccl nccl.h nccl NCCL::NCCL)
_distribute_find_cuda_library(cudnn cudnn.h cudnn CUDNN::CUDNN)
unset(_distribute_cuda_hints)

# The GPU engine's convolutions: NVIDIA's cudnn-frontend, a header-only C++ library over cuDNN's graph
# API (scripts/setup.sh fetches its headers into build/cudnn-frontend/include). Found by
# DISTRIBUTE_CUDNN_FRONTEND_INCLUDE_DIR (a cache variable: set it to use other headers), under
# CUDNN_FRONTEND_ROOT (variable or environment), or in the folders the includer lists in
# _distribute_cudnn_frontend_hints. Where it, cuDNN and nvrtc (which the frontend calls) are all
# found, distribute_cudnn::frontend carries the headers, links both libraries and defines
# DISTRIBUTE_HAS_CUDNN=1 (config.hpp); otherwise it does not exist and the build has no cuDNN
# convolutions. It also defines CUDNN_FRONTEND_SKIP_JSON_LIB, which leaves the frontend's JSON
# serialisation (and nlohmann/json) out: that halves the time to compile a file that includes it
# (from about 2.5 to 1.3 minutes here). The definition is on the target, not in our header, so that
# every file of a program sees the same frontend classes (the macro changes their virtual functions).
find_path(DISTRIBUTE_CUDNN_FRONTEND_INCLUDE_DIR cudnn_frontend.h
  HINTS ${CUDNN_FRONTEND_ROOT} ENV CUDNN_FRONTEND_ROOT ${_distribute_cudnn_frontend_hints}
  PATH_SUFFIXES include
  DOC "The cudnn-frontend headers (the folder holding cudnn_frontend.h)")
if(DISTRIBUTE_CUDNN_FRONTEND_INCLUDE_DIR AND EXISTS "${DISTRIBUTE_CUDNN_FRONTEND_INCLUDE_DIR}/cudnn_frontend.h"
   AND TARGET CUDNN::CUDNN AND TARGET CUDA::nvrtc AND NOT TARGET distribute_cudnn::frontend)
  add_library(distribute_cudnn::frontend INTERFACE IMPORTED)
  set_target_properties(distribute_cudnn::frontend PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${DISTRIBUTE_CUDNN_FRONTEND_INCLUDE_DIR}"
    INTERFACE_LINK_LIBRARIES "CUDNN::CUDNN;CUDA::nvrtc"
    INTERFACE_COMPILE_DEFINITIONS "DISTRIBUTE_HAS_CUDNN=1;CUDNN_FRONTEND_SKIP_JSON_LIB")
endif()
