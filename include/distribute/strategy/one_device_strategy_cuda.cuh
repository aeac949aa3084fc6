#pragma once
// one_device_strategy on a GPU: one replica, `run` a direct call (with the device made current on the
// calling thread), collectives no-ops (comm::cuda_solo). Work goes to the device's stream: pass
// `cuda{0}.on(stream)` to choose it; the default is the device's default stream.

#include <distribute/concepts/strategy.hpp>
#include <distribute/device/cuda.cuh>
#include <distribute/per_replica.hpp>
#include <distribute/replica_context.hpp>
#include <distribute/strategy/detail/cuda_replica_comm.cuh>
#include <distribute/strategy/detail/run_loop.hpp>
#include <distribute/strategy/detail/strategy_base.hpp>
#include <distribute/strategy/one_device_strategy.hpp>

#include <array>
#include <functional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace distribute {

template <>
class one_device_strategy<cuda> : public strategy_base<one_device_strategy<cuda>, 1> {
 public:
  using device_type = cuda;
  using replica_type = replica_context<cuda, comm::cuda_solo>;

  // cuda:0.
  one_device_strategy() : one_device_strategy(cuda{0}) {}
  explicit one_device_strategy(cuda device) : devices_{check(device)} {}

  static constexpr int num_replicas_in_sync() noexcept { return 1; }
  std::span<const cuda, 1> devices() const noexcept { return devices_; }
  const cuda& device() const noexcept { return devices_[0]; }

  template <class F, class... A>
  auto run(F&& fn, A&&... args) {
    const detail::device_guard current(devices_[0].index());
    replica_type r{devices_[0], comm::cuda_solo{devices_[0].stream()}};
    return detail::run_one(r, fn, args...);
  }

  template <class F, class... A>
  decltype(auto) run_on_primary(F&& fn, A&&... args) {
    const detail::device_guard current(devices_[0].index());
    replica_type r{devices_[0], comm::cuda_solo{devices_[0].stream()}};
    return std::invoke(fn, r, detail::unwrap_for(args, 0)...);
  }

 private:
  friend class strategy_base<one_device_strategy<cuda>, 1>;
  std::array<cuda, 1>& devices_for_factory() noexcept { return devices_; }

  static std::array<cuda, 1> check(cuda device) {
    const int n = cuda_device_count();
    if (device.index() < 0 || device.index() >= n)
      throw std::invalid_argument("distribute: one_device_strategy on " + device.name() + ", but " + std::to_string(n) +
                                  " CUDA device(s) are visible");
    return {device};
  }

  std::array<cuda, 1> devices_;
};

static_assert(strategy<one_device_strategy<cuda>>);

}  // namespace distribute
