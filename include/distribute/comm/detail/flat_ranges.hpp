#pragma once
// Several buffers taken as one flat sequence of elements: the runs of a flat range that lie in each
// buffer, for collectives that reduce a list of buffers as if they were one, without packing them.

#include <algorithm>
#include <cstddef>
#include <span>

namespace distribute::comm::detail {

// Calls f(buffer, at, length, offset) for the runs of flat elements [b, e) of `bufs`: element `at`
// of buffer `buffer` onwards, cut at the buffers' ends and into runs of at most `piece` elements;
// `offset` is the run's start minus b. Lists of equally long buffers are cut the same way.
template <class T, class F>
void for_each_run_at(std::span<const std::span<T>> bufs, std::size_t b, std::size_t e, std::size_t piece, F&& f) {
  std::size_t at = 0;
  for (std::size_t i = 0; i < bufs.size() && at < e; ++i) {
    const std::size_t end = at + bufs[i].size();
    for (std::size_t lo = std::max(b, at), hi = std::min(e, end); lo < hi;) {
      const std::size_t m = std::min(piece, hi - lo);
      f(i, lo - at, m, lo - b);
      lo += m;
    }
    at = end;
  }
}

// The same runs as pointers: f(pointer, length, offset).
template <class T, class F>
void for_each_run(std::span<const std::span<T>> bufs, std::size_t b, std::size_t e, std::size_t piece, F&& f) {
  for_each_run_at(bufs, b, e, piece, [&](std::size_t i, std::size_t at, std::size_t m, std::size_t off) {
    f(bufs[i].data() + at, m, off);
  });
}

// Element range [block_begin(n, k, b), block_begin(n, k, b + 1)) is block b of n elements cut into
// k nearly equal blocks.
inline std::size_t block_begin(std::size_t n, int k, int b) noexcept {
  const auto kk = static_cast<std::size_t>(k), bb = static_cast<std::size_t>(b);
  return n / kk * bb + n % kk * bb / kk;  // n * b / k without overflow
}

}  // namespace distribute::comm::detail
