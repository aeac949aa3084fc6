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
// The fold of the running sums, the same for every sum above and below: add(l, l + w) for w = 16, 8,
// ..., 1 and l < w, in that order (add(l, m): running sum l += running sum m).
template <class Add>
void fold_fixed_order_lanes(Add&& add) {
  for (std::int64_t w = fixed_order_lanes / 2; w > 0; w /= 2)
    for (std::int64_t l = 0; l < w; ++l) add(l, l + w);
}
template <class F>
double fixed_order_sum(const F& term, std::int64_t s, std::int64_t length) {
  const F f = term;  // a local copy: its pointers stay in registers across the loop's stores
  double acc[fixed_order_lanes] = {};
  const std::int64_t whole = length - length % fixed_order_lanes;
  for (std::int64_t i = 0; i < whole; i += fixed_order_lanes)
    for (std::int64_t l = 0; l < fixed_order_lanes; ++l) acc[l] += static_cast<double>(f(s, i + l));
  double rest = 0;
  for (std::int64_t i = whole; i < length; ++i) rest += static_cast<double>(f(s, i));
  fold_fixed_order_lanes([&](std::int64_t l, std::int64_t m) { acc[l] += acc[m]; });
  return acc[0] + rest;
}

// fixed_order_sum for terms that come in runs: `term.run(s, i)` gives {p, step, count} such that the
// terms i, i + 1, ..., i + count - 1 of segment s (count >= 1; past the segment's end ignored) are
// p[0], p[step], p[2 * step], ... The same additions in the same order as fixed_order_sum (lane i mod
// 32 while whole rows last, the rest in index order, the same fold), so the same bits; the term's
// walk (its divisions) is evaluated once per run instead of once per term.
template <class F>
double fixed_order_sum_by_runs(const F& term, std::int64_t s, std::int64_t length) {
  constexpr std::int64_t lanes = fixed_order_lanes;
  const F f = term;
  double acc[lanes] = {};
  const std::int64_t whole = length - length % lanes;
  double rest = 0;
  for (std::int64_t i = 0; i < length;) {
    const auto r = f.run(s, i);
    const std::int64_t end = std::min(length, i + r.count), rows_end = std::min(end, whole);
    const auto* p = r.p;  // term k of the segment at p[(k - i) * step]
    const std::int64_t step = r.step;
    std::int64_t k = i;
    for (; k < rows_end && k % lanes != 0; ++k) acc[k % lanes] += static_cast<double>(p[(k - i) * step]);
    if (step == 1) {
      for (; k + lanes <= rows_end; k += lanes) {
        const auto* row = p + (k - i);
        for (std::int64_t l = 0; l < lanes; ++l) acc[l] += static_cast<double>(row[l]);
      }
    } else {
      for (; k + lanes <= rows_end; k += lanes) {
        const auto* row = p + (k - i) * step;
        for (std::int64_t l = 0; l < lanes; ++l) acc[l] += static_cast<double>(row[l * step]);
      }
    }
    for (; k < rows_end; ++k) acc[k % lanes] += static_cast<double>(p[(k - i) * step]);
    for (; k < end; ++k) rest += static_cast<double>(p[(k - i) * step]);
    i = end;
  }
  fold_fixed_order_lanes([&](std::int64_t l, std::int64_t m) { acc[l] += acc[m]; });
  return acc[0] + rest;
}

// fixed_order_sum of the `count` (at most fixed_order_block) segments s0, s0 + 1, ... side by side,
// for terms whose next segment's term lies next to this one's (`term.segment_step() == 1`, as in a sum
// over an outer axis: the batch's): each segment's terms are added in fixed_order_sum's order, so
// the same bits, and each row of terms is read once for all of them, in loops that vectorise across
// the segments. out[s0 + b] = finish(s0 + b, the sum).
inline constexpr std::int64_t fixed_order_block = 32;
template <class F, class Finish>
void fixed_order_sums_across(const F& term, std::int64_t s0, std::int64_t count, std::int64_t length, double* out,
                             Finish&& finish) {
  constexpr std::int64_t lanes = fixed_order_lanes, block = fixed_order_block;
  const F f = term;
  double rest[block] = {};
  const std::int64_t whole = length - length % lanes;
  if (whole == 0) {  // every term is in the rest; the running sums stay 0 (a sum over a small batch)
    for (std::int64_t i = 0; i < length; ++i) {
      const auto* p = f.run(s0, i).p;
      for (std::int64_t b = 0; b < count; ++b) rest[b] += static_cast<double>(p[b]);
    }
    for (std::int64_t b = 0; b < count; ++b) out[s0 + b] = finish(s0 + b, 0.0 + rest[b]);
    return;
  }
  double acc[lanes][block] = {};
  for (std::int64_t i = 0; i < whole; ++i) {
    const auto* p = f.run(s0, i).p;
    double* a = acc[i % lanes];
    for (std::int64_t b = 0; b < count; ++b) a[b] += static_cast<double>(p[b]);
  }
  for (std::int64_t i = whole; i < length; ++i) {
    const auto* p = f.run(s0, i).p;
    for (std::int64_t b = 0; b < count; ++b) rest[b] += static_cast<double>(p[b]);
  }
  fold_fixed_order_lanes([&](std::int64_t l, std::int64_t m) {
    for (std::int64_t b = 0; b < count; ++b) acc[l][b] += acc[m][b];
  });
  for (std::int64_t b = 0; b < count; ++b) out[s0 + b] = finish(s0 + b, acc[0][b] + rest[b]);
}

// A functor of for_each that also computes a block of its calls at once: run_block(i, count) gives
// the values of f(i) to f(i + count - 1), count <= F::block_size (nn/detail/op_kernels.hpp's
// functions through vector code). The host engines call it a block at a time, blocks at multiples
// of block_size whatever the thread count.
template <class F>
concept block_functor = requires(const F& f) {
  f.run_block(std::int64_t{}, std::int64_t{});
  F::block_size;
};

struct serial_engine {
  template <class F>
  void for_each(std::int64_t n, F f) const {
    if constexpr (block_functor<F>) {
      for (std::int64_t i = 0; i < n; i += F::block_size) f.run_block(i, std::min<std::int64_t>(F::block_size, n - i));
    } else {
      for (std::int64_t i = 0; i < n; ++i) f(i);
    }
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
