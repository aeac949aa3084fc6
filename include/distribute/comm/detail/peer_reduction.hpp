#pragma once
// The arithmetic of the GPU replicas' own all-reduce (cuda/comm/cuda_peer.cuh), in a plain header so that
// the CPU checks it: which slice of the flattened buffers each replica reduces, and the order in
// which one element's contributions are combined. That order must be the shared-memory communicator's tree over rank
// order (comm/detail/reduce_kernel.hpp: sources split at the largest power of two below their count,
// ((0 + 1) + (2 + 3)) + 4 for five), not a left-to-right fold: the two agree up to three replicas and
// differ in the last bits of a floating-point sum from four on.

#include <distribute/config.hpp>

#include <algorithm>
#include <cstddef>

namespace distribute::comm::detail {

// The most sources `tree_combine` takes.
inline constexpr int max_tree_sources = 32;

// The complete tree of the 2^K sources from `begin`: (left half) combined with (right half).
template <int K, class T, class At, class Combine>
DISTRIBUTE_HOST_DEVICE T complete_tree(const At& at, int begin, const Combine& combine) {
  if constexpr (K == 0) {
    return at(begin);
  } else {
    const T left = complete_tree<K - 1, T>(at, begin, combine);
    return combine(left, complete_tree<K - 1, T>(at, begin + (1 << (K - 1)), combine));
  }
}

// The blocks of n's binary digits from the right end, smallest first, each folded under the
// partial result: the tree's split at the largest power of two below n, unrolled.
template <int K, class T, class At, class Combine>
DISTRIBUTE_HOST_DEVICE T fold_blocks(const At& at, int n, int end, T acc, bool have, const Combine& combine) {
  if constexpr ((1 << K) > max_tree_sources) {
    return acc;
  } else {
    if (n & (1 << K)) {
      end -= 1 << K;
      const T block = complete_tree<K, T>(at, end, combine);
      acc = have ? combine(block, acc) : block;
      have = true;
    }
    return fold_blocks<K + 1, T>(at, n, end, acc, have, combine);
  }
}

// Sources 0..n-1 (`at(r)`, 1 <= n <= max_tree_sources) combined by `combine` in the tree order above.
// Every index is known at compile time once unrolled, so a GPU thread keeps the partial results in
// registers (a stack indexed at run time would live in local memory, which the build refuses).
template <class T, class At, class Combine>
DISTRIBUTE_HOST_DEVICE T tree_combine(const At& at, int n, const Combine& combine) {
  return fold_blocks<0, T>(at, n, n, T{}, false, combine);
}

// The elements [begin, end) of `total` flattened elements that replica `rank` of `n` reduces: whole
// units of 256 elements (so that every replica's vector loads keep the alignment of the buffers),
// split as evenly as units allow. The slices of ranks 0..n-1 cover [0, total) in order, without gaps
// or overlaps; a replica may get none.
struct peer_slice {
  std::size_t begin = 0, end = 0;
};

inline constexpr std::size_t peer_slice_unit = 256;

constexpr peer_slice slice_of(std::size_t total, int rank, int n) noexcept {
  const std::size_t units = (total + peer_slice_unit - 1) / peer_slice_unit;
  const auto r = static_cast<std::size_t>(rank), count = static_cast<std::size_t>(n);
  return {std::min(total, units * r / count * peer_slice_unit),
          std::min(total, units * (r + 1) / count * peer_slice_unit)};
}

}  // namespace distribute::comm::detail
