#pragma once
// The passes of nn::upsample and nn::pixel_shuffle (nn/upsample.hpp, nn/pixel_shuffle.hpp) over NCHW
// tensors. Functors over raw pointers that any engine runs (nn/detail/kernels.hpp): each is called
// with an element index i, or a plane (segment) s and an index i within it. Backward passes are
// gathers: each input-gradient element sums the output gradients it fed, in a fixed order (rows, then
// columns, ascending), so no two calls write one element.

#include <distribute/config.hpp>

#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

// The planes' extents: input h x w, output (h * scale) x (w * scale).
struct upsample_geometry {
  index h, w, scale;
  DISTRIBUTE_HOST_DEVICE index out_h() const { return h * scale; }
  DISTRIBUTE_HOST_DEVICE index out_w() const { return w * scale; }
};

// Nearest: output (oh, ow) copies input (oh / scale, ow / scale) (PyTorch's mode="nearest", whose
// floor(oh * (1 / scale)) is the same index for an integer scale).
template <class T>
struct upsample_nearest_forward {
  const T* x;
  T* y;
  upsample_geometry g;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index ow = g.out_w(), oh = i / ow, oc = i - oh * ow;
    y[s * g.out_h() * ow + i] = x[s * g.h * g.w + (oh / g.scale) * g.w + oc / g.scale];
  }
};
template <class T>
struct upsample_nearest_backward {
  const T* dy;
  T* dx;
  upsample_geometry g;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index ih = i / g.w, iw = i - ih * g.w, ow = g.out_w();
    const T* p = dy + s * g.out_h() * ow;
    double sum = 0;
    for (index a = 0; a < g.scale; ++a)
      for (index b = 0; b < g.scale; ++b) sum += static_cast<double>(p[(ih * g.scale + a) * ow + iw * g.scale + b]);
    dx[s * g.h * g.w + i] = static_cast<T>(sum);
  }
};

// Bilinear with align_corners=false (PyTorch's default for mode="bilinear"): output o reads the input
// at src = (o + 0.5) / scale - 0.5, clamped at 0, between i0 = floor(src) and i1 = min(i0 + 1, n - 1),
// with weights 1 - l and l, l = src - i0; computed in T as PyTorch computes in the tensor's type.
template <class T>
struct bilinear_tap {
  index i0, i1;
  T l0, l1;
};
template <class T>
DISTRIBUTE_HOST_DEVICE bilinear_tap<T> bilinear_source(index o, index n, index scale) {
  const T inverse = static_cast<T>(1.0 / static_cast<double>(scale));
  T src = inverse * (static_cast<T>(o) + T(0.5)) - T(0.5);
  if (src < T(0)) src = T(0);
  const index i0 = static_cast<index>(src);  // src >= 0: truncation is floor
  const index i1 = i0 < n - 1 ? i0 + 1 : i0;
  const T l1 = src - static_cast<T>(i0);
  return {i0, i1, T(1) - l1, l1};
}
// The weight with which output o reads input i (0 where it does not).
template <class T>
DISTRIBUTE_HOST_DEVICE T bilinear_weight(const bilinear_tap<T>& t, index i) {
  return (t.i0 == i ? t.l0 : T(0)) + (t.i1 == i ? t.l1 : T(0));
}
template <class T>
struct upsample_bilinear_forward {
  const T* x;
  T* y;
  upsample_geometry g;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index ow = g.out_w(), oh = i / ow, oc = i - oh * ow;
    const auto th = bilinear_source<T>(oh, g.h, g.scale), tw = bilinear_source<T>(oc, g.w, g.scale);
    const T* p = x + s * g.h * g.w;
    y[s * g.out_h() * ow + i] = th.l0 * (tw.l0 * p[th.i0 * g.w + tw.i0] + tw.l1 * p[th.i0 * g.w + tw.i1]) +
                                th.l1 * (tw.l0 * p[th.i1 * g.w + tw.i0] + tw.l1 * p[th.i1 * g.w + tw.i1]);
  }
};
// Input (ih, iw) sums weight * dy over the outputs that read it: those within a scale of its
// neighbours' rows and columns, [(ih - 1) scale, (ih + 2) scale).
template <class T>
struct upsample_bilinear_backward {
  const T* dy;
  T* dx;
  upsample_geometry g;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index ih = i / g.w, iw = i - ih * g.w, ow = g.out_w(), ohs = g.out_h();
    const index h_lo = ih > 0 ? (ih - 1) * g.scale : 0, h_hi = (ih + 2) * g.scale < ohs ? (ih + 2) * g.scale : ohs;
    const index w_lo = iw > 0 ? (iw - 1) * g.scale : 0, w_hi = (iw + 2) * g.scale < ow ? (iw + 2) * g.scale : ow;
    const T* p = dy + s * ohs * ow;
    double sum = 0;
    for (index oh = h_lo; oh < h_hi; ++oh) {
      const T wh = bilinear_weight(bilinear_source<T>(oh, g.h, g.scale), ih);
      if (wh == T(0)) continue;
      for (index oc = w_lo; oc < w_hi; ++oc) {
        const T ww = bilinear_weight(bilinear_source<T>(oc, g.w, g.scale), iw);
        sum += static_cast<double>(wh) * static_cast<double>(ww) * static_cast<double>(p[oh * ow + oc]);
      }
    }
    dx[s * g.h * g.w + i] = static_cast<T>(sum);
  }
};

// Pixel shuffle (PyTorch's element order): output [n, c, h * r + a, w * r + b] is input
// [n, c * r * r + a * r + b, h, w]. `unshuffle` runs the inverse map (the backward pass: a
// permutation's gradient is the inverse permutation). One call per element of the output (or, for the
// inverse, of the input), indexed in the layout written.
struct pixel_shuffle_geometry {
  index channels;  // C of the output
  index h, w;      // the input's plane
  index r;
};
template <class T, bool Unshuffle>
struct pixel_shuffle_pass {
  const T* src;
  T* dst;
  pixel_shuffle_geometry g;
  DISTRIBUTE_HOST_DEVICE void operator()(index j) const {
    const index ow = g.w * g.r, oh_count = g.h * g.r;
    index rest = j;
    if constexpr (Unshuffle) {
      // j indexes the unshuffled layout [n, c * r * r + a * r + b, h, w]
      const index x = rest % g.w;
      rest /= g.w;
      const index y = rest % g.h;
      rest /= g.h;
      const index k = rest % (g.channels * g.r * g.r);
      const index n = rest / (g.channels * g.r * g.r);
      const index c = k / (g.r * g.r), a = (k / g.r) % g.r, b = k % g.r;
      dst[j] = src[((n * g.channels + c) * oh_count + y * g.r + a) * ow + x * g.r + b];
    } else {  // j indexes the shuffled layout [n, c, h * r + a, w * r + b]
      const index ox = rest % ow;
      rest /= ow;
      const index oy = rest % oh_count;
      rest /= oh_count;
      const index c = rest % g.channels, n = rest / g.channels;
      const index a = oy % g.r, b = ox % g.r;
      dst[j] = src[((n * g.channels + c) * g.r * g.r + a * g.r + b) * g.h * g.w + (oy / g.r) * g.w + ox / g.r];
    }
  }
};

}  // namespace distribute::nn::detail::kernels
