#pragma once
// The optimisers' updates (optim/sgd.hpp, optim/adam.hpp) and the per-step scalars of a capturable
// optimiser, as functors over raw pointers that any engine runs: the CPU engine in its loops, a GPU
// engine in its kernels (hence DISTRIBUTE_HOST_DEVICE and nothing from the standard library but
// <cmath>). Each is called with an element index i.

#include <distribute/config.hpp>

#include <cmath>
#include <cstdint>

namespace distribute::optim::detail::kernels {

using index = std::int64_t;

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

}  // namespace distribute::optim::detail::kernels
