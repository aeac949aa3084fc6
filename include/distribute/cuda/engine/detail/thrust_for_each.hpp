#pragma once
// The element-wise loops of an engine, on top of Thrust: the functors of nn/detail/kernels.hpp (called
// with an index i, or a plane s and an index i within it) run through thrust::for_each_n over a
// counting iterator. The execution policy is the caller's: a GPU engine passes
// thrust::cuda::par_nosync.on(stream), a host test thrust::cpp::par. (The GPU engine's per-plane
// sums are CUB's segmented reduction over the same functors: cuda/engine/cuda.cuh.) A plain header (no CUDA syntax beyond DISTRIBUTE_HOST_DEVICE), so g++ compiles
// it wherever Thrust's headers are on the include path; only code that has Thrust includes it.
//
//   for_each_index(policy, n, f)                      f(i) for i in [0, n)
//   for_each_plane_index(policy, planes, size, f)     f(s, i) for s in [0, planes), i in [0, size)
//
// The calls of one pass are independent (the functors' contract), so their order is the policy's.

#if !__has_include(<thrust/for_each.h>)
#  error \
      "distribute/cuda/engine/detail/thrust_for_each.hpp needs Thrust's headers (the CUDA toolkit's include/ or include/cccl/)"
#endif

#include <distribute/config.hpp>

#include <thrust/for_each.h>
#include <thrust/iterator/counting_iterator.h>

#include <cstdint>

namespace distribute::detail::thrust_loops {

using index = std::int64_t;

// Flat index j of planes x size: plane s = j / size, index i = j - s * size.
template <class F>
struct plane_call {
  F f;
  index size;
  DISTRIBUTE_HOST_DEVICE void operator()(index j) const {
    const index s = j / size;
    f(s, j - s * size);
  }
};
template <class F>
struct plane_term {
  F f;
  index size;
  DISTRIBUTE_HOST_DEVICE double operator()(index j) const {
    const index s = j / size;
    return static_cast<double>(f(s, j - s * size));
  }
};
// Where plane s starts in the flat index: s * size.
struct plane_start {
  index size;
  DISTRIBUTE_HOST_DEVICE index operator()(index s) const { return s * size; }
};
// A segmented sum's epilogue: out[s] = finish(s, the sum of segment s) (the engines' five-argument
// segmented_sum), written through thrust::tabulate_output_iterator by the reduction itself.
template <class Finish>
struct finish_into {
  double* out;
  Finish finish;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, double sum) const { out[s] = finish(s, sum); }
};
// The same for segments of no values: out[s] = finish(s, 0).
template <class Finish>
struct finish_empty {
  double* out;
  Finish finish;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const { out[s] = finish(s, 0.0); }
};
// Channel s of an NCHW tensor x (`batch` examples of `channels` planes of `plane` values) as
// segment s of batch * plane values, over the flat index j = s * (batch * plane) + n * plane + p: the
// terms of a bias gradient's sums (cuda/engine/detail/cudnn_conv.cuh), in double.
template <class T>
struct channel_term {
  const T* x;
  index batch, channels, plane;
  DISTRIBUTE_HOST_DEVICE double operator()(index j) const {
    const index length = batch * plane, s = j / length, i = j - s * length, n = i / plane;
    return static_cast<double>(x[(n * channels + s) * plane + (i - n * plane)]);
  }
};
// An epilogue that adds each segment's sum to an existing value: to[s] += sum (a gradient added to).
template <class T>
struct add_sum_to {
  T* to;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, double sum) const { to[s] += static_cast<T>(sum); }
};

}  // namespace distribute::detail::thrust_loops

namespace distribute::detail {

// f(i) for every i in [0, n).
template <class Policy, class F>
void for_each_index(const Policy& policy, std::int64_t n, F f) {
  if (n <= 0) return;
  thrust::for_each_n(policy, thrust::counting_iterator<std::int64_t>(0), n, f);
}

// f(s, i) for every plane s in [0, planes) and i in [0, plane_size): one flat pass over all planes.
template <class Policy, class F>
void for_each_plane_index(const Policy& policy, std::int64_t planes, std::int64_t plane_size, F f) {
  if (planes <= 0 || plane_size <= 0) return;
  for_each_index(policy, planes * plane_size, thrust_loops::plane_call<F>{f, plane_size});
}

}  // namespace distribute::detail
