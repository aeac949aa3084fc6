# bench_cyclegan: one CycleGAN training step of the example's trainer on synthetic data, the side of
# "ours" in the comparison with PyTorch (benchmarks/peer/run_peer.sh). It includes the example's
# headers and needs what the example needs (the layers: Eigen). Built for this machine's instruction
# set (-march=native), as the peer's kernels are.
find_package(Eigen3 3.3 QUIET NO_MODULE)
if(Eigen3_FOUND)
  add_executable(bench_cyclegan ${CMAKE_CURRENT_LIST_DIR}/bench_cyclegan.cpp)
  target_include_directories(bench_cyclegan PRIVATE ${PROJECT_SOURCE_DIR}/examples/cyclegan)
  target_link_libraries(bench_cyclegan PRIVATE distribute::distribute Eigen3::Eigen)
  if(TARGET distribute::mpi)
    target_link_libraries(bench_cyclegan PRIVATE distribute::mpi)  # --strategy multi_worker
  endif()
  distribute_native_arch(bench_cyclegan)
  distribute_enable_warnings(bench_cyclegan)
  # --device cuda: the GPU side (bench_cyclegan_cuda.cu), after the C++ file so that the linker keeps
  # the C++ compiler's copies of shared CPU templates (with oneDNN). It compiles the whole trainer
  # again with nvcc (minutes on two cores, the same code cyclegan_train's cuda_run.cu compiles), so it
  # is built on request: -DDISTRIBUTE_BENCH_CYCLEGAN_CUDA=ON (benchmarks/peer/run_peer.sh --gpu sets it).
  option(DISTRIBUTE_BENCH_CYCLEGAN_CUDA "Build bench_cyclegan's --device cuda side (needs the CUDA backend)" OFF)
  if(TARGET distribute::cuda AND DISTRIBUTE_BENCH_CYCLEGAN_CUDA)
    target_sources(bench_cyclegan PRIVATE ${CMAKE_CURRENT_LIST_DIR}/bench_cyclegan_cuda.cu)
    target_link_libraries(bench_cyclegan PRIVATE distribute::cuda)
    target_compile_definitions(bench_cyclegan PRIVATE DISTRIBUTE_BENCH_CUDA=1)
    target_compile_options(bench_cyclegan PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-diag-suppress=20012,20013,20014,20015>)
  endif()
else()
  message(STATUS "distribute: Eigen3 not found; bench_cyclegan is not built")
endif()
