# bench_nn: conv2d forward+backward GFLOP/s against the single-core FMA peak measured in the same run,
# and fused against per-tensor gradient all-reduce. Built for this machine's instruction set
# (-march=native): the peak is the hardware's, so Eigen must be allowed to use the same FMA units.
find_package(Eigen3 3.3 QUIET NO_MODULE)
if(Eigen3_FOUND)
  add_executable(bench_nn ${CMAKE_CURRENT_LIST_DIR}/bench_nn.cpp)
  target_link_libraries(bench_nn PRIVATE distribute::distribute Eigen3::Eigen)
  distribute_native_arch(bench_nn)
  distribute_enable_warnings(bench_nn)
  # bench_nn_gpu: the same convolutions (conv_cases.hpp) on a GPU replica, float32 and TF32, against the
  # device's SGEMM peak measured in the same run. Built where the CUDA backend is; its convolutions
  # need cuDNN in the build (without it the program measures the bound and says so). With
  # DISTRIBUTE_BENCH_GPU.
  if(TARGET distribute::cuda AND DISTRIBUTE_BENCH_GPU)
    add_executable(bench_nn_gpu ${CMAKE_CURRENT_LIST_DIR}/bench_nn_gpu.cu)
    target_link_libraries(bench_nn_gpu PRIVATE distribute::cuda)
    # Eigen's constexpr and defaulted host/device functions draw nvcc warnings about Eigen.
    target_compile_options(bench_nn_gpu PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-diag-suppress=20012,20013,20014,20015>)
  endif()
else()
  message(STATUS "distribute: Eigen3 not found; bench_nn is not built")
endif()
