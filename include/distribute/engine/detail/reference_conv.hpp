#pragma once
// The portable convolution: im2col of one example and one Eigen GEMM, per example. It is the
// fallback where no faster library is built in, and the reference the tests hold the fast engines
// to. Per example, so an example's output has the same bits under any split of the batch. Each GEMM
// runs in the parts gemm_parts gives for the engine's configured thread count `parts_for` on up to
// `threads` threads (eigen_gemm.hpp): the bits do not depend on `threads`.

#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/detail/eigen_gemm.hpp>

// On the fast path (DISTRIBUTE_PRECOMPILED) the members are only declared: their float and double
// instantiations come from the precompiled unit, and Eigen is not parsed.
#if !defined(DISTRIBUTE_PRECOMPILED) || defined(DISTRIBUTE_PRECOMPILED_UNIT)
#  define DISTRIBUTE_REFERENCE_CONV_DEFINED 1
#  include <distribute/detail/eigen_core.hpp>
#endif

#include <cstdint>
#include <vector>

namespace distribute::detail {

// im2col of one example: col has C*k*k rows, row (c*k + ki)*k + kj, and Ho*Wo columns.
template <class T>
void im2col(const T* src, const conv_geometry& g, T* col) {
  const std::int64_t plane = g.out_height * g.out_width;
  for (std::int64_t c = 0; c < g.in_channels; ++c)
    for (std::int64_t ki = 0; ki < g.kernel; ++ki)
      for (std::int64_t kj = 0; kj < g.kernel; ++kj) {
        T* row = col + ((c * g.kernel + ki) * g.kernel + kj) * plane;
        const T* in = src + c * g.in_height * g.in_width;
        for (std::int64_t oh = 0; oh < g.out_height; ++oh) {
          const std::int64_t ih = oh * g.stride - g.pad + ki;
          T* out = row + oh * g.out_width;
          if (ih < 0 || ih >= g.in_height) {
            for (std::int64_t ow = 0; ow < g.out_width; ++ow) out[ow] = T(0);
            continue;
          }
          const T* line = in + ih * g.in_width;
          for (std::int64_t ow = 0; ow < g.out_width; ++ow) {
            const std::int64_t iw = ow * g.stride - g.pad + kj;
            out[ow] = (iw >= 0 && iw < g.in_width) ? line[iw] : T(0);
          }
        }
      }
}

// The adjoint of im2col: adds every column entry back onto the input position it was read from.
template <class T>
void col2im_add(const T* col, const conv_geometry& g, T* dst) {
  const std::int64_t plane = g.out_height * g.out_width;
  for (std::int64_t c = 0; c < g.in_channels; ++c)
    for (std::int64_t ki = 0; ki < g.kernel; ++ki)
      for (std::int64_t kj = 0; kj < g.kernel; ++kj) {
        const T* row = col + ((c * g.kernel + ki) * g.kernel + kj) * plane;
        T* out = dst + c * g.in_height * g.in_width;
        for (std::int64_t oh = 0; oh < g.out_height; ++oh) {
          const std::int64_t ih = oh * g.stride - g.pad + ki;
          if (ih < 0 || ih >= g.in_height) continue;
          T* line = out + ih * g.in_width;
          const T* in = row + oh * g.out_width;
          for (std::int64_t ow = 0; ow < g.out_width; ++ow) {
            const std::int64_t iw = ow * g.stride - g.pad + kj;
            if (iw >= 0 && iw < g.in_width) line[iw] += in[ow];
          }
        }
      }
}

template <class T>
class reference_conv {
 public:
  // `col` is scratch of at least col_size(g) elements.
  static std::int64_t col_size(const conv_geometry& g) noexcept {
    return g.in_channels * g.kernel * g.kernel * g.out_height * g.out_width;
  }

  // Defined below the class, not inline: a program built with the precompiled unit
  // (DISTRIBUTE_PRECOMPILED) takes the float and double instantiations from it.
  static void forward(const conv_geometry& g, const T* x, const T* w, const T* bias, T* y, T* colbuf, int parts_for = 1,
                      int threads = 1);
  static void backward_data(const conv_geometry& g, const T* dy, const T* w, T* dx, T* colbuf, int parts_for = 1,
                            int threads = 1);
  static void backward_weights(const conv_geometry& g, const T* x, const T* dy, T* dw, T* db, T* colbuf,
                               int parts_for = 1, int threads = 1);
};

#if defined(DISTRIBUTE_REFERENCE_CONV_DEFINED)
template <class T>
using reference_matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
void reference_conv<T>::forward(const conv_geometry& g, const T* x, const T* w, const T* bias, T* y, T* colbuf,
                                int parts_for, int threads) {
  const std::int64_t rows = g.in_channels * g.kernel * g.kernel, plane = g.out_height * g.out_width;
  const gemm_geometry product{.m = g.out_channels, .n = plane, .k = rows};
  const int parts = gemm_parts(product, parts_for);
  for (std::int64_t n = 0; n < g.batch; ++n) {
    im2col(x + n * g.in_channels * g.in_height * g.in_width, g, colbuf);
    T* yn = y + n * g.out_channels * plane;
    gemm_in_parts(product, w, static_cast<const T*>(colbuf), yn, parts, threads);
    if (bias)
      Eigen::Map<reference_matrix<T>>(yn, g.out_channels, plane).colwise() +=
          Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>(bias, g.out_channels);
  }
}

template <class T>
void reference_conv<T>::backward_data(const conv_geometry& g, const T* dy, const T* w, T* dx, T* colbuf, int parts_for,
                                      int threads) {
  const std::int64_t rows = g.in_channels * g.kernel * g.kernel, plane = g.out_height * g.out_width;
  const std::int64_t in_size = g.in_channels * g.in_height * g.in_width;
  const gemm_geometry product{.m = rows, .n = plane, .k = g.out_channels, .transpose_a = true};
  const int parts = gemm_parts(product, parts_for);
  for (std::int64_t i = 0; i < g.batch * in_size; ++i) dx[i] = T(0);
  for (std::int64_t n = 0; n < g.batch; ++n) {
    gemm_in_parts(product, w, dy + n * g.out_channels * plane, colbuf, parts, threads);
    col2im_add(colbuf, g, dx + n * in_size);
  }
}

template <class T>
void reference_conv<T>::backward_weights(const conv_geometry& g, const T* x, const T* dy, T* dw, T* db, T* colbuf,
                                         int parts_for, int threads) {
  const std::int64_t rows = g.in_channels * g.kernel * g.kernel, plane = g.out_height * g.out_width;
  const gemm_geometry product{.m = g.out_channels, .n = rows, .k = plane, .transpose_b = true, .accumulate = true};
  const int parts = gemm_parts(product, parts_for);
  for (std::int64_t n = 0; n < g.batch; ++n) {
    im2col(x + n * g.in_channels * g.in_height * g.in_width, g, colbuf);
    gemm_in_parts(product, dy + n * g.out_channels * plane, static_cast<const T*>(colbuf), dw, parts, threads);
    // The bias gradient in index order: Eigen's vectorised sum starts where the data is aligned, so
    // its bits would depend on where the batch happens to lie in memory.
    if (db)
      for (std::int64_t c = 0; c < g.out_channels; ++c) {
        const T* row = dy + (n * g.out_channels + c) * plane;
        T s = T(0);
        for (std::int64_t i = 0; i < plane; ++i) s += row[i];
        db[c] += s;
      }
  }
}

#endif  // DISTRIBUTE_REFERENCE_CONV_DEFINED

#if defined(DISTRIBUTE_PRECOMPILED)
extern template class reference_conv<float>;
extern template class reference_conv<double>;
#endif

}  // namespace distribute::detail
