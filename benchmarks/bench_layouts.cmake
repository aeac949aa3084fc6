# bench_layouts: the CPU engine's layout conversions around oneDNN's convolutions against oneDNN's
# reorder between the same layouts and the copy bound, in one run. Where oneDNN is in the build.
# Built for this machine (-march=native).
if(DISTRIBUTE_EXPORTED_DNNL)
  distribute_add_cpu_benchmark(bench_layouts)
endif()
