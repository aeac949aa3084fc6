#pragma once
// The bias of a dense layer (nn/linear.hpp) over the rows of a [rows, length] matrix, and its gradient.
// Functors over raw pointers that any engine runs (nn/detail/kernels.hpp): each is called with an
// element index i, or a plane (segment) s and an index i within it.

#include <distribute/config.hpp>

#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

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

}  // namespace distribute::nn::detail::kernels
