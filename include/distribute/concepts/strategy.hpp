#pragma once
// A strategy decides where a step runs. User code is written against this concept, so that changing
// the strategy type is the only change needed to move from one device to many.

#include <distribute/concepts/device.hpp>
#include <distribute/concepts/replica.hpp>
#include <distribute/reduce_op.hpp>

#include <concepts>
#include <cstddef>
#include <utility>
#include <vector>

namespace distribute {

namespace detail {
// Stand-ins for user code, used only to check the concept.
struct probe_step {
  template <class R>
  float operator()(R& r) const {
    return static_cast<float>(r.replica_id());
  }
};
struct probe_value {
  int operator()(int replica_id) const { return replica_id; }
};
struct probe_factory {
  template <class D>
  int operator()(D&) const {
    return 0;
  }
};
}  // namespace detail

template <class S>
concept strategy = requires(S& s, const S& cs, typename S::template mirrored_type<int>& m) {
  typename S::device_type;
  typename S::replica_type;
  typename S::template per_replica_type<int>;
  requires device<typename S::device_type>;
  requires replica<typename S::replica_type>;
  { cs.num_replicas_in_sync() } -> std::convertible_to<int>;
  { cs.num_local_replicas() } -> std::convertible_to<int>;
  { cs.worker_index() } -> std::convertible_to<int>;
  { cs.num_workers() } -> std::convertible_to<int>;
  { cs.is_chief() } -> std::convertible_to<bool>;
  { cs.first_replica_id() } -> std::convertible_to<int>;
  cs.devices();
  s.run(detail::probe_step{});
  { cs.reduce(reduce_op::sum, s.run(detail::probe_step{})) } -> std::same_as<float>;
  cs.gather(s.run(detail::probe_step{}));
  cs.local_results(s.run(detail::probe_step{}));
  s.run_on_primary(detail::probe_step{});
  { s.mirror(detail::probe_factory{}) } -> std::same_as<typename S::template mirrored_type<int>>;
  cs.broadcast(m, 0);
  cs.verify_mirrored(m);
  cs.scatter(std::declval<const std::vector<float>&>(), std::size_t{1});
  { cs.values_from_function(detail::probe_value{}) } -> std::same_as<typename S::template per_replica_type<int>>;
};

}  // namespace distribute
