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

// The tree of `n` sources (n >= 3) over `m` elements at offset c, into levels[0]. A binary counter:
// sources are paired in order (0 + 1, 2 + 3, ...), equal-sized partial results merged as soon as they
// meet (the stack holds at most one of each power of two), and what remains folded from the smallest
// up, which is the split at the largest power of two below n, recursively.
template <class T, reduce_op Op, std::size_t Chunk, int Levels>
void tree_chunk(const void* const* srcs, int n, std::size_t c, std::size_t m, T (&levels)[Levels][Chunk]) noexcept {
  const T* part[Levels + 1];
  std::uint64_t size[Levels + 1];
  int depth = 0;
  auto src = [&](int r) { return static_cast<const T*>(srcs[r]) + c; };
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
}

template <class T, reduce_op Op>
void reduce_chunks(const void* const* srcs, int n_src, std::size_t begin, std::size_t end, void* const* dsts,
                   int n_dst) noexcept {
  // One or two sources go through one 8 KiB buffer; a tree of up to 2^16 sources through at most
  // log2(n) buffers of 2 KiB in use at once.
  constexpr int levels_max = 16;
  constexpr std::size_t pair_chunk = 8192 / sizeof(T) > 0 ? 8192 / sizeof(T) : 1;
  constexpr std::size_t tree_chunk_size = 2048 / sizeof(T) > 0 ? 2048 / sizeof(T) : 1;
  alignas(64) T pair[pair_chunk];
  alignas(64) T levels[levels_max][tree_chunk_size];
  T* const tmp = n_src <= 2 ? pair : levels[0];
  const std::size_t chunk = n_src <= 2 ? pair_chunk : tree_chunk_size;
  for (std::size_t c = begin; c < end; c += chunk) {
    const std::size_t m = std::min(chunk, end - c);
    const T* s0 = static_cast<const T*>(srcs[0]) + c;
    if (n_src == 1) {
      copy_bytes(tmp, s0, m * sizeof(T));
    } else if (n_src == 2) {
      combine_into<T, Op>(tmp, s0, static_cast<const T*>(srcs[1]) + c, m);
    } else {
      tree_chunk<T, Op, tree_chunk_size, levels_max>(srcs, n_src, c, m, levels);
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
