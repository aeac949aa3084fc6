#pragma once
// A small Fashion-MNIST classifier that scores translations: conv3x3(16) relu, conv3x3/2(32) relu,
// conv3x3/2(64) relu, then a 7x7 convolution to 10 logits (a dense layer over the 7x7 map).
// Softmax cross-entropy is written here, by the loss rule of the library (sum over this replica's
// examples, divided by the global batch).

#include "models.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace cyclegan {

inline constexpr int classes = 10;

inline auto make_classifier(std::uint64_t seed) {
  using nn::conv2d;
  return nn::sequential{
      conv2d<float>{{.in_channels = 1, .out_channels = 16, .kernel = 3, .stride = 1, .padding = 1}, sub(seed, 1)},
      nn::relu<float>{},
      conv2d<float>{{.in_channels = 16, .out_channels = 32, .kernel = 3, .stride = 2, .padding = 1}, sub(seed, 2)},
      nn::relu<float>{},
      conv2d<float>{{.in_channels = 32, .out_channels = 64, .kernel = 3, .stride = 2, .padding = 1}, sub(seed, 3)},
      nn::relu<float>{},
      conv2d<float>{{.in_channels = 64, .out_channels = classes, .kernel = 7, .stride = 1, .padding = 0}, sub(seed, 4)}};
}
using classifier = decltype(make_classifier(0));

// This replica's share of the mean cross-entropy over the global batch, and its gradient.
inline nn::loss_result<float> softmax_cross_entropy(const tensor& logits, const std::vector<std::int32_t>& labels,
                                                     std::int64_t global_batch) {
  const std::int64_t n = logits.shape()[0];
  nn::loss_result<float> out{0.0f, tensor{logits.shape()}};
  std::vector<float> per(static_cast<std::size_t>(n));
  for (std::int64_t e = 0; e < n; ++e) {
    const float* z = logits.data() + e * classes;
    const float m = *std::max_element(z, z + classes);
    double sum = 0;
    for (int k = 0; k < classes; ++k) sum += std::exp(static_cast<double>(z[k] - m));
    const auto y = labels[static_cast<std::size_t>(e)];
    per[static_cast<std::size_t>(e)] = static_cast<float>(std::log(sum) - (z[y] - m));
    for (int k = 0; k < classes; ++k) {
      const double p = std::exp(static_cast<double>(z[k] - m)) / sum;
      out.grad[static_cast<std::size_t>(e * classes + k)] = static_cast<float>((p - (k == y ? 1.0 : 0.0)) / static_cast<double>(global_batch));
    }
  }
  out.value = nn::compute_average_loss(per, global_batch);
  return out;
}

// The predicted class of every example of `x` ([n, 1, 28, 28], values in [-1, 1]).
template <class R>
std::vector<std::int32_t> predict(R& r, classifier& c, const tensor& x) {
  const tensor logits = c.forward(r, x);
  std::vector<std::int32_t> out(static_cast<std::size_t>(x.shape()[0]));
  for (std::size_t e = 0; e < out.size(); ++e) {
    const float* z = logits.data() + e * classes;
    out[e] = static_cast<std::int32_t>(std::max_element(z, z + classes) - z);
  }
  return out;
}

}  // namespace cyclegan
