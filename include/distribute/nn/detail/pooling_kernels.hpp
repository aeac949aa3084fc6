#pragma once
// Average pooling (nn/pooling.hpp), forward and backward.
// Functors over raw pointers that any engine runs (nn/detail/kernels.hpp): each is called with an
// element index i, or a plane (segment) s and an index i within it.

#include <distribute/config.hpp>

#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

// Windows of kernel x kernel moved by `stride` over planes of in_height x in_width, no padding; the
// output plane is out_height x out_width. Sums in double, in window order.
struct pool_geometry {
  index in_height, in_width, out_height, out_width, kernel, stride;
};
// Output element i of plane s: the mean of its window.
template <class T>
struct avg_pool_forward {
  const T* x;
  T* y;
  pool_geometry g;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index oh = i / g.out_width, ow = i - oh * g.out_width;
    const T* plane = x + s * g.in_height * g.in_width;
    double sum = 0;
    for (index ki = 0; ki < g.kernel; ++ki)
      for (index kj = 0; kj < g.kernel; ++kj)
        sum += static_cast<double>(plane[(oh * g.stride + ki) * g.in_width + ow * g.stride + kj]);
    y[s * g.out_height * g.out_width + i] = static_cast<T>(sum / static_cast<double>(g.kernel * g.kernel));
  }
};
// Input element i of plane s: the sum of dy over the windows that contain it, over kernel^2 (a
// gather, so that overlapping windows need no atomics and the order is fixed).
template <class T>
struct avg_pool_backward {
  const T* dy;
  T* dx;
  pool_geometry g;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index h = i / g.in_width, w = i - h * g.in_width;
    // Windows oh with oh * stride <= h < oh * stride + kernel, within the output.
    const index oh_lo = h < g.kernel ? 0 : (h - g.kernel) / g.stride + 1;
    const index ow_lo = w < g.kernel ? 0 : (w - g.kernel) / g.stride + 1;
    const index oh_hi = h / g.stride < g.out_height - 1 ? h / g.stride : g.out_height - 1;
    const index ow_hi = w / g.stride < g.out_width - 1 ? w / g.stride : g.out_width - 1;
    const T* plane = dy + s * g.out_height * g.out_width;
    double sum = 0;
    for (index oh = oh_lo; oh <= oh_hi; ++oh)
      for (index ow = ow_lo; ow <= ow_hi; ++ow) sum += static_cast<double>(plane[oh * g.out_width + ow]);
    dx[s * g.in_height * g.in_width + i] = static_cast<T>(sum / static_cast<double>(g.kernel * g.kernel));
  }
};

}  // namespace distribute::nn::detail::kernels
