# bench_ops: the operations between layers (reductions, broadcasting, element-wise functions) on the
# CPU engine against the streaming-bandwidth bound measured in the same run, and PyTorch's same
# operations where a Python with torch is given (--peer). Built for this machine (-march=native).
distribute_add_cpu_benchmark(bench_ops)
target_compile_definitions(bench_ops PRIVATE "DISTRIBUTE_BENCH_SOURCE_DIR=\"${CMAKE_CURRENT_LIST_DIR}\"")
