#pragma once
// The passes of nn::spectral_norm (nn/spectral_norm.hpp) over a weight seen as a [rows, columns]
// matrix: the power iteration's normalisation, the division by sigma and its gradient. Functors over
// raw pointers that any engine runs (nn/detail/kernels.hpp): each is called with an element index.
// Sums (squared norms, sigma = u . W v, <dW, W>) are the engine's segmented sums of
// kernels::product_of (plane_sum_kernels.hpp) over one segment.

#include <distribute/config.hpp>

#include <cmath>
#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

// v = v / max(||v||, eps), ||v||^2 in squared_norm[0] (PyTorch's F.normalize).
template <class T>
struct divide_by_norm {
  T* v;
  const double* squared_norm;
  double eps;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const {
    const double norm = std::sqrt(squared_norm[0]);
    v[i] = v[i] / static_cast<T>(norm > eps ? norm : eps);
  }
};
// normalized = weight / sigma, sigma rounded to T first (PyTorch divides by sigma in the weight's type).
template <class T>
struct divide_by_sigma {
  const T* weight;
  const double* sigma;
  T* normalized;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { normalized[i] = weight[i] / static_cast<T>(sigma[0]); }
};
// The gradient of W / sigma(W), sigma = u^T W v with u and v held constant:
// grad += (dWn - (<dWn, W> / sigma) u v^T) / sigma, <dWn, W> in dot[0].
template <class T>
struct spectral_norm_weight_gradient {
  const T* dwn;
  const T* u;
  const T* v;
  const double* sigma;
  const double* dot;
  T* grad;
  index columns;
  DISTRIBUTE_HOST_DEVICE void operator()(index j) const {
    const index r = j / columns, c = j - r * columns;
    const double s = static_cast<double>(static_cast<T>(sigma[0]));
    const double g =
        (static_cast<double>(dwn[j]) - dot[0] / s * static_cast<double>(u[r]) * static_cast<double>(v[c])) / s;
    grad[j] += static_cast<T>(g);
  }
};

}  // namespace distribute::nn::detail::kernels
