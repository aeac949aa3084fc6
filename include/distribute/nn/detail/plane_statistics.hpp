#pragma once
// The statistics the normalisations need, computed by the replica's engine over the planes of an
// NCHW tensor and brought to the host (they are small: one or two numbers a plane), and the
// per-plane or per-channel coefficients sent back for the element-wise passes.

#include <distribute/nn/detail/batch_stats.hpp>
#include <distribute/nn/detail/kernels.hpp>
#include <distribute/tensor/tensor.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace distribute::nn::detail {

// Moments (count, mean, M2) of each of `planes` planes of `plane` values: two passes, in index order.
template <class E, class T, class D>
std::vector<moments> plane_moments(E& e, const tensor<T, D>& x, std::int64_t planes, std::int64_t plane) {
  const auto n = static_cast<std::size_t>(planes);
  tensor<double, D> sums{shape{planes}, x.device()};
  std::vector<double> mean(n), m2(n);
  e.segmented_sum(planes, plane, kernels::value_of<T>{x.data(), plane}, sums.data());
  e.to_host(sums.data(), n, mean.data());
  for (auto& m : mean) m /= static_cast<double>(plane);
  const auto mean_on_device = tensor<double, D>::from_host(shape{planes}, std::span<const double>(mean), x.device());
  e.segmented_sum(planes, plane, kernels::squared_deviation<T>{x.data(), mean_on_device.data(), plane}, sums.data());
  e.to_host(sums.data(), n, m2.data());
  std::vector<moments> out(n);
  for (std::size_t s = 0; s < n; ++s) out[s] = {static_cast<double>(plane), mean[s], m2[s]};
  return out;
}

// Per plane: [sum dy | sum dy * xhat], 2 * planes values.
template <class E, class T, class D>
std::vector<double> plane_gradient_sums(E& e, const tensor<T, D>& dy, const tensor<T, D>& xhat, std::int64_t planes,
                                        std::int64_t plane) {
  const auto n = static_cast<std::size_t>(planes);
  tensor<double, D> sums{shape{planes}, dy.device()};
  std::vector<double> out(2 * n);
  e.segmented_sum(planes, plane, kernels::value_of<T>{dy.data(), plane}, sums.data());
  e.to_host(sums.data(), n, out.data());
  e.segmented_sum(planes, plane, kernels::product_of<T>{dy.data(), xhat.data(), plane}, sums.data());
  e.to_host(sums.data(), n, out.data() + n);
  return out;
}

// Host values on the device of `like`.
template <class V, class T, class D>
tensor<V, D> on_device_of(const tensor<T, D>& like, const std::vector<V>& values) {
  return tensor<V, D>::from_host(shape{static_cast<std::int64_t>(values.size())}, std::span<const V>(values), like.device());
}

}  // namespace distribute::nn::detail
