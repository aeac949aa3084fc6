#pragma once
// Sums over the planes of NCHW tensors and what is made of them: the statistics of the
// normalisation layers, per-channel gradients, a channel's bias.
// Functors over raw pointers that any engine runs (nn/detail/kernels.hpp): each is called with an
// element index i, or a plane (segment) s and an index i within it.

#include <distribute/config.hpp>

#include <cmath>
#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

// Epilogues of the engines' segmented sums (segmented_sum(segments, length, f, out, finish):
// out[s] = finish(s, sum)), where per-plane work after a sum would otherwise be a pass of its own:
// on a GPU a launch of one block for a few hundred values (nn/detail/plane_statistics.hpp runs them
// as that pass on an engine without epilogues, with the same bits).
//
// sum / k: plane sums into plane means.
struct divide_by {
  double k;
  DISTRIBUTE_HOST_DEVICE double operator()(index, double sum) const { return sum / k; }
};
// Per-plane work that rides on another epilogue: none.
struct no_plane_work {
  DISTRIBUTE_HOST_DEVICE void operator()(index) const {}
};
// 1 / sqrt(sum / count + eps): a plane's sum of squared deviations into its inverse standard
// deviation (biased variance); and `then(s)`, per-plane work that needs no sum (instance norm's
// per-plane scale and shift, norm_kernels.hpp's plane_affine).
template <class Then = no_plane_work>
struct inverse_std_of_squares {
  double count, eps;
  Then then{};
  DISTRIBUTE_HOST_DEVICE double operator()(index s, double sum) const {
    then(s);
    return 1.0 / std::sqrt(sum / count + eps);
  }
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
// values: the epilogue of the second sum (sum dy xhat, which it keeps), reading the first. `gamma`
// null: 1.
template <class T>
struct plane_gradient_coefficients {
  const T* gamma;
  const double* invstd;
  const double* sums;  // sum dy per plane, written by the sum before
  T* coef;
  index channels;
  double plane;
  DISTRIBUTE_HOST_DEVICE double operator()(index p, double sum_dy_xhat) const {
    const double g = gamma ? static_cast<double>(gamma[p % channels]) : 1.0;
    coef[3 * p] = static_cast<T>(g * invstd[p]);
    coef[3 * p + 1] = static_cast<T>(sums[p] / plane);
    coef[3 * p + 2] = static_cast<T>(sum_dy_xhat / plane);
    return sum_dy_xhat;
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

}  // namespace distribute::nn::detail::kernels
