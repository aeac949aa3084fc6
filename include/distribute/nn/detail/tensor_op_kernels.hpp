#pragma once
// The element-wise arithmetic of the tensor operations (nn/tensor_ops.hpp), as functors any engine
// runs: the CPU engine in its loops, a GPU engine through Thrust (hence DISTRIBUTE_HOST_DEVICE and
// nothing from the standard library). Concatenation and splitting along the channels are gathers:
// each output element reads its one source, so every element is a work item of its own on a GPU and
// no two write the same place.

#include <distribute/config.hpp>

#include <cstdint>

namespace distribute::nn::detail::kernels {

// out[n, :] = [a[n, :] | b[n, :]] for each example n (a segment): `a_block` and `b_block` are one
// example's elements of a and b.
template <class T>
struct concat_blocks {
  const T* a;
  const T* b;
  T* out;
  std::int64_t a_block, b_block;
  DISTRIBUTE_HOST_DEVICE void operator()(std::int64_t n, std::int64_t i) const {
    out[n * (a_block + b_block) + i] = i < a_block ? a[n * a_block + i] : b[n * b_block + (i - a_block)];
  }
};
// out[n, :] = x[n, offset : offset + block] for each example n.
template <class T>
struct slice_block {
  const T* x;
  T* out;
  std::int64_t x_block, offset, block;
  DISTRIBUTE_HOST_DEVICE void operator()(std::int64_t n, std::int64_t i) const {
    out[n * block + i] = x[n * x_block + offset + i];
  }
};
// out = a + b.
template <class T>
struct sum_of {
  const T* a;
  const T* b;
  T* out;
  DISTRIBUTE_HOST_DEVICE void operator()(std::int64_t i) const { out[i] = a[i] + b[i]; }
};
// y += k x (BLAS's axpy).
template <class T>
struct axpy {
  T k;
  const T* x;
  T* y;
  DISTRIBUTE_HOST_DEVICE void operator()(std::int64_t i) const { y[i] += k * x[i]; }
};
// out = src.
template <class T>
struct copy {
  const T* src;
  T* out;
  DISTRIBUTE_HOST_DEVICE void operator()(std::int64_t i) const { out[i] = src[i]; }
};

}  // namespace distribute::nn::detail::kernels
