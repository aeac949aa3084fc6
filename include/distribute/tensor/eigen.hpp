#pragma once
// Zero-copy Eigen views of CPU tensors: row-major Matrix and vector maps, for GEMM and for
// element-wise and reduction expressions. Views alias the tensor's storage; they stay valid until the
// tensor is resized or destroyed. Rank-R TensorMaps are in tensor/eigen_tensor.hpp: Eigen's Tensor
// module adds ~45,000 preprocessed lines to every file that includes it, so it is opt-in.

#include <distribute/tensor/tensor.hpp>

#include <distribute/detail/eigen_core.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace distribute {

namespace detail {
inline void check_window(std::size_t size, std::int64_t count, std::int64_t offset) {
  if (count < 0 || offset < 0 || static_cast<std::size_t>(offset + count) > size)
    throw std::out_of_range("distribute: an Eigen view of " + std::to_string(count) + " elements at " +
                            std::to_string(offset) + " exceeds a tensor of " + std::to_string(size));
}
}  // namespace detail

template <class T>
using matrix_map = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <class T>
using const_matrix_map = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <class T>
using vector_map = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>;
template <class T>
using const_vector_map = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>>;

// `rows` x `cols` elements starting at `offset`, row-major: for NCHW, example n of a (N, C, H, W)
// tensor is the [C, H*W] matrix at offset n*C*H*W.
template <class T>
matrix_map<T> as_matrix(tensor<T, cpu>& t, std::int64_t rows, std::int64_t cols, std::int64_t offset = 0) {
  detail::check_window(t.size(), rows * cols, offset);
  return matrix_map<T>(t.data() + offset, rows, cols);
}
template <class T>
const_matrix_map<T> as_matrix(const tensor<T, cpu>& t, std::int64_t rows, std::int64_t cols, std::int64_t offset = 0) {
  detail::check_window(t.size(), rows * cols, offset);
  return const_matrix_map<T>(t.data() + offset, rows, cols);
}
template <class T>
vector_map<T> as_vector(tensor<T, cpu>& t) {
  return vector_map<T>(t.data(), static_cast<Eigen::Index>(t.size()));
}
template <class T>
const_vector_map<T> as_vector(const tensor<T, cpu>& t) {
  return const_vector_map<T>(t.data(), static_cast<Eigen::Index>(t.size()));
}

// Example n of an NCHW tensor as its [C, H*W] matrix.
template <class T>
matrix_map<T> example_matrix(tensor<T, cpu>& t, std::int64_t n) {
  const auto& s = t.shape();
  return as_matrix(t, s[1], s[2] * s[3], n * s[1] * s[2] * s[3]);
}
template <class T>
const_matrix_map<T> example_matrix(const tensor<T, cpu>& t, std::int64_t n) {
  const auto& s = t.shape();
  return as_matrix(t, s[1], s[2] * s[3], n * s[1] * s[2] * s[3]);
}

}  // namespace distribute
