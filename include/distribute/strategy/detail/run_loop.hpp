#pragma once
// The step loop every multi-replica strategy shares: run `fn` on each replica's thread with the
// replica's own elements of per-replica and mirrored arguments, report each replica's end to the
// group (it departed, or it failed: which makes the others' collectives fail at once), collect the
// results in replica order, and rethrow the first failure once every replica has left the step.
//
// What differs between devices is in the hooks (a device policy): what a replica's thread does
// before the step (make its GPU current), after the function returned (wait for its stream), after
// a failure (drain or abort its queued work), and what the strategy does when a step failed (a
// multi-worker strategy tells the other workers).

#include <distribute/collective_origin.hpp>
#include <distribute/per_replica.hpp>
#include <distribute/strategy/detail/replica_pool.hpp>
#include <distribute/strategy/detail/run_call_check.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::detail {

// Held for the length of a step: a step of a strategy cannot start inside another (its replica
// threads are busy with it), from inside a replica or from two threads at once.
class exclusive_step {
 public:
  exclusive_step(std::atomic<bool>& in_step, const char* strategy) : in_step_{in_step} {
    if (in_step_.exchange(true))
      throw std::logic_error(std::string("distribute: ") + strategy +
                             "::run called while a step of the same strategy is "
                             "running (from inside a replica, or from two threads at once)");
  }
  ~exclusive_step() { in_step_.store(false); }
  exclusive_step(const exclusive_step&) = delete;
  exclusive_step& operator=(const exclusive_step&) = delete;

 private:
  std::atomic<bool>& in_step_;
};

// A per-replica or mirrored argument of `run` must hold one element per replica of the strategy.
template <class A>
void check_run_argument(const A& a, std::size_t replicas) {
  if constexpr (replica_indexed<A>) {
    if (a.size() != replicas)
      throw std::invalid_argument("distribute: run got a per-replica argument for " + std::to_string(a.size()) +
                                  " replicas; this strategy has " + std::to_string(replicas));
  }
}

// The hooks of a device that needs none (CPU replicas).
struct no_replica_hooks {
  struct entered {};
  entered enter(int) const noexcept { return {}; }
  void finish(int) const noexcept {}
  void after_failure(int) const noexcept {}
  void step_failed(const std::exception_ptr&) const noexcept {}
};

// The group's side: `depart(rank)`, `fail(rank, exception_ptr)`, `first_failure()` (every
// communicator group of this library has them). `Hooks`:
//   enter(rank)          on the replica's thread before `fn`; its result lives until `fn` and finish end
//   finish(rank)         after `fn` returned; may throw (the replica then fails)
//   after_failure(rank)  after the replica failed (noexcept)
//   step_failed(e)       on the calling thread when the step failed, before `e` is rethrown
template <class Replica, class Group, class Hooks, class F, class... A>
  requires run_callable<F, Replica, A...>
auto run_replicas(replica_pool& pool, std::vector<Replica>& replicas, Group& group, std::int64_t step, Hooks& hooks,
                  F& fn, A&... args) {
  check_run_parameters<F, Replica, A...>();
  using R = std::invoke_result_t<F&, Replica&, decltype(unwrap_for(args, 0))...>;
  using stored = std::decay_t<std::conditional_t<std::is_void_v<R>, int, R>>;
  const auto n = replicas.size();
  std::vector<std::optional<stored>> results(std::is_void_v<R> ? 0 : n);
  auto job = [&](int rank) noexcept {
    const auto r = static_cast<std::size_t>(rank);
    const step_scope in_step(step, true);
    try {
      [[maybe_unused]] const auto entered = hooks.enter(rank);
      if constexpr (std::is_void_v<R>) {
        std::invoke(fn, replicas[r], unwrap_for(args, r)...);
      } else {
        results[r].emplace(std::invoke(fn, replicas[r], unwrap_for(args, r)...));
      }
      hooks.finish(rank);
      group.depart(rank);
    } catch (...) {
      group.fail(rank, std::current_exception());
      hooks.after_failure(rank);
    }
  };
  pool.run(job);
  if (auto failure = group.first_failure()) {
    hooks.step_failed(failure);
    std::rethrow_exception(failure);
  }
  if constexpr (!std::is_void_v<R>) {
    std::vector<std::decay_t<R>> values;
    values.reserve(n);
    for (auto& v : results) values.push_back(std::move(*v));
    return per_replica<std::decay_t<R>>(std::move(values));
  }
}

// The step of a strategy of one replica (one device, CPU or GPU): `fn(replica, args...)` on the
// calling thread, with the only element of per-replica and mirrored arguments; its result as
// per_replica<R, 1>, held in place (nothing for a void fn).
template <class Replica, class F, class... A>
  requires run_callable<F, Replica, A...>
auto run_one(Replica& replica, F& fn, A&... args) {
  check_run_parameters<F, Replica, A...>();
  using R = std::invoke_result_t<F&, Replica&, decltype(unwrap_for(args, 0))...>;
  if constexpr (std::is_void_v<R>) {
    std::invoke(fn, replica, unwrap_for(args, 0)...);
  } else {
    return per_replica<std::decay_t<R>, 1>(
        std::array<std::decay_t<R>, 1>{std::invoke(fn, replica, unwrap_for(args, 0)...)});
  }
}

// fn that cannot be called with the replica and the arguments: one error naming the positions.
template <class Replica, class Group, class Hooks, class F, class... A>
void run_replicas(replica_pool&, std::vector<Replica>&, Group&, std::int64_t, Hooks&, F&, A&...) {
  report_run_call<F, Replica, A...>();
}
template <class Replica, class F, class... A>
void run_one(Replica&, F&, A&...) {
  report_run_call<F, Replica, A...>();
}

}  // namespace distribute::detail
