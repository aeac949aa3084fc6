#pragma once
// The element-wise engine run on the calling thread alone, over host memory: for arithmetic called
// without a replica (a loss or an optimiser step outside any strategy), where no engine of a
// replica is at hand and starting threads would compete with whoever called. It models
// `elementwise_engine` (concepts/elementwise_engine.hpp); `fixed_order_sum` is the order of every
// host engine's segmented sums.

#include <distribute/concepts/elementwise_engine.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace distribute {

// The sum over i in [0, length) of f(s, i), in double, in an order fixed by `length` alone: term i
// goes to running sum i mod 32 while whole rows of 32 terms last, the rest (fewer than 32) onto a sum
// of their own in index order; the 32 running sums are then folded pairwise (sum l += sum l + 16,
// then + 8, ..., + 1) and the rest added last. Every engine's segmented_sum on the host adds this
// way, so their results are the same bits whatever the thread count. (One running sum in index
// order is a chain of dependent additions: a quarter of the speed of memory for a plane in cache;
// 32 of them vectorise.)
inline constexpr std::int64_t fixed_order_lanes = 32;
template <class F>
double fixed_order_sum(const F& term, std::int64_t s, std::int64_t length) {
  const F f = term;  // a local copy: its pointers stay in registers across the loop's stores
  double acc[fixed_order_lanes] = {};
  const std::int64_t whole = length - length % fixed_order_lanes;
  for (std::int64_t i = 0; i < whole; i += fixed_order_lanes)
    for (std::int64_t l = 0; l < fixed_order_lanes; ++l) acc[l] += static_cast<double>(f(s, i + l));
  double rest = 0;
  for (std::int64_t i = whole; i < length; ++i) rest += static_cast<double>(f(s, i));
  for (std::int64_t w = fixed_order_lanes / 2; w > 0; w /= 2)
    for (std::int64_t l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0] + rest;
}

struct serial_engine {
  template <class F>
  void for_each(std::int64_t n, F f) const {
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }
  template <class F>
  void for_each_in_segments(std::int64_t segments, std::int64_t length, F f) const {
    for (std::int64_t s = 0; s < segments; ++s)
      for (std::int64_t i = 0; i < length; ++i) f(s, i);
  }
  template <class F>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out) const {
    segmented_sum(segments, length, f, out, [](std::int64_t, double sum) { return sum; });
  }
  template <class F, class Finish>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out, Finish finish) const {
    for (std::int64_t s = 0; s < segments; ++s) out[s] = finish(s, fixed_order_sum(f, s, length));
  }
  template <class T>
  void to_host(const T* src, std::size_t n, T* dst) const {
    std::copy(src, src + n, dst);
  }
};

static_assert(elementwise_engine<serial_engine>);

}  // namespace distribute
