# bench_ops: the operations between layers (reductions, broadcasting, element-wise functions) on the
# CPU engine against the streaming-bandwidth bound measured in the same run, and PyTorch's same
# operations where a Python with torch is given (--peer). Built for this machine (-march=native).
find_package(OpenMP QUIET COMPONENTS CXX)
add_executable(bench_ops ${CMAKE_CURRENT_LIST_DIR}/bench_ops.cpp)
target_link_libraries(bench_ops PRIVATE distribute::distribute)
if(OpenMP_CXX_FOUND)
  target_link_libraries(bench_ops PRIVATE OpenMP::OpenMP_CXX)
endif()
target_compile_definitions(bench_ops PRIVATE "DISTRIBUTE_BENCH_SOURCE_DIR=\"${CMAKE_CURRENT_LIST_DIR}\"")
distribute_native_arch(bench_ops)
distribute_enable_warnings(bench_ops)
