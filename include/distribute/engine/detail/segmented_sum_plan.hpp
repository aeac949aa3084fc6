#pragma once
// How the GPU engine splits a segmented sum (out[s] = the sum over i of f(s, i)) over its threads. CUB's
// segmented reduction gives each segment one block of 256 threads: enough for many short segments,
// but a few long ones (an instance norm's 64 planes of 256x256, a loss over one 3x256x256 image)
// leave each thread summing hundreds of values serially on a handful of multiprocessors (130 us for
// 64 planes of 64K values on an H100, where memory bandwidth allows 6 us). Segments longer than
// `chunk_limit` are cut into equal chunks, each summed by a block of its own, and the chunks' sums
// of each segment are then summed by a second segmented reduction: two fixed orders, so the bits
// still do not change from run to run. A sum of few segments (a loss over one image: 24 chunks of
// the limit; a bias gradient over 3 channels: 3 segments) would still leave most of a large GPU's
// 132 multiprocessors idle, so it is cut finer, down to `min_chunk` values a block, until it offers
// `min_blocks` blocks. Sums that already offer that many keep one stage: a second launch costs more
// than it saves there.
//
// A plain header: the CPU engine reports the same work items for the pass (engine/pass_observer.hpp),
// and tests check the plan without a GPU.

#include <distribute/config.hpp>

#include <algorithm>
#include <cstdint>

namespace distribute::detail {

struct segmented_sum_plan {
  // Threads of one block of CUB's segmented reduction (its policy for double sums).
  static constexpr std::int64_t block_threads = 256;
  // The most values a block sums: 32 a thread, half of what leaves a pass short of one work item
  // per 64 elements (the bound engine/pass_observer.hpp's users check).
  static constexpr std::int64_t chunk_limit = 32 * block_threads;
  // Blocks a sum should offer (about two for each multiprocessor of an H100 or H200), and the
  // fewest values a block sums when cut finer to reach them (two a thread).
  static constexpr std::int64_t min_blocks = 256;
  static constexpr std::int64_t min_chunk = 2 * block_threads;

  std::int64_t segments = 0;
  std::int64_t length = 0;
  std::int64_t chunks = 1;  // chunks per segment; 1: one reduction straight into the output
  std::int64_t chunk = 0;   // values per chunk (the last chunk of a segment may have fewer)

  constexpr bool two_stage() const noexcept { return chunks > 1; }
  // The launches (or CPU passes) the sum takes: the chunks' reduction, then theirs where two-stage.
  constexpr int launches() const noexcept { return two_stage() ? 2 : 1; }
  // Blocks of the first (or only) reduction.
  constexpr std::int64_t blocks() const noexcept { return segments * chunks; }
  // The threads that sum in parallel: the pass's work items.
  constexpr std::int64_t work_items() const noexcept { return blocks() * block_threads; }
};

constexpr segmented_sum_plan plan_segmented_sum(std::int64_t segments, std::int64_t length) noexcept {
  segmented_sum_plan p;
  p.segments = segments > 0 ? segments : 0;
  p.length = length > 0 ? length : 0;
  using plan = segmented_sum_plan;
  const auto ceil_div = [](std::int64_t a, std::int64_t b) { return (a + b - 1) / b; };
  std::int64_t chunks = ceil_div(p.length, plan::chunk_limit);
  if (p.segments > 0 && p.segments * chunks < plan::min_blocks) {
    // Few blocks: as many chunks as reach min_blocks, none shorter than min_chunk.
    const std::int64_t wanted = ceil_div(plan::min_blocks, p.segments), most = p.length / plan::min_chunk;
    chunks = std::max(chunks, std::min(wanted, most));
  }
  if (chunks <= 1) {
    p.chunk = p.length;
    return p;
  }
  p.chunks = chunks;
  p.chunk = ceil_div(p.length, p.chunks);  // equal chunks, the last one shorter
  return p;
}

// Chunk k of the first reduction (segment k / chunks, chunk k % chunks) over the flat index
// s * length + i: where it starts and where it ends.
struct chunk_start {
  std::int64_t length, chunks, chunk;
  DISTRIBUTE_HOST_DEVICE std::int64_t operator()(std::int64_t k) const {
    const std::int64_t s = k / chunks;
    return s * length + (k - s * chunks) * chunk;
  }
};
struct chunk_end {
  std::int64_t length, chunks, chunk;
  DISTRIBUTE_HOST_DEVICE std::int64_t operator()(std::int64_t k) const {
    const std::int64_t s = k / chunks, end = s * length + (k - s * chunks + 1) * chunk;
    return end < (s + 1) * length ? end : (s + 1) * length;
  }
};

}  // namespace distribute::detail
