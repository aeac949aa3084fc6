# bench_weight_pieces: convolutions' weight gradients computed in one-thread pieces, as the CPU engine
# does, against the same pass as one oneDNN primitive on the same threads and against that primitive's
# one-thread speed scaled to all of them, in one run. Where oneDNN is in the build. Built for this
# machine (-march=native).
if(DISTRIBUTE_EXPORTED_DNNL)
  distribute_add_cpu_benchmark(bench_weight_pieces)
endif()
