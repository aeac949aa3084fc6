# NCCL and cuDNN as imported targets, NCCL::NCCL and CUDNN::CUDNN. FindCUDAToolkit knows neither; both
# usually sit beside the toolkit (its lib/ or lib64/), in a system prefix, or in a Python
# environment's nvidia packages (point NCCL_ROOT / CUDNN_ROOT, or CMAKE_PREFIX_PATH, there).
#
# Used by the top-level CMakeLists.txt and, installed, by distributeConfig.cmake. Needs CUDAToolkit
# found first. Either library may be missing: NCCL::NCCL then does not exist, distribute::cuda links
# without it and <distribute/comm/nccl.cuh> is unavailable (config.hpp probes <nccl.h>).

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
