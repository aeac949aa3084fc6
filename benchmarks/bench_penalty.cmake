# bench_penalty: a discriminator step with an R1 penalty (nn::r1_penalty, a gradient recorded on the
# tape) against the same step without, and PyTorch's two steps on the same threads where a Python
# with torch is given (--peer). Built for this machine (-march=native).
add_executable(bench_penalty ${CMAKE_CURRENT_LIST_DIR}/bench_penalty.cpp)
target_link_libraries(bench_penalty PRIVATE distribute::distribute)
target_compile_definitions(bench_penalty PRIVATE "DISTRIBUTE_BENCH_SOURCE_DIR=\"${CMAKE_CURRENT_LIST_DIR}\"")
distribute_native_arch(bench_penalty)
distribute_enable_warnings(bench_penalty)
