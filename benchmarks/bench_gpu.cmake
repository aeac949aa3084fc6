# bench_allreduce_gpu: the GPU rows of the all-reduce benchmark (our NCCL path against raw
# ncclAllReduce, cuda_peer against the device-copy bound). Built when the CUDA backend and NCCL are,
# with DISTRIBUTE_BENCH_GPU.
if(NOT DISTRIBUTE_BENCH_GPU)
  # nothing: benchmarks/CMakeLists.txt says when the GPU benchmarks are built
elseif(DISTRIBUTE_ENABLE_CUDA AND TARGET NCCL::NCCL)
  add_executable(bench_allreduce_gpu ${CMAKE_CURRENT_LIST_DIR}/bench_allreduce_gpu.cu)
  target_link_libraries(bench_allreduce_gpu PRIVATE distribute::cuda)
elseif(DISTRIBUTE_ENABLE_CUDA)
  message(STATUS "distribute: NCCL not found; bench_allreduce_gpu is not built")
endif()
