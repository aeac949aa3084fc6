# bench_tape: the CycleGAN example's training step wired by hand beside the same step on nn::tape,
# checked equal bit for bit and then timed in interleaved rounds (the tape's cost). It includes the
# example's headers and needs what the example needs (the layers: Eigen). Built for this machine's
# instruction set (-march=native), as bench_cyclegan is.
find_package(Eigen3 3.3 QUIET NO_MODULE)
if(Eigen3_FOUND)
  add_executable(bench_tape ${CMAKE_CURRENT_LIST_DIR}/bench_tape.cpp)
  target_include_directories(bench_tape PRIVATE ${PROJECT_SOURCE_DIR}/examples/cyclegan)
  target_link_libraries(bench_tape PRIVATE distribute::distribute Eigen3::Eigen)
  distribute_native_arch(bench_tape)
  distribute_enable_warnings(bench_tape)
else()
  message(STATUS "distribute: Eigen3 not found; bench_tape is not built")
endif()
