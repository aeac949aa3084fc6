#pragma once
// What the multi-worker strategies (CPU replicas joined by MPI, GPUs joined by NCCL) do alike: their
// per-replica values hold this worker's replicas only, numbered across the job from
// `first_replica_id()`. A strategy provides `num_local_replicas()`, `num_replicas_in_sync()` and
// `first_replica_id()`; how values cross workers stays its own.

#include <distribute/errors.hpp>
#include <distribute/per_replica.hpp>
#include <distribute/strategy/detail/strategy_base.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace distribute::detail {

template <class Derived>
class multi_worker_base {
 public:
  // This worker's replicas' values, in replica order.
  template <class T, std::size_t E>
  std::span<const T, E> local_results(const per_replica<T, E>& values) const {
    check_count(values.size(), "local_results");
    return values.values();
  }

  // Splits a GLOBAL batch (the same on every worker) along its first axis into one share per replica
  // of the job, as evenly as possible, and returns this worker's replicas' shares.
  template <class T>
  per_replica<std::vector<T>> scatter(std::span<const T> batch, std::size_t example_size = 1) const {
    return batch_shares<per_replica<std::vector<T>>>(
        batch, example_size, static_cast<std::size_t>(self().num_replicas_in_sync()),
        static_cast<std::size_t>(self().first_replica_id()), static_cast<std::size_t>(self().num_local_replicas()));
  }
  template <std::ranges::contiguous_range B>
    requires std::ranges::sized_range<B>
  auto scatter(const B& batch, std::size_t example_size = 1) const {
    using T = std::remove_cv_t<std::ranges::range_value_t<B>>;
    return scatter(std::span<const T>(std::ranges::data(batch), std::ranges::size(batch)), example_size);
  }

  // One value per local replica from `fn(replica_id)`, with replica ids across the job.
  template <class F>
    requires std::invocable<F&, int>
  auto values_from_function(F&& fn) const {
    using T = std::decay_t<std::invoke_result_t<F&, int>>;
    return make<per_replica<T>>(
        [&](std::size_t r) { return std::invoke(fn, self().first_replica_id() + static_cast<int>(r)); });
  }

 protected:
  // Builds a replica-indexed value for this worker's replicas from `make_one(local index)`.
  template <class V, class F>
  V make(F&& make_one) const {
    return make_replica_values<V>(static_cast<std::size_t>(self().num_local_replicas()), make_one);
  }

  void check_count(std::size_t n, const char* op) const {
    const auto expected = static_cast<std::size_t>(self().num_local_replicas());
    if (n != expected)
      throw std::invalid_argument(std::string("distribute: ") + op + " got a value for " + std::to_string(n) +
                                  " replicas; this worker has " + std::to_string(expected) +
                                  " (per-replica values hold a worker's own replicas)");
  }

  template <class A>
  void check_argument(const A& a) const {
    if constexpr (replica_indexed<A>) check_count(a.size(), "run");
  }

  // This worker's part of a `gather`: its replicas' values (sequences concatenated), in replica order.
  template <class V, std::size_t E>
  auto local_elements(const per_replica<V, E>& values, int axis) const {
    check_count(values.size(), "gather");
    if (axis != 0)
      throw std::invalid_argument("distribute: gather of flat sequences concatenates along axis 0, got axis " +
                                  std::to_string(axis));
    if constexpr (arithmetic<V>) {
      return std::vector<V>(values.begin(), values.end());
    } else {
      std::vector<std::ranges::range_value_t<V>> mine;
      for (const auto& v : values) mine.insert(mine.end(), std::ranges::begin(v), std::ranges::end(v));
      return mine;
    }
  }

  // `broadcast(value, from)` of a mirrored value with `copies` local copies.
  void check_broadcast(std::size_t copies, int from) const {
    check_count(copies, "broadcast");
    if (from < 0 || from >= self().num_replicas_in_sync())
      throw std::invalid_argument("distribute: broadcast from replica " + std::to_string(from) + " of " +
                                  std::to_string(self().num_replicas_in_sync()));
  }

  // `verify_mirrored`'s verdict on the digests of every replica of the job, in replica order.
  static void check_digests(const std::vector<std::uint64_t>& all) {
    std::string differ;
    for (std::size_t r = 1; r < all.size(); ++r)
      if (all[r] != all[0]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    if (!differ.empty())
      throw mirrored_divergence("distribute: mirrored copies differ from replica 0's on replica(s) " + differ);
  }

  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
};

}  // namespace distribute::detail
