#pragma once
// Several buffers taken as one flat sequence of elements: the runs of a flat range that lie in each
// buffer, for collectives that reduce a list of buffers as if they were one, without packing them.

#include <algorithm>
#include <cstddef>
#include <span>

namespace distribute::comm::detail {

// Calls f(pointer, length, offset) for the runs of flat elements [b, e) of `bufs`: cut at the
// buffers' ends and into runs of at most `piece` elements; `offset` is the run's start minus b.
// Two workers cutting the same range of equally long buffers get the same runs.
template <class T, class F>
void for_each_run(std::span<const std::span<T>> bufs, std::size_t b, std::size_t e, std::size_t piece, F&& f) {
  std::size_t at = 0;
  for (const auto buf : bufs) {
    if (at >= e) break;
    const std::size_t end = at + buf.size();
    for (std::size_t lo = std::max(b, at), hi = std::min(e, end); lo < hi;) {
      const std::size_t m = std::min(piece, hi - lo);
      f(buf.data() + (lo - at), m, lo - b);
      lo += m;
    }
    at = end;
  }
}

// Element range [block_begin(n, k, b), block_begin(n, k, b + 1)) is block b of n elements cut into
// k nearly equal blocks.
inline std::size_t block_begin(std::size_t n, int k, int b) noexcept {
  const auto kk = static_cast<std::size_t>(k), bb = static_cast<std::size_t>(b);
  return n / kk * bb + n % kk * bb / kk;  // n * b / k without overflow
}

}  // namespace distribute::comm::detail
