#pragma once
// Batch and instance normalisation (nn/batch_norm.hpp, nn/instance_norm.hpp): normalising with
// the statistics, the input gradient, and instance norm's passes with a ReLU or a residual fused.
// Functors over raw pointers that any engine runs (nn/detail/kernels.hpp): each is called with an
// element index i, or a plane (segment) s and an index i within it.

#include <distribute/config.hpp>
#include <distribute/detail/select.hpp>

#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

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
  // The gradient that reaches the norm's affine output: dy where the ReLU passed the value. dy is
  // read whatever the mask, and the mask is a select GCC vectorises on every x86 CPU
  // (detail/select.hpp), also inside the host's fixed-order sums (engine/serial.hpp).
  template <bool Relu>
  DISTRIBUTE_HOST_DEVICE T output_gradient(index s, index j, const T* dy) const {
    const T g = dy[j];
    if constexpr (Relu) return distribute::detail::select(affine(s, xhat[j]) > T(0), g, T(0));
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
    if constexpr (Relu) v = distribute::detail::select(v > T(0), v, T(0));
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
    return static_cast<double>(t.template output_gradient<Relu>(s, s * t.plane + i, dy));
  }
};
template <class T, bool Relu>
struct plane_norm_gradient_times_xhat {
  plane_norm_terms<T> t;
  const T* dy;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    const index j = s * t.plane + i;
    return static_cast<double>(t.template output_gradient<Relu>(s, j, dy)) * static_cast<double>(t.xhat[j]);
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

}  // namespace distribute::nn::detail::kernels
