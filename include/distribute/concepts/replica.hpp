#pragma once
// A replica is the context a training step is written against: the same step body runs under every
// strategy, with `r` the replica it runs as.

#include <distribute/concepts/device.hpp>
#include <distribute/per_replica.hpp>
#include <distribute/reduce_op.hpp>

#include <concepts>
#include <span>
#include <vector>

namespace distribute {

template <class R>
concept replica = requires(R& r, const R& cr, std::vector<float>& v, std::span<float> s, std::span<const float> cs,
                           float x, per_replica<int>& pr, mirrored<int>& mr) {
  typename R::device_type;
  requires device<typename R::device_type>;
  { cr.replica_id() } -> std::convertible_to<int>;
  { cr.num_replicas() } -> std::convertible_to<int>;
  { cr.device() } -> std::convertible_to<const typename R::device_type&>;
  { r.local(pr) } -> std::same_as<int&>;
  { r.local(mr) } -> std::same_as<int&>;
  r.all_reduce(reduce_op::sum, v);
  r.all_reduce(reduce_op::mean, s, v);
  { r.all_reduce(reduce_op::max, x) } -> std::same_as<float>;
  r.all_gather(cs, s);
  { r.all_gather(x) } -> std::same_as<std::vector<float>>;
  r.broadcast(s, 0);
  r.barrier();
};

}  // namespace distribute
