#pragma once
// The element-wise arithmetic of the activations (nn/activations.hpp), forward and backward.
// Functors over raw pointers that any engine runs (nn/detail/kernels.hpp): each is called with an
// element index i, or a plane (segment) s and an index i within it.

#include <distribute/config.hpp>
#include <distribute/detail/select.hpp>

#include <cmath>
#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

template <class T>
struct relu_forward {
  const T* x;
  T* y;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const {
    const T v = x[i];
    y[i] = distribute::detail::select(v > T(0), v, T(0));
  }
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
    dx[i] = distribute::detail::select(x[i] > T(0), g, T(0));
  }
};
template <class T>
struct leaky_relu_forward {
  const T* x;
  T* y;
  T slope;
  // Both sides computed and selected (detail/select.hpp): a select of slope * x stays a branch per
  // element on CPUs without mask registers.
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const {
    const T v = x[i];
    y[i] = distribute::detail::select(v > T(0), v, slope * v);
  }
};
template <class T>
struct leaky_relu_backward {
  const T* x;
  const T* dy;
  T* dx;
  T slope;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const {
    const T g = dy[i];
    dx[i] = distribute::detail::select(x[i] > T(0), g, slope * g);
  }
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

}  // namespace distribute::nn::detail::kernels
