#pragma once
// N replicas in one process, each on its own persistent thread (replica 0, the primary, on the
// thread that calls `run`), joined by a communicator group.
//
//   mirrored_strategy<> s;                                      one CPU replica per hardware thread
//   mirrored_strategy<> s{cpu_replicas(4)};                     4 CPU replicas
//   mirrored_strategy<cuda> s;                                  every visible GPU (cuda/strategy/mirrored_strategy.cuh)
//   mirrored_strategy<cuda> s{cuda_replicas(4)};                4 logical replicas sharing cuda:0
//
// One template for every device: the device policy (strategy/detail/device_policy.hpp) sets up the
// replicas' devices and their group (shared memory between CPU threads; NCCL or cuda_peer between
// GPUs, each replica with a stream of its own) and says what a replica's thread does around a step.
//
// Failure semantics: when a replica throws, the collectives that other replicas are waiting in (or
// enter later in the step) fail at once with `collective_aborted`; `run` waits for every replica to
// leave the step and rethrows the first failure. A collective that a replica never joins fails after
// the configured timeout with `collective_timeout` (at once if that replica already finished the
// step); replicas that disagree on a collective get `collective_mismatch`. The next `run` starts
// clean. On a GPU, `run` returns once every replica's stream has finished the work the step queued
// on it, so results read after `run` are complete.

#include <distribute/collective_options.hpp>
#include <distribute/comm/local.hpp>
#include <distribute/comm/shared_memory.hpp>
#include <distribute/concepts/device.hpp>
#include <distribute/concepts/device_policy.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/strategy/detail/device_policy.hpp>
#include <distribute/engine/engine_slot.hpp>
#include <distribute/per_replica.hpp>
#include <distribute/replica_context.hpp>
#include <distribute/strategy/detail/replica_pool.hpp>
#include <distribute/strategy/detail/run_loop.hpp>
#include <distribute/step_timings.hpp>
#include <distribute/strategy/detail/step_clock.hpp>
#include <distribute/strategy/detail/strategy_base.hpp>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute {

template <device D = cpu>
class mirrored_strategy : public strategy_base<mirrored_strategy<D>, std::dynamic_extent> {
  static_assert(device_policy<detail::device_policy<D>>,
                "distribute: mirrored_strategy<D> needs the device policy of D, from the strategy header of D's "
                "backend: for cuda, #include <distribute/cuda/strategy/mirrored_strategy.cuh>");
  using policy = detail::device_policy<D>;
  using group_type = typename policy::replica_group;

 public:
  using device_type = D;
  using replica_type = replica_context<D, typename group_type::communicator>;
  // The context of `run_on_primary`: the primary device, a group of one.
  using primary_replica_type = replica_context<D, typename policy::solo_communicator>;
  // What a user may choose of the replicas' communicators (cuda_collective_engine on GPUs; nothing on
  // the CPU).
  using collective_engine_choice = typename group_type::collective_engine_choice;

  // One replica per hardware thread (CPU), per visible GPU (cuda).
  mirrored_strategy() : mirrored_strategy(group_type::all_devices()) {}
  explicit mirrored_strategy(std::vector<D> devices, collective_options options = {},
                             collective_engine_choice engine = {})
      : state_{std::make_unique<state>(check_devices(std::move(devices)), options, engine)} {}

  int num_replicas_in_sync() const noexcept { return static_cast<int>(state_->replicas.size()); }
  // The replicas' devices (a GPU bound to its replica's stream).
  std::span<const D> devices() const noexcept { return state_->group.devices(); }
  // The engine the strategy chose for the replicas' collectives (never `automatic`).
  collective_engine_choice collective_engine() const noexcept
    requires(!std::is_same_v<collective_engine_choice, detail::no_collective_engine_choice>)
  {
    return state_->group.collective_engine();
  }
  [[deprecated("distribute: mirrored_strategy::engine() is now collective_engine()")]]
  collective_engine_choice engine() const noexcept
    requires(!std::is_same_v<collective_engine_choice, detail::no_collective_engine_choice>)
  {
    return collective_engine();
  }

  const collective_options& options() const noexcept { return state_->group.meeting().options(); }
  // Between steps only.
  void set_options(collective_options options) { state_->group.meeting().set_options(options); }

  // How the replicas' compute engines work (engine/compute_options.hpp). By default each replica's
  // engine uses its share of the cores (cores / replicas, at least one). Between steps only: the
  // engines are made anew, with empty caches.
  void set_compute_options(const compute_options& options) { state_->set_compute_options(options); }
  [[deprecated("distribute: set_engine_options is now set_compute_options")]]
  void set_engine_options(const compute_options& options) {
    set_compute_options(options);
  }

  // Calls `fn(replica, args...)` on every replica concurrently; per-replica and mirrored arguments
  // are unwrapped to the replica's own element, anything else is shared by reference. Returns
  // per_replica<R> (or nothing for a void fn) once every replica has finished.
  template <class F, class... A>
  auto run(F&& fn, A&&... args) {
    state& st = *state_;
    const detail::exclusive_step exclusive(st.in_step, group_type::strategy_name);
    const detail::step_clock::step_scope timed{st.clock};
    (detail::check_run_argument(args, st.replicas.size()), ...);
    st.group.prepare_step();
    auto hooks = st.group.hooks();
    return detail::run_replicas(st.pool, st.replicas, st.group.meeting(), st.steps++, hooks, fn, args...);
  }

  // Where the time went since this strategy was made (step_timings.hpp): compute and collective time
  // (averaged over the replicas), input wait, checkpoints. Between steps.
  step_timings timings() const noexcept { return state_->clock.totals(); }

  // Calls `fn(primary, args...)` once, on the calling thread, as a group of one on the primary
  // device: per-replica and mirrored arguments are unwrapped to replica 0's element, collectives are
  // no-ops. For the parts of a step that run on the primary only; `broadcast` afterwards brings
  // mirrored state that it changed back into sync.
  template <class F, class... A>
  decltype(auto) run_on_primary(F&& fn, A&&... args) {
    detail::check_run_parameters<std::remove_reference_t<F>, primary_replica_type, std::remove_reference_t<A>...>();
    const detail::step_clock::step_scope timed{state_->clock};
    const D& device = state_->group.devices()[0];
    [[maybe_unused]] const auto entered = policy::enter(device);
    primary_replica_type r{device, policy::solo(device), &state_->primary_engine};
    return std::invoke(fn, r, detail::unwrap_for(args, 0)...);
  }

 private:
  friend class strategy_base<mirrored_strategy<D>, std::dynamic_extent>;

  struct state {
    state(std::vector<D> devices, collective_options options, collective_engine_choice engine)
        : group(std::move(devices), options, engine),
          engines(group.devices().size()),
          clock(group.devices().size()),
          pool(static_cast<int>(group.devices().size())) {
      set_compute_options({});
      const auto& devs = group.devices();
      replicas.reserve(devs.size());
      for (std::size_t r = 0; r < devs.size(); ++r)
        replicas.emplace_back(devs[r], group.endpoint(static_cast<int>(r)), &engines[r], clock.meter(r));
    }
    // Each replica's engine gets its share of the cores; the primary alone (run_on_primary) all of them.
    void set_compute_options(const compute_options& o) {
      const int share = core_share(static_cast<int>(engines.size()));
      for (auto& e : engines) e.reset(o, share);
      primary_engine.reset(o, 0);
    }
    group_type group;                     // the replicas' devices and their communicator group
    std::vector<engine_slot<D>> engines;  // one per replica; never resized (replicas point in)
    engine_slot<D> primary_engine;
    detail::step_clock clock;  // one collective meter per replica (replicas point in)
    std::vector<replica_type> replicas;
    std::atomic<bool> in_step{false};
    std::int64_t steps = 0;     // `run` calls started: collectives name their step (collective_origin.hpp)
    detail::replica_pool pool;  // last: its threads stop before the rest is destroyed
  };

  static std::vector<D> check_devices(std::vector<D> devices) {
    if (devices.empty())
      throw std::invalid_argument(std::string("distribute: ") + group_type::strategy_name +
                                  " needs at least one device");
    for (auto& d : devices) d = policy::checked(std::move(d), group_type::strategy_name);
    return devices;
  }

  std::vector<D>& devices_for_factory() noexcept { return state_->group.devices(); }

  std::unique_ptr<state> state_;
};

}  // namespace distribute
