#pragma once
// one_device_strategy on a GPU: the strategy template of strategy/one_device_strategy.hpp with the
// GPU's device policy (cuda/strategy/detail/device_policy.cuh): one replica, `run` a direct call with
// the device made current on the calling thread, collectives no-ops (comm::cuda_solo). Work goes to
// the device's stream: pass `cuda{0}.on(stream)` to choose it; the default is the device's default
// stream. The default device is cuda:0.

#include <distribute/concepts/strategy.hpp>
#include <distribute/cuda/strategy/detail/device_policy.cuh>
#include <distribute/strategy/one_device_strategy.hpp>

namespace distribute {

static_assert(strategy<one_device_strategy<cuda>>);

}  // namespace distribute
