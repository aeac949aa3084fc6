#pragma once
// A distributed dataset yields, per step, one batch per replica. What `strategy.distribute` returns
// models it (its batches are data::batch, std::vector or pairs of them, see <distribute/data.hpp>);
// so does any input range of per_replica values, such as a vector of scattered batches.

#include <distribute/per_replica.hpp>

#include <ranges>

namespace distribute {

template <class D>
concept distributed_dataset = std::ranges::input_range<D> && is_per_replica_v<std::ranges::range_value_t<D>>;

// The batch one replica receives per step.
template <distributed_dataset D>
using replica_batch_t = typename std::ranges::range_value_t<D>::value_type;

}  // namespace distribute
