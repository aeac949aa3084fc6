#pragma once
// Transposed 2-D convolution, the adjoint of conv2d: its forward is a convolution's data gradient,
// its data gradient that convolution's forward, both computed by the replica's engine. CycleGAN's
// u128/u64 up-sampling (k 3, stride 2, padding 1, output_padding 1) doubles H and W.
//
// Output size: Ho = (H - 1)*s - 2p + k + output_padding (likewise Wo), with output_padding < stride:
// the definition of PyTorch's ConvTranspose2d. Weights are [Cin, Cout, k, k] (PyTorch's order).

#include <distribute/engine/conv_geometry.hpp>
#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/detail/plane_sum_kernels.hpp>
#include <distribute/nn/detail/weight_and_bias.hpp>
#include <distribute/nn/layer.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute::nn {

// Defaults: PyTorch's ConvTranspose2d's (stride 1, padding 0, output_padding 0, a bias), so that
// `ConvTranspose2d(c, c2, 4, 2, 1)` written as {.kernel = 4, .stride = 2, .padding = 1} gives the same
// sizes; the kernel, which PyTorch requires, is 3 here.
struct conv_transpose2d_options {
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 1;
  std::int64_t kernel = 3;
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  std::int64_t output_padding = 0;
  bool bias = true;
};

namespace detail {
inline std::string describe(const conv_transpose2d_options& o) {
  return "{in_channels " + std::to_string(o.in_channels) + ", out_channels " + std::to_string(o.out_channels) +
         ", kernel " + std::to_string(o.kernel) + ", stride " + std::to_string(o.stride) + ", padding " +
         std::to_string(o.padding) + ", output_padding " + std::to_string(o.output_padding) + "}";
}
}  // namespace detail

template <class T = float, device D = cpu>
class conv_transpose2d : public detail::optional_input_gradient<conv_transpose2d<T, D>>,
                         public detail::weight_and_bias<T, D> {
  using weights = detail::weight_and_bias<T, D>;
  using weights::bias_;
  using weights::weight_;

 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  // What a forward keeps for its backward (layer.hpp): the input.
  struct state_type {
    detail::state_stamp stamp;
    tensor_type input;
  };
  static constexpr const char* layer_name = "conv_transpose2d";

  conv_transpose2d(conv_transpose2d_options o, std::uint64_t seed, const D& device = {})
      : weights{weight_shape(check(o)), o.bias ? o.out_channels : 0, seed, device}, o_{o}, device_{device} {}

  const conv_transpose2d_options& options() const noexcept { return o_; }

  shape output_shape(const shape& in) const {
    if (in.rank() != 4 || in.c() != o_.in_channels)
      throw std::invalid_argument("distribute: conv_transpose2d " + detail::describe(o_) + " got a tensor of shape " +
                                  in.to_string());
    const std::int64_t h = (in.h() - 1) * o_.stride - 2 * o_.padding + o_.kernel + o_.output_padding;
    const std::int64_t w = (in.w() - 1) * o_.stride - 2 * o_.padding + o_.kernel + o_.output_padding;
    if (h < 1 || w < 1)
      throw std::invalid_argument("distribute: conv_transpose2d " + detail::describe(o_) +
                                  ": output would be empty for " + in.to_string());
    return shape::nchw(in.n(), o_.out_channels, h, w);
  }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    auto& e = detail::engine_of<D>(r);
    const shape out = output_shape(x.shape());
    s.input = x;
    tensor_type y{out, device_, uninitialized};
    e.conv_backward_data(geometry(x.shape(), out), x.data(), weight_.value.data(), y.data());
    if (o_.bias)
      e.for_each_in_segments(
          out.n() * out.c(), out.h() * out.w(),
          detail::kernels::add_channel_bias<T>{y.data(), bias_.value.data(), out.c(), out.h() * out.w()});
    kept_.stamp(s, this);
    return y;
  }

  // backward(r, dy), backward(r, state, dy) and their no_input_gradient forms: detail::optional_input_gradient;
  // weight(), bias(), for_each_parameter, zero_grad, set_training: detail::weight_and_bias.

 private:
  friend class detail::optional_input_gradient<conv_transpose2d>;
  template <class R>
  tensor_type backward_pass(R& r, state_type& s, const tensor_type& dy, bool input_gradient) {
    detail::claim(r, s.stamp, this, layer_name);
    auto& e = detail::engine_of<D>(r);
    const tensor_type& input_ = s.input;
    const shape out = output_shape(input_.shape());
    if (dy.shape() != out)
      throw std::invalid_argument("distribute: conv_transpose2d " + detail::describe(o_) +
                                  " backward got dy of shape " + dy.shape().to_string() + ", expected " +
                                  out.to_string());
    const conv_geometry g = geometry(input_.shape(), out);
    // Seen from the output, dy is the convolution's input and x its output's gradient.
    e.conv_backward_weights(g, dy.data(), input_.data(), weight_.grad.data(), static_cast<T*>(nullptr));
    if (o_.bias) add_bias_gradient(e, dy);
    if (!input_gradient) return tensor_type{};
    tensor_type dx{input_.shape(), device_, uninitialized};
    e.conv_forward(g, dy.data(), weight_.value.data(), static_cast<const T*>(nullptr), dx.data());
    return dx;
  }

  static shape weight_shape(const conv_transpose2d_options& o) {
    return shape{o.in_channels, o.out_channels, o.kernel, o.kernel};
  }
  static conv_transpose2d_options check(conv_transpose2d_options o) {
    const conv_transpose2d_options d{};
    const detail::option_check c("conv_transpose2d", detail::describe(o));
    c.at_least("in_channels", o.in_channels, d.in_channels, 1);
    c.at_least("out_channels", o.out_channels, d.out_channels, 1);
    c.at_least("kernel", o.kernel, d.kernel, 1);
    c.at_least("stride", o.stride, d.stride, 1);
    c.at_least("padding", o.padding, d.padding, 0);
    c.at_least("output_padding", o.output_padding, d.output_padding, 0);
    c.below("output_padding", o.output_padding, d.output_padding, "stride", o.stride);
    return o;
  }
  // Seen from the output: a convolution of the output planes (k, s, p) gives the input's H x W.
  conv_geometry geometry(const shape& in, const shape& out) const {
    return {in.n(),    o_.out_channels, out.h(),    out.w(), o_.in_channels,
            o_.kernel, o_.stride,       o_.padding, in.h(),  in.w()};
  }
  // db[c] += the sum of dy over examples and positions: per-plane sums, then in example order.
  template <class E>
  void add_bias_gradient(E& e, const tensor_type& dy) {
    const shape& s = dy.shape();
    const std::int64_t planes = s.n() * s.c(), plane = s.h() * s.w();
    tensor<double, D> sums{shape{planes}, device_, uninitialized};
    e.segmented_sum(planes, plane, detail::kernels::value_of<T>{dy.data(), plane}, sums.data());
    e.for_each(s.c(), detail::kernels::add_channel_totals<T>{sums.data(), bias_.grad.data(), s.n(), s.c()});
  }

  conv_transpose2d_options o_;
  D device_;
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
