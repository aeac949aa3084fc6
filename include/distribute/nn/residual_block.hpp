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

template <class T = float, device D = cpu>
class residual_block {
  using body_type = sequential<conv2d<T, D>, instance_norm<T, D>, relu<T, D>, conv2d<T, D>, instance_norm<T, D>>;

 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  using state_type = typename body_type::state_type;  // the body's (layer.hpp)

  residual_block(std::int64_t channels, std::uint64_t seed, const D& device = {})
      : body_{conv2d<T, D>{conv_options(channels), detail::sub_seed(seed, 0), device},
              instance_norm<T, D>{{.channels = channels}, detail::sub_seed(seed, 1), device}, relu<T, D>{},
              conv2d<T, D>{conv_options(channels), detail::sub_seed(seed, 2), device},
              instance_norm<T, D>{{.channels = channels}, detail::sub_seed(seed, 3), device}} {}

  body_type& body() noexcept { return body_; }

  // The skip connection is the body's plus_input: the add is done in the last norm's output pass,
  // and the ReLU in the first norm's (nn/sequential.hpp).
  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return body_.forward(r, x, plus_input);
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    return body_.forward(r, x, s, plus_input);
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return body_.backward(r, dy, plus_input);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    return body_.backward(r, s, dy, plus_input);
  }

  template <class F>
  void for_each_parameter(F&& f) {
    body_.for_each_parameter(f);
  }
  // The body's buffers (its instance norms hold none): the enumeration every model offers to
  // checkpoints, broadcast and verify_mirrored.
  template <class F>
  void for_each_buffer(F&& f) {
    body_.for_each_buffer(f);
  }
  void zero_grad() { body_.zero_grad(); }
  void set_training(bool on) { body_.set_training(on); }
  std::uint64_t state_digest() const { return body_.state_digest(); }

 private:
  static conv2d_options conv_options(std::int64_t channels) {
    return {.in_channels = channels,
            .out_channels = channels,
            .kernel = 3,
            .stride = 1,
            .padding = 1,
            .pad_mode = padding_mode::reflect,
            .bias = true};
  }
  body_type body_;
};

}  // namespace distribute::nn
