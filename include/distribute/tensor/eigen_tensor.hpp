#pragma once
// The whole CPU tensor as a rank-R Eigen TensorMap, for element-wise and reduction expressions over
// named axes. Not included by <distribute/nn.hpp> or the umbrella header: Eigen's Tensor module is
// ~45,000 preprocessed lines (and <random>) in every file that includes it. The view aliases the
// tensor's storage and stays valid until the tensor is resized or destroyed.

#include <distribute/tensor/eigen.hpp>

#include <unsupported/Eigen/CXX11/Tensor>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace distribute {

// The whole tensor as a rank-R Eigen TensorMap (row-major, so that indices read like the shape).
template <int R, class T>
Eigen::TensorMap<Eigen::Tensor<T, R, Eigen::RowMajor>> as_eigen_tensor(tensor<T, cpu>& t) {
  if (t.shape().rank() != static_cast<std::size_t>(R))
    throw std::invalid_argument("distribute: as_eigen_tensor<" + std::to_string(R) + "> of a rank-" +
                                std::to_string(t.shape().rank()) + " tensor");
  Eigen::array<Eigen::Index, R> dims;
  for (int i = 0; i < R; ++i) dims[static_cast<std::size_t>(i)] = t.shape()[static_cast<std::size_t>(i)];
  return Eigen::TensorMap<Eigen::Tensor<T, R, Eigen::RowMajor>>(t.data(), dims);
}
template <int R, class T>
Eigen::TensorMap<Eigen::Tensor<const T, R, Eigen::RowMajor>> as_eigen_tensor(const tensor<T, cpu>& t) {
  if (t.shape().rank() != static_cast<std::size_t>(R))
    throw std::invalid_argument("distribute: as_eigen_tensor<" + std::to_string(R) + "> of a rank-" +
                                std::to_string(t.shape().rank()) + " tensor");
  Eigen::array<Eigen::Index, R> dims;
  for (int i = 0; i < R; ++i) dims[static_cast<std::size_t>(i)] = t.shape()[static_cast<std::size_t>(i)];
  return Eigen::TensorMap<Eigen::Tensor<const T, R, Eigen::RowMajor>>(t.data(), dims);
}

}  // namespace distribute
