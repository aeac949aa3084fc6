#pragma once
// Where a block of a step runs, as a type (Kokkos-style work tags). A step that mixes mirrored and
// single-device work (a GAN whose generator updates on the primary while its discriminator is
// mirrored) is written as blocks tagged `every_replica` or `primary_only`; `run_block` picks the
// strategy call from the tag, so the same step type-checks against every strategy, and under
// one_device_strategy every block is one direct call.
//
//   auto d_step = dist::make_block(dist::every_replica, [&](dist::replica auto& r, Disc& d) { ... });
//   auto g_step = dist::make_block(dist::primary_only, [&](dist::replica auto& r, Gen& g) { ... });
//   auto losses = dist::run_block(strategy, d_step, disc);  // per_replica<float>
//   float g_loss = dist::run_block(strategy, g_step, gen);  // float
//   dist::resync(strategy, gen);                            // the primary's update, to every copy
//
// Conditional mirroring (mirror only when the batch repays the communication) is a run-time choice
// between an every_replica block over the batch's shares and a primary_only block over the whole
// batch followed by `resync`; with the loss rule (every replica divides by the GLOBAL batch) the sum
// of the returned losses is the step's loss either way.

#include <distribute/concepts/strategy.hpp>
#include <distribute/per_replica.hpp>

#include <concepts>
#include <functional>
#include <type_traits>
#include <utility>

namespace distribute {

// Runs on every replica, concurrently, with each replica's share of per-replica arguments.
struct every_replica_t {
  explicit every_replica_t() = default;
};
inline constexpr every_replica_t every_replica{};

// Runs once, on the primary device, with replica 0's element of per-replica and mirrored arguments;
// collectives inside are no-ops.
struct primary_only_t {
  explicit primary_only_t() = default;
};
inline constexpr primary_only_t primary_only{};

template <class T>
concept placement_tag = std::same_as<T, every_replica_t> || std::same_as<T, primary_only_t>;

template <placement_tag Tag, class F>
struct block {
  using tag_type = Tag;
  F fn;
};

template <placement_tag Tag, class F>
block<Tag, std::decay_t<F>> make_block(Tag, F&& fn) {
  return {std::forward<F>(fn)};
}

namespace detail {
template <class S>
inline constexpr bool single_replica = std::remove_cvref_t<S>::extent == 1;
}  // namespace detail

// every_replica: strategy.run, giving per_replica<R> (or nothing). primary_only: run_on_primary,
// giving R. Under a strategy of one replica (extent 1) both are the direct call they amount to.
template <strategy S, placement_tag Tag, class F, class... A>
decltype(auto) run_block(S& s, block<Tag, F>& b, A&&... args) {
  if constexpr (std::same_as<Tag, every_replica_t>) {
    return s.run(b.fn, std::forward<A>(args)...);
  } else {
    return s.run_on_primary(b.fn, std::forward<A>(args)...);
  }
}
template <strategy S, placement_tag Tag, class F, class... A>
decltype(auto) run_block(S& s, block<Tag, F>&& b, A&&... args) {
  return run_block(s, b, std::forward<A>(args)...);
}

// After a primary_only block changed mirrored state: every copy becomes the primary's. Nothing to do
// with one replica.
template <strategy S, class... M>
void resync(S& s, M&... state) {
  static_assert((is_mirrored_v<M> && ...), "distribute: resync takes mirrored<T> values");
  if constexpr (!detail::single_replica<S>) (s.broadcast(state, 0), ...);
}

}  // namespace distribute
