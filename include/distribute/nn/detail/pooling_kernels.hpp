#pragma once
// Average pooling (nn/pooling.hpp), forward and backward.
// Functors over raw pointers that any engine runs (nn/detail/kernels.hpp): each is called with an
// element index i, or a plane (segment) s and an index i within it. The CPU engine runs a plane at a
// time through whole_segment(s): the same sums in the same order, with the window bounds stepped
// along rows and columns instead of divided out of every index (the divisions took a third of a
// small classifier's step).

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
    y[s * g.out_height * g.out_width + i] = window_mean(x + s * g.in_height * g.in_width, oh, ow);
  }
  void whole_segment(index s) const {
    const T* plane = x + s * g.in_height * g.in_width;
    T* out = y + s * g.out_height * g.out_width;
    for (index oh = 0; oh < g.out_height; ++oh)
      for (index ow = 0; ow < g.out_width; ++ow) out[oh * g.out_width + ow] = window_mean(plane, oh, ow);
  }
  // The mean of output (oh, ow)'s window of `plane`.
  DISTRIBUTE_HOST_DEVICE T window_mean(const T* plane, index oh, index ow) const {
    double sum = 0;
    for (index ki = 0; ki < g.kernel; ++ki)
      for (index kj = 0; kj < g.kernel; ++kj)
        sum += static_cast<double>(plane[(oh * g.stride + ki) * g.in_width + ow * g.stride + kj]);
    return static_cast<T>(sum / static_cast<double>(g.kernel * g.kernel));
  }
};
// The windows along one axis that contain position h: oh from lo to hi (empty when lo > hi), those
// with oh * stride <= h < oh * stride + kernel within [0, out). Stepped from h = 0 upwards by
// next(), with no division.
struct pool_window_range {
  index kernel, stride, out;
  index q = 0, r = 0;    // h / stride, h % stride
  index q2 = 0, r2 = 0;  // (h - kernel) / stride, (h - kernel) % stride, once h >= kernel
  index h = 0;
  index lo() const { return h < kernel ? 0 : q2 + 1; }
  index hi() const { return q < out - 1 ? q : out - 1; }
  void next() {
    ++h;
    if (++r == stride) r = 0, ++q;
    if (h == kernel) q2 = 0, r2 = 0;
    else if (h > kernel && ++r2 == stride) r2 = 0, ++q2;
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
    dx[s * g.in_height * g.in_width + i] = gather(dy + s * g.out_height * g.out_width, oh_lo, oh_hi, ow_lo, ow_hi);
  }
  // The sum of `plane`'s dy over windows oh_lo..oh_hi x ow_lo..ow_hi, over kernel^2.
  DISTRIBUTE_HOST_DEVICE T gather(const T* plane, index oh_lo, index oh_hi, index ow_lo, index ow_hi) const {
    double sum = 0;
    for (index oh = oh_lo; oh <= oh_hi; ++oh)
      for (index ow = ow_lo; ow <= ow_hi; ++ow) sum += static_cast<double>(plane[oh * g.out_width + ow]);
    return static_cast<T>(sum / static_cast<double>(g.kernel * g.kernel));
  }
  void whole_segment(index s) const {
    const T* plane = dy + s * g.out_height * g.out_width;
    T* out = dx + s * g.in_height * g.in_width;
    if (g.stride == g.kernel) {
      tiles(plane, out);
      return;
    }
    pool_window_range rows{g.kernel, g.stride, g.out_height};
    for (index h = 0; h < g.in_height; ++h, rows.next()) {
      pool_window_range cols{g.kernel, g.stride, g.out_width};
      for (index w = 0; w < g.in_width; ++w, cols.next())
        out[h * g.in_width + w] = gather(plane, rows.lo(), rows.hi(), cols.lo(), cols.hi());
    }
  }
  // Windows that tile the plane (stride = kernel): each input in a window takes that window's value,
  // gathered once and copied over the window; inputs no window covers take 0.
  void tiles(const T* plane, T* out) const {
    const index k = g.kernel, covered = g.out_width * k;
    for (index oh = 0; oh < g.out_height; ++oh) {
      T* band = out + oh * k * g.in_width;
      for (index ow = 0; ow < g.out_width; ++ow) {
        const T v = gather(plane, oh, oh, ow, ow);
        for (index kj = 0; kj < k; ++kj) band[ow * k + kj] = v;
      }
      for (index w = covered; w < g.in_width; ++w) band[w] = T(0);
      for (index ki = 1; ki < k; ++ki)
        for (index w = 0; w < g.in_width; ++w) band[ki * g.in_width + w] = band[w];
    }
    for (index i = g.out_height * k * g.in_width; i < g.in_height * g.in_width; ++i) out[i] = T(0);
  }
};

}  // namespace distribute::nn::detail::kernels
