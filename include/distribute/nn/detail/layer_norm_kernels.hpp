#pragma once
// The passes of nn::layer_norm (nn/layer_norm.hpp): every group of the trailing `group` elements is a
// segment, normalised with its own mean and inverse standard deviation (computed as instance norm's
// per-plane statistics, nn/detail/plane_statistics.hpp), then scaled and shifted per element of the
// group. Functors over raw pointers that any engine runs (nn/detail/kernels.hpp): each is called with
// an element index i, or a segment s and an index i within it.

#include <distribute/config.hpp>

#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

// xhat = (x - mean) * invstd; y = weight[i] * xhat + bias[i] (weight, bias null: 1, 0).
template <class T>
struct layer_norm_output {
  const T* x;
  const double* mean;
  const double* invstd;
  const T* weight;
  const T* bias;
  T* xhat;
  T* y;
  index group;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index j = s * group + i;
    const T xh = static_cast<T>((static_cast<double>(x[j]) - mean[s]) * invstd[s]);
    xhat[j] = xh;
    T v = weight ? weight[i] * xh : xh;
    if (bias) v += bias[i];
    y[j] = v;
  }
};
// The gradient at xhat, g = dy * weight[i] (dy without a weight), and g * xhat: the terms of the
// per-segment sums of the input gradient.
template <class T>
struct layer_norm_xhat_gradient {
  const T* dy;
  const T* weight;
  index group;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    const double g = static_cast<double>(dy[s * group + i]);
    return weight ? g * static_cast<double>(weight[i]) : g;
  }
};
template <class T>
struct layer_norm_xhat_gradient_times_xhat {
  const T* dy;
  const T* weight;
  const T* xhat;
  index group;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    const index j = s * group + i;
    const double g = static_cast<double>(dy[j]);
    return (weight ? g * static_cast<double>(weight[i]) : g) * static_cast<double>(xhat[j]);
  }
};
// dx = invstd (g - mean(g) - xhat mean(g xhat)), from the segment sums [sum g | sum g xhat].
template <class T>
struct layer_norm_input_gradient {
  const T* dy;
  const T* weight;
  const T* xhat;
  const double* invstd;
  const double* sums;  // [sum g | sum g xhat], 2 * segments values
  T* dx;
  index segments, group;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index j = s * group + i;
    const double n = static_cast<double>(group);
    const double g = weight ? static_cast<double>(dy[j]) * static_cast<double>(weight[i]) : static_cast<double>(dy[j]);
    dx[j] = static_cast<T>(invstd[s] * (g - sums[s] / n - static_cast<double>(xhat[j]) * (sums[segments + s] / n)));
  }
};
// Element s of the group in row i of a [rows, group] matrix: dy * xhat (segmented sums over the rows
// give the weight's gradient; column_of gives the bias's).
template <class T>
struct column_product_of {
  const T* a;
  const T* b;
  index columns;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    const index j = i * columns + s;
    return static_cast<double>(a[j]) * static_cast<double>(b[j]);
  }
};

}  // namespace distribute::nn::detail::kernels
