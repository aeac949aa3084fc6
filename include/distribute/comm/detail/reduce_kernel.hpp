#pragma once
// The element loop of every in-process reduction. Contributions are combined in one fixed grouping,
// the balanced tree over rank order: sources 0..n-1 split at the largest power of two below n, each
// side combined the same way ((0 + 1) + (2 + 3) for four, ((0 + 1) + (2 + 3)) + 4 for five), for every
// element, whoever computes it, so results are bit-identical from run to run and on every replica.
// The grouping nests: W groups of 2^k consecutive sources combined per group and then across the
// groups give the same bits as all W x 2^k at once, which is what lets W workers of 2^k replicas
// each (comm/hierarchical.hpp) compute exactly what one process of W x 2^k replicas computes. The work
// goes through small stack buffers that stay in L1: each source is read once and each destination
// written once, which is what makes the all-reduce memory-bound rather than compute- or cache-bound.

#include <distribute/comm/detail/copy_bytes.hpp>
#include <distribute/reduce_op.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace distribute::comm::detail {

template <class T, reduce_op Op>
void combine_into(T* out, const T* a, const T* b, std::size_t m) noexcept {
  for (std::size_t j = 0; j < m; ++j) out[j] = distribute::detail::combine(Op, a[j], b[j]);
}

// The tree of `n` sources (`src(r)`: source r's `m` elements of this chunk) into levels[0], or
// source 0 itself when n is 1; returns where the result is. A binary counter: sources are paired in
// order (0 + 1, 2 + 3, ...), equal-sized partial results merged as soon as they meet (the stack holds
// at most one of each power of two), and what remains folded from the smallest up, which is the split
// at the largest power of two below n, recursively. Uses at most bit_width(n) of the level buffers.
template <class T, reduce_op Op, std::size_t Chunk, class Src>
const T* tree_of(Src&& src, int n, std::size_t m, T (*levels)[Chunk]) noexcept {
  if (n == 1) return src(0);
  const T* part[64];
  std::uint64_t size[64];
  int depth = 0;
  for (int r = 0; r + 1 < n; r += 2) {
    combine_into<T, Op>(levels[depth], src(r), src(r + 1), m);
    part[depth] = levels[depth];
    size[depth++] = 2;
    while (depth >= 2 && size[depth - 1] == size[depth - 2]) {
      combine_into<T, Op>(levels[depth - 2], part[depth - 2], part[depth - 1], m);
      part[depth - 2] = levels[depth - 2];
      size[depth - 2] *= 2;
      --depth;
    }
  }
  if (n % 2 == 1) {
    part[depth] = src(n - 1);
    size[depth++] = 1;
  }
  for (int i = depth - 2; i >= 0; --i) {
    combine_into<T, Op>(levels[i], part[i], part[i + 1], m);
    part[i] = levels[i];
  }
  return part[0];
}

// Level buffers of 2 KiB for trees: enough for 2^12 sources, and for a tree of up to 2^12 whose one
// source is itself a tree of up to 2^12 (reduce_nested_range).
inline constexpr int tree_levels = 24;
template <class T>
inline constexpr std::size_t tree_chunk_elements = 2048 / sizeof(T) > 0 ? 2048 / sizeof(T) : 1;

template <class T, reduce_op Op>
void reduce_chunks(const void* const* srcs, int n_src, std::size_t begin, std::size_t end, void* const* dsts,
                   int n_dst) noexcept {
  // One or two sources go through one 8 KiB buffer; a tree of more through at most log2(n) buffers
  // of 2 KiB in use at once.
  constexpr std::size_t pair_chunk = 8192 / sizeof(T) > 0 ? 8192 / sizeof(T) : 1;
  constexpr std::size_t tree_chunk = tree_chunk_elements<T>;
  alignas(64) T pair[pair_chunk];
  alignas(64) T levels[tree_levels / 2][tree_chunk];
  T* const tmp = n_src <= 2 ? pair : levels[0];
  const std::size_t chunk = n_src <= 2 ? pair_chunk : tree_chunk;
  for (std::size_t c = begin; c < end; c += chunk) {
    const std::size_t m = std::min(chunk, end - c);
    const T* s0 = static_cast<const T*>(srcs[0]) + c;
    if (n_src == 1) {
      copy_bytes(tmp, s0, m * sizeof(T));
    } else if (n_src == 2) {
      combine_into<T, Op>(tmp, s0, static_cast<const T*>(srcs[1]) + c, m);
    } else {
      tree_of<T, Op, tree_chunk>([&](int r) { return static_cast<const T*>(srcs[r]) + c; }, n_src, m, levels);
    }
    if constexpr (Op == reduce_op::mean) {
      const T n = static_cast<T>(n_src);
      for (std::size_t j = 0; j < m; ++j) tmp[j] = static_cast<T>(tmp[j] / n);
    }
    for (int d = 0; d < n_dst; ++d) copy_bytes(static_cast<T*>(dsts[d]) + c, tmp, m * sizeof(T));
  }
}

// The tree of `n_outer` sources whose source `at` is itself the tree of the `n_inner` sources
// `inner` (a worker's own replicas' buffers among the other workers' combined ones), into every
// destination, without a pass over memory for the inner tree: both are combined chunk by chunk in
// the level buffers. Destinations may be sources. Not for `mean` (the caller divides).
template <class T, reduce_op Op>
void reduce_nested_chunks(const void* const* outer, int n_outer, int at, const void* const* inner, int n_inner,
                          std::size_t begin, std::size_t end, void* const* dsts, int n_dst) noexcept {
  static_assert(Op != reduce_op::mean);
  constexpr std::size_t chunk = tree_chunk_elements<T>;
  alignas(64) T levels[tree_levels][chunk];
  for (std::size_t c = begin; c < end; c += chunk) {
    const std::size_t m = std::min(chunk, end - c);
    const T* own = tree_of<T, Op, chunk>([&](int r) { return static_cast<const T*>(inner[r]) + c; }, n_inner, m,
                                         levels + tree_levels / 2);
    const T* result = tree_of<T, Op, chunk>([&](int r) { return r == at ? own : static_cast<const T*>(outer[r]) + c; },
                                            n_outer, m, levels);
    if (result != levels[0]) {
      copy_bytes(levels[0], result, m * sizeof(T));
      result = levels[0];
    }
    for (int d = 0; d < n_dst; ++d) copy_bytes(static_cast<T*>(dsts[d]) + c, result, m * sizeof(T));
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

// reduce_range with source `at` replaced by the tree of `inner` (see reduce_nested_chunks).
template <class T>
void reduce_nested_range(reduce_op op, const void* const* outer, int n_outer, int at, const void* const* inner,
                         int n_inner, std::size_t begin, std::size_t end, void* const* dsts, int n_dst) noexcept {
  if (begin >= end) return;
  switch (op) {
    case reduce_op::sum:
    case reduce_op::mean:
      return reduce_nested_chunks<T, reduce_op::sum>(outer, n_outer, at, inner, n_inner, begin, end, dsts, n_dst);
    case reduce_op::min:
      return reduce_nested_chunks<T, reduce_op::min>(outer, n_outer, at, inner, n_inner, begin, end, dsts, n_dst);
    case reduce_op::max:
      return reduce_nested_chunks<T, reduce_op::max>(outer, n_outer, at, inner, n_inner, begin, end, dsts, n_dst);
    case reduce_op::prod:
      return reduce_nested_chunks<T, reduce_op::prod>(outer, n_outer, at, inner, n_inner, begin, end, dsts, n_dst);
  }
}

}  // namespace distribute::comm::detail
