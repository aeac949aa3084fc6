# bench_nn: conv2d forward+backward GFLOP/s against the single-core FMA peak measured in the same run,
# and fused against per-tensor gradient all-reduce. Built for this machine's instruction set
# (-march=native): the peak is the hardware's, so Eigen must be allowed to use the same FMA units.
find_package(Eigen3 3.3 QUIET NO_MODULE)
if(Eigen3_FOUND)
  add_executable(bench_nn ${CMAKE_CURRENT_LIST_DIR}/bench_nn.cpp)
  target_link_libraries(bench_nn PRIVATE distribute::distribute Eigen3::Eigen)
  distribute_native_arch(bench_nn)
  distribute_enable_warnings(bench_nn)
else()
  message(STATUS "distribute: Eigen3 not found; bench_nn is not built")
endif()
