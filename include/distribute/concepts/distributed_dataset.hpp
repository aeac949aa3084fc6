#pragma once
// A distributed dataset yields, per step, one batch per replica. The input pipeline refines what a
// batch is; here it is anything held in a per_replica.

#include <distribute/per_replica.hpp>

#include <ranges>

namespace distribute {

template <class D>
concept distributed_dataset = std::ranges::input_range<D> && is_per_replica_v<std::ranges::range_value_t<D>>;

}  // namespace distribute
