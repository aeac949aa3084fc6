// cyclegan_train: CycleGAN on Fashion-MNIST sneakers <-> ankle boots (or any trainA/trainB folders),
// under one device, mirrored over CPU replicas, or multi-worker under mpirun/srun, with the three
// selective-mirroring placements.
// `cyclegan_train --help` lists the flags; docs/cyclegan.md explains them.
#include "program.hpp"

#include <cstdio>
#include <exception>

int main(int argc, char** argv) {
  cyclegan::settings st;
  try {
    if (!cyclegan::parse_arguments(st, argc, argv)) {
      std::fputs(cyclegan::usage, stdout);
      return 0;
    }
    const auto sum = cyclegan::run(st);
    if (sum.preempted) return st.preempted_exit_code;
    if (!st.evaluate && !st.quiet && sum.chief)
      std::printf("pictures and loss curves: %s\n", st.out_dir.string().c_str());
    return sum.finite ? 0 : 2;
  } catch (const cyclegan::job_failed&) {
    return 1;  // the worker that saw the failure printed it; the job is being aborted
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cyclegan_train: error: %s\n", e.what());
    return 1;
  }
}
