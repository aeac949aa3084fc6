#pragma once
// The geometry of one dense matrix product, as every engine sees it: c [m, n] = op(a) op(b), or
// c += op(a) op(b) when `accumulate`. Every matrix is row-major and contiguous. op(a) is [m, k]:
// `a` itself, or, when `transpose_a`, the transpose of an `a` stored [k, m]; likewise op(b) is
// [k, n]: `b`, or the transpose of a `b` stored [n, k].
//
// A linear layer's three passes are such products: y = x W^T, dx = dy W and dW += dy^T x.

#include <cstdint>
#include <stdexcept>
#include <string>

namespace distribute {

struct gemm_geometry {
  std::int64_t m = 0, n = 0, k = 0;
  bool transpose_a = false;
  bool transpose_b = false;
  bool accumulate = false;

  std::int64_t a_size() const noexcept { return m * k; }
  std::int64_t b_size() const noexcept { return k * n; }
  std::int64_t c_size() const noexcept { return m * n; }
  // Multiply-adds, times two.
  double flops() const noexcept {
    return 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  }

  void check() const {
    if (m < 0 || n < 0 || k < 0)
      throw std::invalid_argument("distribute: invalid matrix product geometry " + to_string());
  }
  std::string to_string() const {
    return "[" + std::to_string(m) + "x" + std::to_string(k) + (transpose_a ? " (a transposed)" : "") + " times " +
           std::to_string(k) + "x" + std::to_string(n) + (transpose_b ? " (b transposed)" : "") +
           (accumulate ? ", added to c" : "") + "]";
  }
  friend bool operator==(const gemm_geometry&, const gemm_geometry&) = default;
};

}  // namespace distribute
