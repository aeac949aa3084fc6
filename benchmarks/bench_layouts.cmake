# bench_layouts: the CPU engine's layout conversions around oneDNN's convolutions against oneDNN's
# reorder between the same layouts and the copy bound, in one run. Where oneDNN is in the build.
# Built for this machine (-march=native).
if(DISTRIBUTE_EXPORTED_DNNL)
  find_package(OpenMP QUIET COMPONENTS CXX)
  add_executable(bench_layouts ${CMAKE_CURRENT_LIST_DIR}/bench_layouts.cpp)
  target_link_libraries(bench_layouts PRIVATE distribute::distribute)
  if(OpenMP_CXX_FOUND)
    target_link_libraries(bench_layouts PRIVATE OpenMP::OpenMP_CXX)
  endif()
  distribute_native_arch(bench_layouts)
  distribute_enable_warnings(bench_layouts)
endif()
