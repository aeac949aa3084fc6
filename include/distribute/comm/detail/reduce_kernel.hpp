#pragma once
// The element loop of every in-process reduction. Contributions are combined in rank order 0, 1, ...,
// n-1 for every element, whoever computes it, so results are bit-identical from run to run and on
// every replica. The work goes through a small stack buffer that stays in L1: each source is read
// once and each destination written once, which is what makes the all-reduce memory-bound rather
// than compute- or cache-bound.

#include <distribute/comm/detail/copy_bytes.hpp>
#include <distribute/reduce_op.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>

namespace distribute::comm::detail {

template <class T, reduce_op Op>
void reduce_chunks(const void* const* srcs, int n_src, std::size_t begin, std::size_t end, void* const* dsts,
                   int n_dst) noexcept {
  constexpr std::size_t chunk = 8192 / sizeof(T) > 0 ? 8192 / sizeof(T) : 1;
  alignas(64) T tmp[chunk];
  for (std::size_t c = begin; c < end; c += chunk) {
    const std::size_t m = std::min(chunk, end - c);
    const T* s0 = static_cast<const T*>(srcs[0]) + c;
    if (n_src == 1) {
      copy_bytes(tmp, s0, m * sizeof(T));
    } else {
      const T* s1 = static_cast<const T*>(srcs[1]) + c;
      for (std::size_t j = 0; j < m; ++j) tmp[j] = distribute::detail::combine(Op, s0[j], s1[j]);
      for (int r = 2; r < n_src; ++r) {
        const T* s = static_cast<const T*>(srcs[r]) + c;
        for (std::size_t j = 0; j < m; ++j) tmp[j] = distribute::detail::combine(Op, tmp[j], s[j]);
      }
    }
    if constexpr (Op == reduce_op::mean) {
      const T n = static_cast<T>(n_src);
      for (std::size_t j = 0; j < m; ++j) tmp[j] = static_cast<T>(tmp[j] / n);
    }
    for (int d = 0; d < n_dst; ++d) copy_bytes(static_cast<T*>(dsts[d]) + c, tmp, m * sizeof(T));
  }
}

// Reduces sources [begin, end) into every destination, with the op fixed at compile time so that the
// inner loops vectorise.
template <class T>
void reduce_range(reduce_op op, const void* const* srcs, int n_src, std::size_t begin, std::size_t end,
                  void* const* dsts, int n_dst) noexcept {
  if (begin >= end) return;
  switch (op) {
    case reduce_op::sum: return reduce_chunks<T, reduce_op::sum>(srcs, n_src, begin, end, dsts, n_dst);
    case reduce_op::mean: return reduce_chunks<T, reduce_op::mean>(srcs, n_src, begin, end, dsts, n_dst);
    case reduce_op::min: return reduce_chunks<T, reduce_op::min>(srcs, n_src, begin, end, dsts, n_dst);
    case reduce_op::max: return reduce_chunks<T, reduce_op::max>(srcs, n_src, begin, end, dsts, n_dst);
    case reduce_op::prod: return reduce_chunks<T, reduce_op::prod>(srcs, n_src, begin, end, dsts, n_dst);
  }
}

}  // namespace distribute::comm::detail
