#pragma once
// CycleGAN's residual block: y = x + IN(conv3x3(relu(IN(conv3x3(x))))), both convolutions with
// reflection padding 1 and a bias, instance norm without affine (the reference implementation's).
// backward: dx = dy + body.backward(dy).

#include <distribute/nn/activations.hpp>
#include <distribute/nn/conv2d.hpp>
#include <distribute/nn/instance_norm.hpp>
#include <distribute/nn/sequential.hpp>

#include <cstddef>
#include <cstdint>

namespace distribute::nn {

template <class T = float>
class residual_block {
  using body_type = sequential<conv2d<T>, instance_norm<T>, relu<T>, conv2d<T>, instance_norm<T>>;

 public:
  using scalar_type = T;

  residual_block(std::int64_t channels, std::uint64_t seed)
      : body_{conv2d<T>{conv_options(channels), detail::sub_seed(seed, 0)},
              instance_norm<T>{{.channels = channels}, detail::sub_seed(seed, 1)},
              relu<T>{},
              conv2d<T>{conv_options(channels), detail::sub_seed(seed, 2)},
              instance_norm<T>{{.channels = channels}, detail::sub_seed(seed, 3)}} {}

  body_type& body() noexcept { return body_; }

  template <class R>
  tensor<T> forward(R& r, const tensor<T>& x) {
    auto y = body_.forward(r, x);
    for (std::size_t i = 0; i < y.size(); ++i) y[i] += x[i];
    return y;
  }
  template <class R>
  tensor<T> backward(R& r, const tensor<T>& dy) {
    auto dx = body_.backward(r, dy);
    for (std::size_t i = 0; i < dx.size(); ++i) dx[i] += dy[i];
    return dx;
  }

  template <class F>
  void for_each_parameter(F&& f) { body_.for_each_parameter(f); }
  void zero_grad() { body_.zero_grad(); }
  void set_training(bool on) { body_.set_training(on); }
  std::uint64_t state_digest() const { return body_.state_digest(); }

 private:
  static conv2d_options conv_options(std::int64_t channels) {
    return {.in_channels = channels, .out_channels = channels, .kernel = 3, .stride = 1, .padding = 1,
            .pad_mode = padding_mode::reflect, .bias = true};
  }
  body_type body_;
};

}  // namespace distribute::nn
