#pragma once
// Element-wise arithmetic over whole buffers (y += x, y = k x, y = a b), shared by the layers and
// the optimisers, as functors over raw pointers that any engine runs: the CPU engine in its loops, a
// GPU engine in its kernels (hence DISTRIBUTE_HOST_DEVICE). Each is called with an element index i.

#include <distribute/config.hpp>

#include <cstdint>

namespace distribute::detail::kernels {

using index = std::int64_t;

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
// y[i] = a[i] * b[i]
template <class T>
struct multiply {
  const T* a;
  const T* b;
  T* y;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const { y[i] = a[i] * b[i]; }
};

}  // namespace distribute::detail::kernels
