// bench_cyclegan: one CycleGAN training step of the example's trainer, timed (bench_cyclegan.hpp).
#include "bench_cyclegan.hpp"

namespace bench_cyclegan {
// --device cuda: bench_cyclegan_cuda.cu, in builds with CUDA.
int run_on_cuda(const options& o);
}  // namespace bench_cyclegan

int main(int argc, char** argv) {
  using namespace bench_cyclegan;
  const options o = parse(argc, argv);
  try {
    if (o.device == "cuda") {
#if defined(DISTRIBUTE_BENCH_CUDA)
      return run_on_cuda(o);
#else
      usage(
          "--device cuda: this build of bench_cyclegan has no CUDA side (configure with CUDA and "
          "-DDISTRIBUTE_BENCH_CYCLEGAN_CUDA=ON; benchmarks/peer/run_peer.sh --gpu does)");
#endif
    }
    const dist::compute_options engine = engine_options_for(o);
    if (o.strategy == "one_device") {
      dist::one_device_strategy<dist::cpu> s;
      s.set_compute_options(engine);
      return run(s, o);
    }
    if (o.strategy == "multi_worker") {
#if DISTRIBUTE_HAS_MPI
      dist::comm::mpi_options mpi;
      mpi.shared_memory = o.mpi_window;
      dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi> s{{.local_replicas = o.replicas, .mpi = mpi}};
      s.set_compute_options(engine);
      return run(s, o);
#else
      usage("--strategy multi_worker: this build of bench_cyclegan has no MPI");
#endif
    }
    dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(o.replicas)};
    s.set_compute_options(engine);
    return run(s, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cyclegan: %s\n", e.what());
    return 1;
  }
}
