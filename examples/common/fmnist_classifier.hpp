#pragma once
// The small Fashion-MNIST classifier that scores the examples' generated images, built from the
// library's layers:
//   conv3x3(16) batch-norm relu avg-pool/2   28 -> 14
//   conv3x3(32) batch-norm relu avg-pool/2   14 -> 7
//   conv3x3(64) batch-norm relu               7 -> 7
//   flatten, dense 128 relu, dropout 0.1, dense 10 (the logits of nn::softmax_cross_entropy)
// The convolutions that a batch norm follows have no bias (the norm's shift replaces it).
//
// examples/cyclegan's fmnist_classifier trains it and saves it as a checkpoint (the model under the
// name "classifier"); cyclegan_train and conditional_gan load that file into make_classifier(0) and
// score with predict. One definition for all of them, so that a checkpoint loads into each.

#include <distribute/nn.hpp>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace fmnist {

namespace dist = distribute;
namespace nn = distribute::nn;

inline constexpr int classes = 10;

// The widths; a checkpoint holds the tensors of one shape, so its readers load the defaults.
struct classifier_shape {
  std::int64_t conv1 = 16, conv2 = 32, conv3 = 64, hidden = 128;
  double dropout = 0.1;
};

// On any device: the weights are drawn on the host from `seed` whatever the device.
template <class D = dist::cpu>
auto make_classifier(std::uint64_t seed, const classifier_shape& sh = {}, const D& device = {}) {
  using conv2d = nn::conv2d<float, D>;
  using batch_norm = nn::batch_norm<float, D>;
  using relu = nn::relu<float, D>;
  using avg_pool2d = nn::avg_pool2d<float, D>;
  using linear = nn::linear<float, D>;
  const auto sub = [seed](std::uint64_t i) { return nn::detail::sub_seed(seed, i); };
  return nn::sequential{
      conv2d{{.in_channels = 1, .out_channels = sh.conv1, .kernel = 3, .padding = 1, .bias = false}, sub(1), device},
      batch_norm{{.channels = sh.conv1}, sub(2), device},
      relu{},
      avg_pool2d{{.kernel = 2}},
      conv2d{{.in_channels = sh.conv1, .out_channels = sh.conv2, .kernel = 3, .padding = 1, .bias = false},
             sub(3),
             device},
      batch_norm{{.channels = sh.conv2}, sub(4), device},
      relu{},
      avg_pool2d{{.kernel = 2}},
      conv2d{{.in_channels = sh.conv2, .out_channels = sh.conv3, .kernel = 3, .padding = 1, .bias = false},
             sub(8),
             device},
      batch_norm{{.channels = sh.conv3}, sub(9), device},
      relu{},
      nn::flatten<float, D>{},
      linear{{.in_features = sh.conv3 * 7 * 7, .out_features = sh.hidden}, sub(5), device},
      relu{},
      nn::dropout<float, D>{{.rate = sh.dropout}, sub(6)},
      linear{{.in_features = sh.hidden, .out_features = classes}, sub(7), device}};
}
template <class D = dist::cpu>
using classifier_on = decltype(make_classifier<D>(0));
using classifier = classifier_on<dist::cpu>;

// The predicted class of every example of `x` ([n, 1, 28, 28], values in [-1, 1]), in evaluation
// mode (batch norm's running statistics, no dropout). On any device: the logits come to the host.
template <class R, class C, class T>
std::vector<std::int32_t> predict(R& r, C& c, const T& x) {
  c.set_training(false);
  const auto logits = c.forward(r, x);
  std::vector<float> z_all;
  if constexpr (std::is_same_v<std::remove_cvref_t<decltype(logits)>, dist::tensor<float>>)
    z_all.assign(logits.begin(), logits.end());
  else z_all = logits.to_vector();
  std::vector<std::int32_t> out(static_cast<std::size_t>(x.shape()[0]));
  for (std::size_t e = 0; e < out.size(); ++e) {
    const float* z = z_all.data() + e * classes;
    out[e] = static_cast<std::int32_t>(std::max_element(z, z + classes) - z);
  }
  return out;
}

}  // namespace fmnist
