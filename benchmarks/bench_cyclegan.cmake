# bench_cyclegan: one CycleGAN training step of the example's trainer on synthetic data, the side of
# "ours" in the comparison with PyTorch (benchmarks/peer/run_peer.sh). It includes the example's
# headers and needs what the example needs (the layers: Eigen). Built for this machine's instruction
# set (-march=native), as the peer's kernels are.
find_package(Eigen3 3.3 QUIET NO_MODULE)
if(Eigen3_FOUND)
  add_executable(bench_cyclegan ${CMAKE_CURRENT_LIST_DIR}/bench_cyclegan.cpp)
  target_include_directories(bench_cyclegan PRIVATE ${PROJECT_SOURCE_DIR}/examples/cyclegan)
  target_link_libraries(bench_cyclegan PRIVATE distribute::distribute Eigen3::Eigen)
  distribute_native_arch(bench_cyclegan)
  distribute_enable_warnings(bench_cyclegan)
else()
  message(STATUS "distribute: Eigen3 not found; bench_cyclegan is not built")
endif()
