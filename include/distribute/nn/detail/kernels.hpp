#pragma once
// The element-wise arithmetic of the layers and losses, as small functors over raw pointers that any
// engine can run: the CPU engine in its loops, a GPU engine in its kernels (hence
// DISTRIBUTE_HOST_DEVICE and nothing from the standard library but <cmath>). Each is called with an
// element index i, or a plane (segment) s and an index i within it.

#include <distribute/config.hpp>

#include <cmath>
#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

// --- activations ---------------------------------------------------------------------------------

template <class T>
struct relu_forward {
  const T* x;
  T* y;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { y[i] = x[i] > T(0) ? x[i] : T(0); }
};
template <class T>
struct relu_backward {
  const T* x;
  const T* dy;
  T* dx;
  // dy[i] is read whatever the sign (not only where it is kept), so that the loop vectorises: a
  // load under the condition stays a scalar branch per element (a 10x slower backward pass).
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const {
    const T g = dy[i];
    dx[i] = x[i] > T(0) ? g : T(0);
  }
};
template <class T>
struct leaky_relu_forward {
  const T* x;
  T* y;
  T slope;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { y[i] = x[i] > T(0) ? x[i] : slope * x[i]; }
};
template <class T>
struct leaky_relu_backward {
  const T* x;
  const T* dy;
  T* dx;
  T slope;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { dx[i] = x[i] > T(0) ? dy[i] : slope * dy[i]; }
};
template <class T>
struct tanh_forward {
  const T* x;
  T* y;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { y[i] = std::tanh(x[i]); }
};
template <class T>
struct tanh_backward {
  const T* y;
  const T* dy;
  T* dx;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { dx[i] = dy[i] * (T(1) - y[i] * y[i]); }
};

// --- sums and copies -------------------------------------------------------------------------------

// y[i] += x[i]
template <class T>
struct add_to {
  T* y;
  const T* x;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { y[i] += x[i]; }
};
// y[i] = k * x[i]
template <class T>
struct scale {
  const T* x;
  T* y;
  T k;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { y[i] = k * x[i]; }
};
// v[s] = v[s] / k: plane sums into plane means.
struct divide_by {
  double* v;
  double k;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const { v[s] = v[s] / k; }
};
// v[s] = 1 / sqrt(v[s] / count + eps): a plane's sum of squared deviations into its inverse standard
// deviation (biased variance).
struct inverse_std_of_squares {
  double* v;
  double count, eps;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const { v[s] = 1.0 / std::sqrt(v[s] / count + eps); }
};
// Per channel c: gamma_grad[c] += sum dy xhat, beta_grad[c] += sum dy over the planes of channel c, in
// plane (example) order, from the plane sums [sum dy | sum dy xhat] of `planes` planes: each example's
// share added to the gradient itself, so that gradients accumulated over parts of a batch have the
// bits of the whole.
template <class T>
struct add_plane_sums_per_channel {
  const double* sums;
  T* gamma_grad;
  T* beta_grad;
  index planes, channels;
  DISTRIBUTE_HOST_DEVICE void operator()(index c) const {
    T g = gamma_grad[c], b = beta_grad[c];
    for (index p = c; p < planes; p += channels) {
      g += static_cast<T>(sums[planes + p]);
      b += static_cast<T>(sums[p]);
    }
    gamma_grad[c] = g;
    beta_grad[c] = b;
  }
};
// Per channel c: grad[c] += the sum, in double and in example order, of the plane sums of channel c
// (a bias's gradient from the per-plane sums of dy).
template <class T>
struct add_channel_totals {
  const double* sums;
  T* grad;
  index examples, channels;
  DISTRIBUTE_HOST_DEVICE void operator()(index c) const {
    double total = 0;
    for (index n = 0; n < examples; ++n) total += sums[n * channels + c];
    grad[c] += static_cast<T>(total);
  }
};
// The coefficients of normalized_input_gradient per plane (statistics per plane): gamma * invstd,
// mean(dy), mean(dy xhat), from the plane sums [sum dy | sum dy xhat] of `planes` planes of `plane`
// values. `gamma` null: 1.
template <class T>
struct plane_gradient_coefficients {
  const T* gamma;
  const double* invstd;
  const double* sums;
  T* coef;
  index planes, channels;
  double plane;
  DISTRIBUTE_HOST_DEVICE void operator()(index p) const {
    const double g = gamma ? static_cast<double>(gamma[p % channels]) : 1.0;
    coef[3 * p] = static_cast<T>(g * invstd[p]);
    coef[3 * p + 1] = static_cast<T>(sums[p] / plane);
    coef[3 * p + 2] = static_cast<T>(sums[planes + p] / plane);
  }
};

// Plane s of an NCHW tensor of `channels` channels gets bias[s % channels].
template <class T>
struct add_channel_bias {
  T* y;
  const T* bias;
  index channels, plane;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const { y[s * plane + i] += bias[s % channels]; }
};
// The element itself (segmented sums of a tensor's planes).
template <class T>
struct value_of {
  const T* x;
  index plane;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const { return static_cast<double>(x[s * plane + i]); }
};
// (x - mean[s])^2
template <class T>
struct squared_deviation {
  const T* x;
  const double* mean;
  index plane;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    const double d = static_cast<double>(x[s * plane + i]) - mean[s];
    return d * d;
  }
};
// a * b
template <class T>
struct product_of {
  const T* a;
  const T* b;
  index plane;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    return static_cast<double>(a[s * plane + i]) * static_cast<double>(b[s * plane + i]);
  }
};

// --- dense layers --------------------------------------------------------------------------------------

// Row s of a [rows, length] matrix gets bias[i] added to its element i.
template <class T>
struct add_row_bias {
  T* y;
  const T* bias;
  index length;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const { y[s * length + i] += bias[i]; }
};
// Element i of column s of a [rows, columns] matrix (segmented sums of columns).
template <class T>
struct column_of {
  const T* x;
  index columns;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const { return static_cast<double>(x[i * columns + s]); }
};
// y[i] += sums[i], rounded to T.
template <class T>
struct add_sums {
  T* y;
  const double* sums;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { y[i] += static_cast<T>(sums[i]); }
};

// y[i] = a[i] * b[i]
template <class T>
struct multiply {
  const T* a;
  const T* b;
  T* y;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { y[i] = a[i] * b[i]; }
};

// --- dropout ---------------------------------------------------------------------------------------------

// splitmix64's output function: element i of a stream keyed by `key` is mix64(key + (i + 1) * golden),
// the (i + 1)-th output of splitmix64 seeded with `key`. Counter-based, so any engine draws element i
// alone and the same way.
DISTRIBUTE_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Element i is kept when its 53-bit uniform draw is at least `threshold` (rate * 2^53): mask[i] is
// then `scale` (1 / (1 - rate)), 0 otherwise; y = x * mask.
template <class T>
struct dropout_forward {
  const T* x;
  T* y;
  T* mask;
  std::uint64_t key, threshold;
  T scale;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const {
    const std::uint64_t draw = mix64(key + 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(i + 1)) >> 11;
    const T m = draw >= threshold ? scale : T(0);
    mask[i] = m;
    y[i] = x[i] * m;
  }
};

// --- average pooling -------------------------------------------------------------------------------------

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

// --- reflection padding ------------------------------------------------------------------------------

// Reflection ("mirror without repeating the edge", PyTorch ReflectionPad2d): padded index i in
// [-p, n+p) reads source index |i| for i < 0 and 2(n-1) - i for i >= n. Needs p < n.
DISTRIBUTE_HOST_DEVICE constexpr index reflect(index i, index n) noexcept {
  return i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i);
}
// Plane s of H x W into plane s of (H+2p) x (W+2p); one call per padded row (i: its index). The
// CPU's form of reflect_pad (below).
template <class T>
struct reflect_pad_rows {
  const T* x;
  T* y;
  index height, width, pad;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index ph = height + 2 * pad, pw = width + 2 * pad;
    const T* line = x + (s * height + reflect(i - pad, height)) * width;
    T* out = y + (s * ph + i) * pw;
    for (index j = 0; j < pad; ++j) out[j] = line[pad - j];
    for (index j = 0; j < width; ++j) out[pad + j] = line[j];
    for (index j = 0; j < pad; ++j) out[pad + width + j] = line[width - 2 - j];
  }
};
// The padded indices that reflect onto source index r of n (at most three: the mirror before the
// start, r itself, the mirror past the end), ascending, into `out`; returns how many.
DISTRIBUTE_HOST_DEVICE constexpr int reflected_from(index r, index n, index pad, index* out) noexcept {
  int k = 0;
  if (r >= 1 && r <= pad) out[k++] = pad - r;
  out[k++] = pad + r;
  if (r <= n - 2 && r >= n - 1 - pad) out[k++] = pad + 2 * (n - 1) - r;
  return k;
}
// The adjoint, one call per plane: every padded position's gradient goes to the source position it
// copied, in a fixed order. The CPU's form of reflect_pad_backward (below).
template <class T>
struct reflect_pad_backward_plane {
  const T* dy;
  T* dx;
  index height, width, pad;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const {
    const index ph = height + 2 * pad, pw = width + 2 * pad;
    T* plane = dx + s * height * width;
    for (index k = 0; k < height * width; ++k) plane[k] = T(0);
    // Row by row, and within a row the left border, the interior, the right border: j in increasing
    // order for every source position, as one loop over j with reflect() would add them, but with a
    // contiguous (vectorised) interior.
    for (index i = 0; i < ph; ++i) {
      T* line = plane + reflect(i - pad, height) * width;
      const T* in = dy + (s * ph + i) * pw;
      for (index j = 0; j < pad; ++j) line[pad - j] += in[j];
      for (index j = 0; j < width; ++j) line[j] += in[pad + j];
      for (index j = 0; j < pad; ++j) line[width - 2 - j] += in[pad + width + j];
    }
  }
};

// The passes the layers launch (engine::for_each_in_segments over planes x elements): one work item
// per element, so that a GPU runs them on as many threads as there are elements. A plane per work
// item, as the CPU wants it, ran one GPU thread per plane: the first H100 run spent 74% of a
// paper-size CycleGAN step in reflect_pad_backward_plane on one block of 256 threads. The CPU engine
// runs a plane at a time through whole_segment: the loops above, which vectorise, with the same bits.

// Element i of padded plane s copies its reflected source.
template <class T>
struct reflect_pad {
  const T* x;
  T* y;
  index height, width, pad;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index pw = width + 2 * pad, r = i / pw, c = i - r * pw;
    y[s * (height + 2 * pad) * pw + i] = x[(s * height + reflect(r - pad, height)) * width + reflect(c - pad, width)];
  }
  void whole_segment(index s) const {
    const reflect_pad_rows<T> rows{x, y, height, width, pad};
    for (index i = 0; i < height + 2 * pad; ++i) rows(s, i);
  }
};
// Element k of plane s of the input gradient gathers the (at most nine, usually one) padded
// positions that copied it, padded rows ascending and positions ascending within a row, onto a
// zero: the order in which reflect_pad_backward_plane adds them, so the bits are the same, and a
// gather needs no atomics.
template <class T>
struct reflect_pad_backward {
  const T* dy;
  T* dx;
  index height, width, pad;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index k) const {
    const index pw = width + 2 * pad, r = k / width, c = k - r * width;
    index rows[3], cols[3];
    const int nr = reflected_from(r, height, pad, rows), nc = reflected_from(c, width, pad, cols);
    const T* plane = dy + s * (height + 2 * pad) * pw;
    T sum = T(0);
    for (int a = 0; a < nr; ++a)
      for (int b = 0; b < nc; ++b) sum += plane[rows[a] * pw + cols[b]];
    dx[s * height * width + k] = sum;
  }
  void whole_segment(index s) const { reflect_pad_backward_plane<T>{dy, dx, height, width, pad}(s); }
};

// --- normalisation -------------------------------------------------------------------------------------

// Plane s (example e, channel c = s % channels) normalised with its statistics (mean, invstd indexed
// by `stat(s)`: the plane for instance norm, the channel for batch norm), then scaled and shifted:
// xhat = (x - mean) * invstd, y = gamma * xhat + beta (gamma, beta may be null: 1 and 0).
template <class T>
struct normalize {
  const T* x;
  T* y;
  T* xhat;
  const double* mean;
  const double* invstd;
  const T* gamma;
  const T* beta;
  index channels, plane;
  bool per_channel;  // statistics per channel (batch norm) or per plane (instance norm)
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index c = s % channels, k = per_channel ? c : s;
    const index j = s * plane + i;
    const T xh = static_cast<T>((static_cast<double>(x[j]) - mean[k]) * invstd[k]);
    xhat[j] = xh;
    y[j] = (gamma ? gamma[c] : T(1)) * xh + (beta ? beta[c] : T(0));
  }
};
// dx = k (dy - mean(dy) - xhat mean(dy xhat)), with k = gamma * invstd and the means over what the
// statistics ran over (coef[3*k + 0..2] = k, mean(dy), mean(dy xhat)).
template <class T>
struct normalized_input_gradient {
  const T* dy;
  const T* xhat;
  T* dx;
  const T* coef;
  index channels, plane;
  bool per_channel;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index k = per_channel ? s % channels : s;
    const index j = s * plane + i;
    dx[j] = coef[3 * k] * (dy[j] - coef[3 * k + 1] - xhat[j] * coef[3 * k + 2]);
  }
};

// Instance norm's passes with what follows the norm fused into them. Forward writes xhat and
// y = relu?(gamma * xhat + beta) + residual? in one pass where normalize, relu_forward and add_to took
// three; backward reads the ReLU's mask from gamma * xhat + beta, so one pass stands for
// relu_backward and the norm's own. Every value is the one the separate passes give: the
// expressions are theirs, in their order. Whether a ReLU or a residual is fused is a template
// argument: a run-time flag, or a load under a condition, in the loop kept GCC from vectorising
// the CPU's sums (a branch per element, 5-8x slower than the separate passes). (Recomputing xhat in
// backward instead of keeping it saves the forward a write but costs the backward's two sums the
// arithmetic, which lost on planes that fit in cache.)
template <class T>
struct plane_norm_terms {
  const T* xhat;
  const T* scale;  // per plane: gamma of its channel, or 1 (plane_affine)
  const T* shift;  // per plane: beta of its channel, or 0
  index plane;
  DISTRIBUTE_HOST_DEVICE T affine(index s, T xh) const { return scale[s] * xh + shift[s]; }
  // The gradient that reaches the norm's affine output: dy where the ReLU passed the value (dy is
  // read whatever the mask, so that the loop vectorises: relu_backward).
  template <bool Relu>
  DISTRIBUTE_HOST_DEVICE T output_gradient(index s, index j, const T* dy) const {
    const T g = dy[j];
    if constexpr (Relu) return affine(s, xhat[j]) > T(0) ? g : T(0);
    else return g;
  }
  // The same as a term of a sum: g times 1 or 0. Where the select gives +0 this gives -0 for a
  // negative g, which adds the same to a sum that starts at +0 (a sum of finite terms is -0 only
  // if every term is). GCC vectorises the fixed-order sum (engine/detail/serial.hpp) over a
  // product, not over a select, which it turns into a branch per element.
  template <bool Relu>
  DISTRIBUTE_HOST_DEVICE T output_gradient_term(index s, index j, const T* dy) const {
    const T g = dy[j];
    if constexpr (Relu) return g * static_cast<T>(affine(s, xhat[j]) > T(0));
    else return g;
  }
};
// The per-plane scale and shift of plane_norm_terms: gamma and beta of the plane's channel, or 1 and
// 0 (the values the separate passes multiplied and added, so the same bits).
template <class T>
struct plane_affine {
  const T* gamma;  // per channel, or null
  const T* beta;
  T* scale;
  T* shift;
  index channels;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const {
    const index c = s % channels;
    scale[s] = gamma ? gamma[c] : T(1);
    shift[s] = beta ? beta[c] : T(0);
  }
};
template <class T, bool Relu, bool Residual>
struct plane_norm_output {
  const T* x;
  const double* mean;  // per plane
  const double* invstd;
  const T* scale;
  const T* shift;
  T* xhat;
  T* y;
  const T* residual;  // added after the activation where Residual
  index plane;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index j = s * plane + i;
    const T xh = static_cast<T>((static_cast<double>(x[j]) - mean[s]) * invstd[s]);
    xhat[j] = xh;
    T v = scale[s] * xh + shift[s];
    if constexpr (Relu) v = v > T(0) ? v : T(0);
    if constexpr (Residual) v += residual[j];
    y[j] = v;
  }
};
// For the plane sums: the output gradient g, and g * xhat.
template <class T, bool Relu>
struct plane_norm_gradient {
  plane_norm_terms<T> t;
  const T* dy;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    return static_cast<double>(t.template output_gradient_term<Relu>(s, s * t.plane + i, dy));
  }
};
template <class T, bool Relu>
struct plane_norm_gradient_times_xhat {
  plane_norm_terms<T> t;
  const T* dy;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    const index j = s * t.plane + i;
    return static_cast<double>(t.template output_gradient_term<Relu>(s, j, dy)) * static_cast<double>(t.xhat[j]);
  }
};
// dx = k (g - mean(g) - xhat mean(g xhat)), coef as in normalized_input_gradient (per plane).
template <class T, bool Relu>
struct plane_norm_input_gradient {
  plane_norm_terms<T> t;
  const T* dy;
  const T* coef;
  T* dx;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index j = s * t.plane + i;
    dx[j] = coef[3 * s] * (t.template output_gradient<Relu>(s, j, dy) - coef[3 * s + 1] - t.xhat[j] * coef[3 * s + 2]);
  }
};

// --- losses ----------------------------------------------------------------------------------------------

// Per example s of `per` elements: the loss's per-element value (for the segmented sum) and its
// gradient d/dpred written alongside, scaled by `scale` (1 / (per * global batch)). `Loss` gives
// value(d) and derivative(d) of the difference d = pred - target.
template <class T, class Loss>
struct elementwise_loss {
  const T* pred;
  const T* target;
  T* grad;
  double scale;
  index per;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    const index j = s * per + i;
    const double d = static_cast<double>(pred[j]) - static_cast<double>(target[j]);
    grad[j] = static_cast<T>(Loss::derivative(d) * scale);
    return Loss::value(d);
  }
};
struct squared {
  DISTRIBUTE_HOST_DEVICE static double value(double d) { return d * d; }
  DISTRIBUTE_HOST_DEVICE static double derivative(double d) { return 2 * d; }
};
// The derivative at 0 is 0.
struct absolute {
  DISTRIBUTE_HOST_DEVICE static double value(double d) { return d < 0 ? -d : d; }
  DISTRIBUTE_HOST_DEVICE static double derivative(double d) { return d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0); }
};
template <class T>
using squared_error = elementwise_loss<T, squared>;
template <class T>
using absolute_error = elementwise_loss<T, absolute>;

// Binary cross-entropy of a logit x and a target t, per element, in the form that neither overflows
// nor loses the small terms: max(x, 0) - x t + log1p(exp(-|x|)); its derivative sigmoid(x) - t
// (scaled like elementwise_loss's).
template <class T>
struct sigmoid_cross_entropy {
  const T* pred;
  const T* target;
  T* grad;
  double scale;
  index per;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    const index j = s * per + i;
    const double x = static_cast<double>(pred[j]), t = static_cast<double>(target[j]);
    const double e = std::exp(x < 0 ? x : -x);  // exp(-|x|), in (0, 1]
    const double sigmoid = x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
    grad[j] = static_cast<T>((sigmoid - t) * scale);
    return (x > 0 ? x : 0.0) - x * t + std::log1p(e);
  }
};

// Softmax cross-entropy over the rows of [rows, length] logits, in three passes: each row's maximum
// (`row_max`), the sum of exp(x - max) (`shifted_exp`, a segmented sum), then the value and the
// gradient. Everything past the logits is in double.
template <class T>
struct row_max {
  const T* x;
  double* max;
  index length;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const {
    const T* row = x + s * length;
    double m = length > 0 ? static_cast<double>(row[0]) : 0.0;
    for (index i = 1; i < length; ++i)
      if (static_cast<double>(row[i]) > m) m = static_cast<double>(row[i]);
    max[s] = m;
  }
};
template <class T>
struct shifted_exp {
  const T* x;
  const double* shift;
  index length;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    return std::exp(static_cast<double>(x[s * length + i]) - shift[s]);
  }
};
// Row s's loss: log(sum exp(x - max)) - (x[label] - max), the log-sum-exp less the label's logit.
template <class T>
struct softmax_cross_entropy_value {
  const T* x;
  const std::int32_t* labels;
  const double* shift;
  const double* denominator;
  double* loss;
  index length;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const {
    loss[s] = std::log(denominator[s]) - (static_cast<double>(x[s * length + labels[s]]) - shift[s]);
  }
};
// Element j (row j / length): (softmax - one_hot(label)) * scale.
template <class T>
struct softmax_cross_entropy_gradient {
  const T* x;
  const std::int32_t* labels;
  const double* shift;
  const double* denominator;
  T* grad;
  double scale;
  index length;
  DISTRIBUTE_HOST_DEVICE void operator()(index j) const {
    const index s = j / length, i = j - s * length;
    const double p = std::exp(static_cast<double>(x[j]) - shift[s]) / denominator[s];
    grad[j] = static_cast<T>((p - (i == labels[s] ? 1.0 : 0.0)) * scale);
  }
};
// The index of row s's largest element; the first of equal ones (torch.argmax's choice).
template <class T>
struct row_argmax {
  const T* x;
  std::int32_t* argmax;
  index length;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const {
    const T* row = x + s * length;
    index best = 0;
    for (index i = 1; i < length; ++i)
      if (row[i] > row[best]) best = i;
    argmax[s] = static_cast<std::int32_t>(best);
  }
};

// --- optimisers ----------------------------------------------------------------------------------------

// Adam, PyTorch's form: weight decay added to the gradient, then the moments and the step.
template <class T>
struct adam_update {
  T* p;
  const T* g;
  T* m;
  T* v;
  T b1, b2, wd, step_size, sqrt_bc2, eps;
  // Where the step's scalars live on the device (a capturable optimiser, step_scalars below): the
  // step size and sqrt(1 - b2^t) are then read there instead of from the two members above.
  const double* scalars = nullptr;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const {
    const T size = scalars ? static_cast<T>(scalars[2]) : step_size;
    const T bc2 = scalars ? static_cast<T>(scalars[3]) : sqrt_bc2;
    const T gi = g[i] + wd * p[i];
    m[i] = b1 * m[i] + (T(1) - b1) * gi;
    v[i] = b2 * v[i] + (T(1) - b2) * gi * gi;
    p[i] -= size * m[i] / (std::sqrt(v[i]) / bc2 + eps);
  }
};
// SGD with momentum, PyTorch's form.
template <class T>
struct sgd_update {
  T* p;
  const T* g;
  T* v;
  T lr, mu, wd;
  const double* scalars = nullptr;  // a capturable optimiser's: the learning rate is scalars[1]
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const {
    const T rate = scalars ? static_cast<T>(scalars[1]) : lr;
    const T gi = g[i] + wd * p[i];
    v[i] = mu * v[i] + gi;
    p[i] -= rate * v[i];
  }
};
// A loss's value from its per-example sums (n examples of `per` elements), as the host computes it
// (nn::compute_average_loss): each example's mean rounded to T, summed in index order in double,
// divided by the global batch size. One call (i = 0): n is a batch.
template <class T>
struct average_of_example_means {
  const double* sums;
  T* out;
  index n, per, global_batch_size;
  DISTRIBUTE_HOST_DEVICE void operator()(index) const {
    double s = 0;
    for (index e = 0; e < n; ++e) s += static_cast<double>(static_cast<T>(sums[e] / static_cast<double>(per)));
    *out = static_cast<T>(s / static_cast<double>(global_batch_size));
  }
};

// The per-step scalars of a capturable optimiser, s = {steps taken t, learning rate, and two of the
// optimiser's own}, advanced by one step on the device (one call, i = 0), so that a step captured
// into a CUDA graph counts its replays. Adam's are its bias corrections, with the host's arithmetic:
// s[2] = lr / (1 - b1^t), s[3] = sqrt(1 - b2^t).
struct count_step {
  double* s;
  DISTRIBUTE_HOST_DEVICE void operator()(index) const { s[0] += 1.0; }
};
struct adam_step_scalars {
  double* s;
  double b1, b2;
  DISTRIBUTE_HOST_DEVICE void operator()(index) const {
    const double t = s[0] + 1.0;
    s[0] = t;
    s[2] = s[1] / (1 - std::pow(b1, t));
    s[3] = std::sqrt(1 - std::pow(b2, t));
  }
};

}  // namespace distribute::nn::detail::kernels
