#pragma once
// Helpers shared by the core tests: element types, deterministic test values, and the serial
// reference that every parallel result is compared against bit for bit.

#include <distribute/distribute.hpp>

#include <boost/mpl/list.hpp>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace distribute::test {

using element_types = boost::mpl::list<float, double, std::int32_t, std::int64_t>;

inline constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::mean, reduce_op::min, reduce_op::max,
                                        reduce_op::prod};

// Values for replica `rank`, seeded so that every run sees the same data. Products stay small (for
// integers) and near one (for floats) so that no op overflows; floats are irregular so that a change
// of summation order would change the bits.
template <class T>
std::vector<T> values_for(int rank, std::size_t n, reduce_op op, std::uint32_t seed = 7) {
  std::mt19937 gen(seed * 7919u + static_cast<std::uint32_t>(rank) * 104729u + static_cast<std::uint32_t>(n));
  std::vector<T> v(n);
  for (auto& x : v) {
    if constexpr (std::is_floating_point_v<T>) {
      std::uniform_real_distribution<T> d(op == reduce_op::prod ? T(0.5) : T(-100),
                                          op == reduce_op::prod ? T(1.5) : T(100));
      x = d(gen);
    } else {
      std::uniform_int_distribution<int> d(op == reduce_op::prod ? -2 : -1000, op == reduce_op::prod ? 2 : 1000);
      x = static_cast<T>(d(gen));
    }
  }
  return v;
}

// The reduction done serially, in rank order: what every replica must hold after an all-reduce.
template <class T>
std::vector<T> serial_reduce(reduce_op op, const std::vector<std::vector<T>>& inputs) {
  // The documented grouping: inputs [lo, hi) split at the largest power of two below their count.
  const auto tree = [&](auto&& self, std::size_t lo, std::size_t hi) -> std::vector<T> {
    if (hi - lo == 1) return inputs.at(lo);
    std::size_t half = 1;
    while (half * 2 < hi - lo) half *= 2;
    std::vector<T> left = self(self, lo, lo + half);
    const std::vector<T> right = self(self, lo + half, hi);
    for (std::size_t i = 0; i < left.size(); ++i) left[i] = detail::combine(op, left[i], right[i]);
    return left;
  };
  std::vector<T> acc = tree(tree, 0, inputs.size());
  for (auto& x : acc) x = detail::finish(op, x, static_cast<int>(inputs.size()));
  return acc;
}

template <class T>
bool bit_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace distribute::test
