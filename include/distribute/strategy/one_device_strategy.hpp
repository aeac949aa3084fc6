#pragma once
// One replica on one device. `run` is a direct call, every collective of the replica is an inline
// no-op of the device's group of one (comm::local on the CPU), and per-replica values live in place
// (no allocation): a step written for any strategy costs here what it would cost written by hand.
// One template for every device; the device policy (strategy/detail/device_policy.hpp) makes a GPU
// current around the step (cuda/strategy/one_device_strategy.cuh).

#include <distribute/comm/local.hpp>
#include <distribute/concepts/device.hpp>
#include <distribute/concepts/device_policy.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/strategy/detail/device_policy.hpp>
#include <distribute/engine/engine_slot.hpp>
#include <distribute/per_replica.hpp>
#include <distribute/replica_context.hpp>
#include <distribute/step_timings.hpp>
#include <distribute/strategy/detail/run_loop.hpp>
#include <distribute/strategy/detail/step_clock.hpp>
#include <distribute/strategy/detail/strategy_base.hpp>

#include <array>
#include <functional>
#include <span>
#include <type_traits>
#include <utility>

namespace distribute {

template <device D = cpu>
class one_device_strategy : public strategy_base<one_device_strategy<D>, 1> {
  static_assert(device_policy<detail::device_policy<D>>,
                "distribute: one_device_strategy<D> needs the device policy of D, from the strategy header of D's "
                "backend: for cuda, #include <distribute/cuda/strategy/one_device_strategy.cuh>");
  using policy = detail::device_policy<D>;

 public:
  using device_type = D;
  using replica_type = replica_context<D, typename policy::solo_communicator>;

  // cpu:0, cuda:0.
  one_device_strategy() : one_device_strategy(policy::default_device()) {}
  explicit one_device_strategy(D device) : devices_{policy::checked(std::move(device), "one_device_strategy")} {}

  static constexpr int num_replicas_in_sync() noexcept { return 1; }
  std::span<const D, 1> devices() const noexcept { return devices_; }
  const D& device() const noexcept { return devices_[0]; }

  // How the replica's compute engine works (engine/compute_options.hpp); by default it uses every
  // core. Between steps only: the engine is made anew, with empty caches.
  void set_compute_options(const compute_options& options) { engine_.reset(options, 0); }
  [[deprecated("distribute: set_engine_options is now set_compute_options")]]
  void set_engine_options(const compute_options& options) {
    set_compute_options(options);
  }

  // Calls `fn(replica, args...)` once; per-replica and mirrored arguments are unwrapped to their only
  // element. Returns per_replica<R, 1> (or nothing for a void fn).
  template <class F, class... A>
  auto run(F&& fn, A&&... args) {
    const detail::step_clock::step_scope timed{clock_};
    [[maybe_unused]] const auto entered = policy::enter(devices_[0]);
    replica_type r{devices_[0], policy::solo(devices_[0]), &engine_};
    return detail::run_one(r, fn, args...);
  }

  // Where the time went since this strategy was made (step_timings.hpp): compute, input wait,
  // checkpoints; no collective time under one device.
  step_timings timings() const noexcept { return clock_.totals(); }

  // The same as `run` here: there is only the primary.
  template <class F, class... A>
  decltype(auto) run_on_primary(F&& fn, A&&... args) {
    detail::check_run_parameters<std::remove_reference_t<F>, replica_type, std::remove_reference_t<A>...>();
    const detail::step_clock::step_scope timed{clock_};
    [[maybe_unused]] const auto entered = policy::enter(devices_[0]);
    replica_type r{devices_[0], policy::solo(devices_[0]), &engine_};
    return std::invoke(fn, r, detail::unwrap_for(args, 0)...);
  }

 private:
  friend class strategy_base<one_device_strategy<D>, 1>;
  std::array<D, 1>& devices_for_factory() noexcept { return devices_; }

  std::array<D, 1> devices_;
  engine_slot<D> engine_{};
  detail::step_clock clock_{};
};

}  // namespace distribute
