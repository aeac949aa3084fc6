#pragma once
// The arithmetic of the GPU replicas' own all-reduce (comm/cuda_peer.cuh), in a plain header so that
// the CPU checks it: which slice of the flattened buffers each replica reduces, and the order in
// which one element's contributions are combined. That order must be the CPU engine's tree over rank
// order (comm/detail/reduce_kernel.hpp: sources split at the largest power of two below their count,
// ((0 + 1) + (2 + 3)) + 4 for five), not a left-to-right fold: the two agree up to three replicas and
// differ in the last bits of a floating-point sum from four on.

#include <distribute/config.hpp>

#include <algorithm>
#include <cstddef>

namespace distribute::comm::detail {

// The largest replica count whose tree fits `tree_combine`'s stack (one entry per power of two).
inline constexpr int max_tree_sources = 64;

// Source 0..n-1's values (`at(r)`) combined by `combine` in the tree order above. A binary counter:
// each source is pushed, equal-sized partial results merge as soon as they meet, and what remains is
// folded from the smallest up. Per element and branch-free of the data, for a GPU thread as for the CPU.
template <class T, class At, class Combine>
DISTRIBUTE_HOST_DEVICE T tree_combine(const At& at, int n, const Combine& combine) {
  T part[7];  // bit_width(max_tree_sources): at most one partial result per power of two
  int size[7];
  int depth = 0;
  for (int r = 0; r < n; ++r) {
    part[depth] = at(r);
    size[depth++] = 1;
    while (depth >= 2 && size[depth - 1] == size[depth - 2]) {
      part[depth - 2] = combine(part[depth - 2], part[depth - 1]);
      size[depth - 2] *= 2;
      --depth;
    }
  }
  for (int i = depth - 2; i >= 0; --i) part[i] = combine(part[i], part[i + 1]);
  return part[0];
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
  return {std::min(total, units * r / count * peer_slice_unit), std::min(total, units * (r + 1) / count * peer_slice_unit)};
}

}  // namespace distribute::comm::detail
