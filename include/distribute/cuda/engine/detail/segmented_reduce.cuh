#pragma once
// The GPU's segmented sums, shared by the engine's segmented_sum (cuda/engine/cuda.cuh) and the
// convolutions' bias gradient (cudnn_conv.cuh): results[s] = the sum over i in [0, length) of
// values[s * length + i], for s in [0, segments), by CUB's segmented reduction on a stream, cut into
// chunks as engine/detail/segmented_sum_plan.hpp plans it. Each stage sums in a fixed order, so the
// bits do not change from run to run. Nothing waits for the device, so the sums can be captured into
// a CUDA graph. The chunks' sums live in memory from the stream's pool (cuda/device/memory.cuh).
//
// `values` is an iterator of doubles over the flat index (a transform iterator over a counting
// iterator); `results` an output iterator of segments doubles: a pointer, or a tabulate output
// iterator that applies an epilogue as the last stage writes each sum. Callers check the launch.

#include <distribute/config.hpp>

#if !DISTRIBUTE_HAS_CUDA
#  error "<distribute/cuda/engine/detail/segmented_reduce.cuh> needs nvcc and the CUDA toolkit (link distribute::cuda)"
#endif

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/memory.cuh>
#include <distribute/cuda/engine/detail/thrust_for_each.hpp>
#include <distribute/engine/detail/segmented_sum_plan.hpp>

#include <cub/device/device_segmented_reduce.cuh>
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/transform_iterator.h>

#include <cstddef>
#include <cstdint>

namespace distribute::detail {

// out[k] = the sum of values[begins[k], ends[k]), k in [0, segments): CUB's, on `stream`.
template <class Values, class Out, class Begins, class Ends>
void cub_segmented_sum(int ordinal, cudaStream_t stream, Values values, Out out, std::int64_t segments, Begins begins,
                       Ends ends) {
  std::size_t bytes = 0;
  cuda_check(cub::DeviceSegmentedReduce::Sum(nullptr, bytes, values, out, segments, begins, ends, stream),
             "cub::DeviceSegmentedReduce::Sum (sizing)", ordinal);
  const device_allocation scratch(ordinal, bytes, stream);
  cuda_check(cub::DeviceSegmentedReduce::Sum(scratch.get(), bytes, values, out, segments, begins, ends, stream),
             "cub::DeviceSegmentedReduce::Sum", ordinal);
}

// results[s] = the sum of segment s of `values`, planned (segments > 0 and length > 0).
template <class Values, class Results>
void planned_segmented_sum(int ordinal, cudaStream_t stream, std::int64_t segments, std::int64_t length, Values values,
                           Results results) {
  const segmented_sum_plan plan = plan_segmented_sum(segments, length);
  const thrust::counting_iterator<std::int64_t> first(0);
  if (!plan.two_stage()) {
    const auto starts = thrust::make_transform_iterator(first, thrust_loops::plane_start{length});
    cub_segmented_sum(ordinal, stream, values, results, segments, starts, starts + 1);
    return;
  }
  const auto chunk_starts = thrust::make_transform_iterator(first, chunk_start{plan.length, plan.chunks, plan.chunk});
  const auto chunk_ends = thrust::make_transform_iterator(first, chunk_end{plan.length, plan.chunks, plan.chunk});
  const device_allocation partial(ordinal, static_cast<std::size_t>(plan.blocks()) * sizeof(double), stream);
  double* sums = static_cast<double*>(partial.get());
  cub_segmented_sum(ordinal, stream, values, sums, plan.blocks(), chunk_starts, chunk_ends);
  const auto starts = thrust::make_transform_iterator(first, thrust_loops::plane_start{plan.chunks});
  cub_segmented_sum(ordinal, stream, static_cast<const double*>(sums), results, segments, starts, starts + 1);
}

}  // namespace distribute::detail
