#pragma once
// The engine interface run on the calling thread alone, over host memory: for arithmetic called
// without a replica (a loss or an optimiser step outside any strategy), where no engine of a
// replica is at hand and starting threads would compete with whoever called.

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace distribute::detail {

// The sum over i in [0, length) of f(s, i), in double and in index order: every engine's
// segmented_sum adds this way, so their results are the same bits.
template <class F>
double index_order_sum(F& f, std::int64_t s, std::int64_t length) {
  double acc = 0;
  for (std::int64_t i = 0; i < length; ++i) acc += static_cast<double>(f(s, i));
  return acc;
}

struct serial_engine {
  template <class F>
  void for_each(std::int64_t n, F f) const {
    for (std::int64_t i = 0; i < n; ++i) f(i);
  }
  template <class F>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out) const {
    for (std::int64_t s = 0; s < segments; ++s) out[s] = index_order_sum(f, s, length);
  }
  template <class T>
  void to_host(const T* src, std::size_t n, T* dst) const {
    std::copy(src, src + n, dst);
  }
};

}  // namespace distribute::detail
