#pragma once
// The GPU engine's segmented sums (cuda/engine/detail/segmented_reduce.cuh) on the host, for the
// thrust_host tests: out[s] = the sum over i in [0, length) of f(s, i), in double, cut into chunks as
// engine/detail/segmented_sum_plan.hpp plans them (the chunks' sums first, then each segment's chunk
// sums), each stage by thrust::reduce_by_key in index order where the GPU runs CUB's segmented
// reduction. With an epilogue, out[s] = finish(s, the sum), written through a tabulate output
// iterator by the last stage, as the GPU engine writes it.

#include <distribute/cuda/engine/detail/thrust_for_each.hpp>
#include <distribute/engine/detail/segmented_sum_plan.hpp>

#include <thrust/fill.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/discard_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/reduce.h>
#include <thrust/system/cpp/execution_policy.h>

#include <cstdint>
#include <vector>

namespace thrust_host {

// Flat index j of segments of `size` values: its segment.
struct segment_of {
  std::int64_t size;
  std::int64_t operator()(std::int64_t j) const { return j / size; }
};
// Flat index j: its chunk (segment s's chunks are s * chunks ... s * chunks + chunks - 1).
struct chunk_of {
  std::int64_t length, chunks, chunk;
  std::int64_t operator()(std::int64_t j) const {
    const std::int64_t s = j / length;
    return s * chunks + (j - s * length) / chunk;
  }
};

// results[s] = the sum of values[s * length, (s + 1) * length), planned (segments > 0, length > 0).
template <class Values, class Results>
void planned_sum(std::int64_t segments, std::int64_t length, Values values, Results results) {
  const distribute::detail::segmented_sum_plan plan = distribute::detail::plan_segmented_sum(segments, length);
  const thrust::counting_iterator<std::int64_t> first(0);
  const auto by_segment = [&](std::int64_t size) { return thrust::make_transform_iterator(first, segment_of{size}); };
  if (!plan.two_stage()) {
    thrust::reduce_by_key(thrust::cpp::par, by_segment(length), by_segment(length) + segments * length, values,
                          thrust::make_discard_iterator(), results);
    return;
  }
  std::vector<double> partial(static_cast<std::size_t>(plan.blocks()));
  const auto chunks = thrust::make_transform_iterator(first, chunk_of{length, plan.chunks, plan.chunk});
  thrust::reduce_by_key(thrust::cpp::par, chunks, chunks + segments * length, values, thrust::make_discard_iterator(),
                        partial.begin());
  thrust::reduce_by_key(thrust::cpp::par, by_segment(plan.chunks), by_segment(plan.chunks) + plan.blocks(),
                        partial.begin(), thrust::make_discard_iterator(), results);
}

// The engines' segmented_sum, without and with an epilogue.
template <class F>
void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out) {
  if (segments <= 0) return;
  if (length <= 0) {
    thrust::fill_n(thrust::cpp::par, out, segments, 0.0);
    return;
  }
  const thrust::counting_iterator<std::int64_t> first(0);
  planned_sum(segments, length,
              thrust::make_transform_iterator(first, distribute::detail::thrust_loops::plane_term<F>{f, length}), out);
}
template <class F, class Finish>
void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out, Finish finish) {
  namespace loops = distribute::detail::thrust_loops;
  if (segments <= 0) return;
  if (length <= 0) {
    distribute::detail::for_each_index(thrust::cpp::par, segments, loops::finish_empty<Finish>{out, finish});
    return;
  }
  const thrust::counting_iterator<std::int64_t> first(0);
  planned_sum(segments, length, thrust::make_transform_iterator(first, loops::plane_term<F>{f, length}),
              thrust::make_tabulate_output_iterator(loops::finish_into<Finish>{out, finish}));
}

}  // namespace thrust_host
