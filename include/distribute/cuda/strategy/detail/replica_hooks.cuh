#pragma once
// The step loop's hooks for GPU replicas (strategy/detail/run_loop.hpp), shared by the CUDA
// strategies: a replica's thread makes its GPU current for the step and waits for its stream before
// it departs, so results read after `run` are complete. After a failure it waits for the work the
// step queued (the caller may free buffers it reads once `run` throws); an NCCL kernel waiting for
// partners that gave up would never end, so that wait is bounded by the collective timeout, after
// which `abort(rank)` ends it (NCCL: abort this replica's communicator) and the rest is waited for.

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/strategy/detail/run_loop.hpp>

#include <chrono>
#include <cstddef>
#include <exception>
#include <utility>
#include <vector>

namespace distribute::detail {

// `Abort`: void(int rank) noexcept; `Failed`: void(const std::exception_ptr&), called on the calling
// thread when the step failed.
template <class Abort, class Failed>
struct cuda_replica_hooks {
  const std::vector<cuda>& devices;
  std::chrono::milliseconds timeout;
  Abort abort;
  Failed failed;

  device_guard enter(int rank) const { return device_guard(device(rank).index()); }
  void finish(int rank) const { device(rank).synchronize(); }
  void after_failure(int rank) const noexcept {
    const cuda& dev = device(rank);
    if (!drain_until(dev.stream(), dev.index(), std::chrono::steady_clock::now() + timeout)) abort(rank);
    (void)drain_until(dev.stream(), dev.index(), std::chrono::steady_clock::time_point::max());
  }
  void step_failed(const std::exception_ptr& e) const { failed(e); }

 private:
  const cuda& device(int rank) const { return devices[static_cast<std::size_t>(rank)]; }
};

template <class Abort, class Failed>
cuda_replica_hooks(const std::vector<cuda>&, std::chrono::milliseconds, Abort, Failed)
    -> cuda_replica_hooks<Abort, Failed>;

}  // namespace distribute::detail
