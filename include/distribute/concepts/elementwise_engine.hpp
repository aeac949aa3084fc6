#pragma once
// The element-wise half of a compute engine: what losses, optimisers, normalisation statistics and
// the layers' activations call. Every device's engine has it (engine<cpu>, engine<cuda>), and so does
// `serial_engine` (engine/serial.hpp), the calling thread alone over host memory.
//
//   for_each(n, f)                          f(i) for every i in [0, n), in any order and in parallel
//   for_each_in_segments(segments, length, f)
//                                           f(s, i) for every plane s and element i of a grid
//   segmented_sum(segments, length, f, out) out[s] = the sum over i in [0, length) of f(s, i),
//                                           accumulated in double in an order fixed by `length`
//                                           alone (so no result depends on the thread count)
//   to_host(src, n, dst)                    n elements copied where the host reads them
//
// Optional: segmented_sum(segments, length, f, out, finish), out[s] = finish(s, the sum), in the
// same pass (the library's engines have it: on a GPU the per-segment work after a sum then takes no
// launch of its own). Callers go through nn/detail/plane_statistics.hpp's segmented_sum_then, which
// runs `finish` as a pass of its own on an engine without it, with the same bits.
//
// `f` is a functor of plain headers (DISTRIBUTE_HOST_DEVICE) taken by value, so the same functor
// runs on a GPU. Parallel means over elements: a pass must not give a thread (or a GPU's thread) a
// whole plane or row to walk, or a GPU runs it on a handful of threads.

#include <concepts>
#include <cstddef>
#include <cstdint>

namespace distribute {

namespace detail {
// Functors of the shapes the passes take, for the concepts' requirements alone.
struct index_probe {
  void operator()(std::int64_t) const noexcept {}
};
struct segment_probe {
  void operator()(std::int64_t, std::int64_t) const noexcept {}
};
struct term_probe {
  float operator()(std::int64_t, std::int64_t) const noexcept { return 0; }
};
}  // namespace detail

template <class E>
concept elementwise_engine =
    requires(E& e, const float* src, float* dst, double* sums, std::int64_t n, std::size_t count) {
      e.for_each(n, detail::index_probe{});
      e.for_each_in_segments(n, n, detail::segment_probe{});
      e.segmented_sum(n, n, detail::term_probe{}, sums);
      e.to_host(src, count, dst);
    };

}  // namespace distribute
