#pragma once
// The reduction operators shared by every collective engine, and the element-wise math behind them.

#include <distribute/config.hpp>

#include <cstdint>
#include <ostream>
#include <string_view>

namespace distribute {

enum class reduce_op : std::uint8_t { sum, mean, min, max, prod };

constexpr std::string_view to_string(reduce_op op) noexcept {
  switch (op) {
    case reduce_op::sum: return "sum";
    case reduce_op::mean: return "mean";
    case reduce_op::min: return "min";
    case reduce_op::max: return "max";
    case reduce_op::prod: return "prod";
  }
  return "unknown";
}

inline std::ostream& operator<<(std::ostream& os, reduce_op v) { return os << to_string(v); }

namespace detail {

// Combines two partial results. `mean` combines like `sum`; the division by the replica count is a
// separate final step so that it happens exactly once, on the complete sum.
template <class T>
DISTRIBUTE_HOST_DEVICE constexpr T combine(reduce_op op, T a, T b) noexcept {
  switch (op) {
    case reduce_op::sum:
    case reduce_op::mean: return a + b;
    case reduce_op::min: return b < a ? b : a;
    case reduce_op::max: return a < b ? b : a;
    case reduce_op::prod: return a * b;
  }
  return a;
}

// The final step of a mean over `n` contributions. Integers divide with truncation toward zero.
template <class T>
DISTRIBUTE_HOST_DEVICE constexpr T finish(reduce_op op, T v, int n) noexcept {
  return op == reduce_op::mean ? static_cast<T>(v / static_cast<T>(n)) : v;
}

}  // namespace detail
}  // namespace distribute
