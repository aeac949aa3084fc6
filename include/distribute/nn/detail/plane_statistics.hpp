#pragma once
// The statistics the normalisations need, computed by the replica's engine over the planes of an
// NCHW tensor: brought to the host (they are small: one or two numbers a plane), with the per-plane
// or per-channel coefficients sent back for the element-wise passes; or, for instance norm, kept on
// the device throughout.

#include <distribute/nn/detail/batch_stats.hpp>
#include <distribute/nn/detail/plane_sum_kernels.hpp>
#include <distribute/tensor/tensor.hpp>

#include <cstdint>
#include <span>
#include <vector>

namespace distribute::nn::detail {

// Moments (count, mean, M2) of each of `planes` planes of `plane` values: two passes of the engine's
// segmented_sum (in double, in its fixed order).
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

// out[s] = finish(s, out[s]): an epilogue as a pass of its own, for engines without one.
template <class Finish>
struct finish_in_place {
  double* out;
  Finish finish;
  DISTRIBUTE_HOST_DEVICE void operator()(std::int64_t s) const { out[s] = finish(s, out[s]); }
};

// out[s] = finish(s, the sum over i of f(s, i)): the engine's segmented sum with its epilogue where
// it has one (every engine of the library: on a GPU it saves a launch), otherwise the sum and then
// the epilogue as a pass. The same bits either way.
template <class E, class F, class Finish>
void segmented_sum_then(E& e, std::int64_t segments, std::int64_t length, F f, double* out, Finish finish) {
  if constexpr (requires { e.segmented_sum(segments, length, f, out, finish); }) {
    e.segmented_sum(segments, length, f, out, finish);
  } else {
    e.segmented_sum(segments, length, f, out);
    e.for_each(segments, finish_in_place<Finish>{out, finish});
  }
}

// The same statistics kept on the device (no wait for it, and a pass a CUDA graph can capture):
// stats = [mean | inverse standard deviation] of each plane, 2 * planes values, with the bits of
// plane_moments' mean and 1 / sqrt(M2 / count + eps); `then(s)` runs for each plane with the second
// sum's epilogue (per-plane work that needs no launch of its own).
template <class E, class T, class D, class Then = kernels::no_plane_work>
void plane_normalization_statistics(E& e, const tensor<T, D>& x, std::int64_t planes, std::int64_t plane, double eps,
                                    tensor<double, D>& stats, Then then = {}) {
  double* mean = stats.data();
  double* invstd = stats.data() + planes;
  segmented_sum_then(e, planes, plane, kernels::value_of<T>{x.data(), plane}, mean,
                     kernels::divide_by{static_cast<double>(plane)});
  segmented_sum_then(e, planes, plane, kernels::squared_deviation<T>{x.data(), mean, plane}, invstd,
                     kernels::inverse_std_of_squares<Then>{static_cast<double>(plane), eps, then});
}

// Host values on the device of `like`.
template <class V, class T, class D>
tensor<V, D> on_device_of(const tensor<T, D>& like, const std::vector<V>& values) {
  return tensor<V, D>::from_host(shape{static_cast<std::int64_t>(values.size())}, std::span<const V>(values),
                                 like.device());
}

}  // namespace distribute::nn::detail
