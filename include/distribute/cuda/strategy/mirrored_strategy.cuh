#pragma once
// mirrored_strategy on GPUs: the strategy template of strategy/mirrored_strategy.hpp with the GPU's
// device policy (cuda/strategy/detail/device_policy.cuh): one replica per device of the list, each on
// its own persistent thread (replica 0 on the caller's) with its own stream, and the device made
// current on that thread.
//
//   mirrored_strategy<cuda> s;                                  every visible GPU
//   mirrored_strategy<cuda> s{{cuda{0}, cuda{2}}};              a device list
//   mirrored_strategy<cuda> s{cuda_replicas(4)};                4 logical replicas sharing cuda:0
//   mirrored_strategy<cuda> s{devices, {}, cuda_collective_engine::cuda_peer};   the engine forced
//
// The engine: NCCL when two or more replicas each have their own GPU (and NCCL is available), else
// our cuda_peer kernels (one replica, logical replicas sharing a GPU, or GPUs with peer access);
// `s.collective_engine()` says which.
//
// The step semantics are the CPU strategy's: per-replica arguments unwrapped, a throwing replica
// makes the others' collectives fail at once and `run` rethrows it, a collective a replica never
// joins fails with `collective_timeout`, mismatched collectives with `collective_mismatch`, and the
// next `run` starts clean (NCCL communicators aborted by a failure are rebuilt). In addition, `run`
// returns only once every replica's stream has finished the work the step queued on it, so results
// read after `run` are complete, and `timings()` counts that wait as compute.

#include <distribute/concepts/strategy.hpp>
#include <distribute/cuda/strategy/detail/device_policy.cuh>
#include <distribute/strategy/mirrored_strategy.hpp>

namespace distribute {

static_assert(strategy<mirrored_strategy<cuda>>);

}  // namespace distribute
