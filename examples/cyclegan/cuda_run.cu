// cyclegan_train on GPU replicas (--device cuda): the same program (program.hpp) with the strategies
// instantiated for `cuda`. Compiled by nvcc into cyclegan_train beside its C++ translation unit, to
// which it hands run_cuda (program.hpp's run_on_cuda) before main; the CPU strategies stay in that
// unit, compiled by the C++ compiler with oneDNN.
#include "program.hpp"
#include "graphs.cuh"

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/engine/cuda.cuh>
#include <distribute/cuda/strategy/mirrored_strategy.cuh>
#include <distribute/cuda/strategy/one_device_strategy.cuh>
#if DISTRIBUTE_HAS_MPI && DISTRIBUTE_HAS_NCCL
#  include <distribute/cuda/strategy/multi_worker_mirrored_strategy.cuh>
#endif

#include <stdexcept>
#include <string>
#include <vector>

namespace cyclegan {

// --replicas N dealt round-robin over the visible GPUs: one per GPU while there are GPUs enough (the
// strategy then reduces over NCCL), several logical replicas per GPU beyond that (cuda_peer). Not
// given: one replica per visible GPU.
inline std::vector<distribute::cuda> replica_devices(int replicas) {
  const int gpus = distribute::cuda_device_count();
  if (gpus == 0)
    throw std::runtime_error("--device cuda: no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)");
  std::vector<distribute::cuda> devices;
  for (int r = 0; r < (replicas > 0 ? replicas : gpus); ++r) devices.emplace_back(r % gpus);
  return devices;
}

summary run_cuda(const settings& st) {
  validate(st);
  if (st.strategy == "one_device") {
    (void)replica_devices(1);  // a clear error where no GPU is visible
    // A stream of its own: --graphs on captures the networks, which the legacy default stream refuses.
    const distribute::cuda_stream stream(0);
    distribute::one_device_strategy<distribute::cuda> s{distribute::cuda{0}.on(stream.get())};
    return run_with(s, st);
  }
  if (st.strategy == "mirrored") {
    distribute::mirrored_strategy<distribute::cuda> s{replica_devices(st.replicas)};
    return run_with(s, st);
  }
  if (st.strategy == "multi_worker") {
#if DISTRIBUTE_HAS_MPI && DISTRIBUTE_HAS_NCCL
    if (st.replicas > 1)
      throw std::invalid_argument("--replicas " + std::to_string(st.replicas) +
                                  ": under multi_worker --device cuda each worker "
                                  "drives one GPU (its node-local rank's); start one worker per GPU");
    distribute::multi_worker_mirrored_strategy<distribute::cuda, distribute::comm::nccl> s{
        distribute::multi_worker_cuda_options{}};
    try {
      return run_with(s, st);
    } catch (const distribute::collective_error& e) {
      if (s.num_workers() > 1) throw job_failed(e.what());
      throw;
    }
#else
    throw std::invalid_argument(
        "--strategy multi_worker --device cuda: this build of cyclegan_train has no MPI or no NCCL");
#endif
  }
  throw std::invalid_argument("--strategy must be one_device, mirrored or multi_worker, not '" + st.strategy + "'");
}

// Set before main (run_on_cuda is constant-initialised to null, so the order of initialisation
// between the two units does not matter).
[[maybe_unused]] const bool gpu_run_installed = (run_on_cuda = &run_cuda, true);

}  // namespace cyclegan
