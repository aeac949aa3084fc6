#pragma once
// 2-D convolution of NCHW tensors, computed by the replica's engine (oneDNN on the CPU where built in,
// the im2col + GEMM reference otherwise).
//
// Output size: Ho = floor((H + 2p - k) / s) + 1 (likewise Wo), for zero and reflection padding alike.
// Reflection padding (CycleGAN's c7s1 and residual convolutions) pads the input explicitly first and
// then convolves without padding. Weights are [Cout, Cin, k, k] (PyTorch's order).
//
// Forward keeps the (padded) input, all that backward needs (its state_type); scratch comes from the
// engine's arena.

#include <distribute/detail/element_kernels.hpp>
#include <distribute/engine/conv_geometry.hpp>
#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/detail/padding_kernels.hpp>
#include <distribute/nn/detail/weight_and_bias.hpp>
#include <distribute/nn/layer.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace distribute::nn {

enum class padding_mode : std::uint8_t { zero, reflect };

// Defaults: a 3x3 kernel, stride 1, no padding, zero padding mode, with a bias.
struct conv2d_options {
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 1;
  std::int64_t kernel = 3;
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  padding_mode pad_mode = padding_mode::zero;
  bool bias = true;
};

namespace detail {
inline std::string describe(const conv2d_options& o) {
  return "{in_channels " + std::to_string(o.in_channels) + ", out_channels " + std::to_string(o.out_channels) +
         ", kernel " + std::to_string(o.kernel) + ", stride " + std::to_string(o.stride) + ", padding " +
         std::to_string(o.padding) + (o.pad_mode == padding_mode::reflect ? " (reflect)" : "") + "}";
}
}  // namespace detail

template <class T = float, device D = cpu>
class conv2d : public detail::optional_input_gradient<conv2d<T, D>>, public detail::weight_and_bias<T, D> {
  using weights = detail::weight_and_bias<T, D>;
  using weights::bias_;
  using weights::weight_;

 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  // What a forward keeps for its backward (layer.hpp): the input, reflection-padded when padding reflects.
  struct state_type {
    detail::state_stamp stamp;
    tensor_type input;
    shape in_shape{};
  };
  static constexpr const char* layer_name = "conv2d";

  conv2d(conv2d_options o, std::uint64_t seed, const D& device = {})
      : weights{weight_shape(check(o)), o.bias ? o.out_channels : 0, seed, device}, o_{o}, device_{device} {}

  const conv2d_options& options() const noexcept { return o_; }

  // The output shape for an input of `in`.
  shape output_shape(const shape& in) const {
    if (in.rank() != 4 || in.c() != o_.in_channels)
      throw std::invalid_argument("distribute: conv2d " + detail::describe(o_) + " got a tensor of shape " +
                                  in.to_string());
    if (o_.pad_mode == padding_mode::reflect && (o_.padding >= in.h() || o_.padding >= in.w()))
      throw std::invalid_argument("distribute: conv2d " + detail::describe(o_) +
                                  ": reflection padding needs planes larger than the padding; got " + in.to_string());
    const std::int64_t h = in.h() + 2 * o_.padding - o_.kernel, w = in.w() + 2 * o_.padding - o_.kernel;
    if (h < 0 || w < 0)
      throw std::invalid_argument("distribute: conv2d " + detail::describe(o_) +
                                  ": kernel larger than the padded input " + in.to_string());
    return shape::nchw(in.n(), o_.out_channels, h / o_.stride + 1, w / o_.stride + 1);
  }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    auto& e = detail::engine_of<D>(r);
    const shape out = output_shape(x.shape());
    tensor_type& input_ = s.input;
    s.in_shape = x.shape();
    if (reflects()) {
      const std::int64_t p = o_.padding, h = x.shape().h(), w = x.shape().w();
      input_ = tensor_type{shape::nchw(x.shape().n(), x.shape().c(), h + 2 * p, w + 2 * p), device_, uninitialized};
      e.for_each_in_segments(x.shape().n() * x.shape().c(), (h + 2 * p) * (w + 2 * p),
                             detail::kernels::reflect_pad<T>{x.data(), input_.data(), h, w, p});
    } else {
      input_ = x;
    }
    tensor_type y{out, device_, uninitialized};
    e.conv_forward(geometry(input_), input_.data(), weight_.value.data(), o_.bias ? bias_.value.data() : nullptr,
                   y.data());
    kept_.stamp(s, this);
    return y;
  }

  // backward(r, dy), backward(r, state, dy) and their no_input_gradient forms: detail::optional_input_gradient;
  // weight(), bias(), for_each_parameter, zero_grad, set_training: detail::weight_and_bias.

  // The backward recorded on a tape (nn::create_graph): dx = the data gradient of dy, an operation
  // linear in dy. Its own backward, for an incoming gradient g of dx, is the convolution of g (without
  // the bias) for dy and, unless frozen, the weight gradient of g against dy for the weights (the bias
  // has no second-order part).
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type& s, typename Tape::variable, typename Tape::variable,
                                            typename Tape::variable dy, bool frozen) {
    if (frozen) return recorded_backward_with(t, s, dy, weight_.value, nullptr);
    return recorded_backward_with(t, s, dy, weight_.value, this->weight_gradient_adder(t));
  }
  // The same with the weights `w` (alive until the tape's backward has run) and `add_weight_gradient(dw)`
  // taking the weight gradient (nullptr: none): what spectral_norm records with W / sigma.
  template <class Tape, class Sink>
  typename Tape::variable recorded_backward_with(Tape& t, const state_type& s, typename Tape::variable dy,
                                                 const tensor_type& w, Sink add_weight_gradient) {
    const conv_geometry g = geometry(s.input);
    const shape in = s.in_shape, padded = s.input.shape();
    const std::int64_t p = reflects() ? o_.padding : 0;
    const tensor_type* weights = &w;
    auto& r = t.replica();
    // dy -> dx: the data gradient on the padded input, folded back where padding reflects.
    auto data_gradient = [&r, g, in, padded, p, weights](const tensor_type& d) {
      auto& e = detail::engine_of<D>(r);
      tensor_type dp{padded, d.device(), uninitialized};
      e.conv_backward_data(g, d.data(), weights->data(), dp.data());
      if (p == 0) return dp;
      tensor_type dx{in, d.device(), uninitialized};
      e.for_each_in_segments(in.n() * in.c(), in.h() * in.w(),
                             detail::kernels::reflect_pad_backward<T>{dp.data(), dx.data(), in.h(), in.w(), p});
      return dx;
    };
    // g (of dx's shape) -> its padded form, the input the convolution sees.
    auto pad = [&r, in, padded, p](const tensor_type& x) {
      if (p == 0) return x;
      tensor_type xp{padded, x.device(), uninitialized};
      detail::engine_of<D>(r).for_each_in_segments(
          in.n() * in.c(), padded.h() * padded.w(),
          detail::kernels::reflect_pad<T>{x.data(), xp.data(), in.h(), in.w(), p});
      return xp;
    };
    auto convolve = [&r, g, weights](const tensor_type& xp) {
      tensor_type y{shape::nchw(g.batch, g.out_channels, g.out_height, g.out_width), xp.device(), uninitialized};
      detail::engine_of<D>(r).conv_forward(g, xp.data(), weights->data(), static_cast<const T*>(nullptr), y.data());
      return y;
    };
    if constexpr (std::is_same_v<Sink, std::nullptr_t>) {
      return t.linear_map("conv2d's gradient", dy, data_gradient,
                          [pad, convolve](const tensor_type& x) { return convolve(pad(x)); });
    } else {
      return t.record_parameter_operation(
          "conv2d's gradient", data_gradient(dy.value()), dy,
          [&r, g, dy, pad, convolve, sink = std::move(add_weight_gradient)](const tensor_type& gx, bool want_dy) {
            const tensor_type xp = pad(gx);
            tensor_type dw{shape{g.out_channels, g.in_channels, g.kernel, g.kernel}, gx.device()};
            detail::engine_of<D>(r).conv_backward_weights(g, xp.data(), dy.value().data(), dw.data(),
                                                          static_cast<T*>(nullptr));
            sink(dw);
            return want_dy ? convolve(xp) : tensor_type{};
          });
    }
  }

 private:
  friend class detail::optional_input_gradient<conv2d>;
  template <class R>
  tensor_type backward_pass(R& r, state_type& s, const tensor_type& dy, bool input_gradient) {
    detail::claim(r, s.stamp, this, layer_name);
    auto& e = detail::engine_of<D>(r);
    const tensor_type& input_ = s.input;
    const shape& in_shape_ = s.in_shape;
    const shape out = output_shape(in_shape_);
    if (dy.shape() != out)
      throw std::invalid_argument("distribute: conv2d " + detail::describe(o_) + " backward got dy of shape " +
                                  dy.shape().to_string() + ", expected " + out.to_string());
    const conv_geometry g = geometry(input_);
    // With reflection padding the data gradient lands on the padded input, then folds back onto dx.
    const bool fold = input_gradient && reflects();
    tensor_type dx = input_gradient ? tensor_type{in_shape_, device_, uninitialized} : tensor_type{};
    tensor_type dpadded = fold ? tensor_type{input_.shape(), device_, uninitialized} : tensor_type{};
    T* const data_gradient = !input_gradient ? nullptr : (fold ? dpadded : dx).data();  // null: weights only
    ::distribute::conv_backward(e, g, input_.data(), dy.data(), weight_.value.data(), data_gradient,
                                weight_.grad.data(), o_.bias ? bias_.grad.data() : nullptr);
    if (!fold) return dx;
    e.for_each_in_segments(
        in_shape_.n() * in_shape_.c(), in_shape_.h() * in_shape_.w(),
        detail::kernels::reflect_pad_backward<T>{dpadded.data(), dx.data(), in_shape_.h(), in_shape_.w(), o_.padding});
    return dx;
  }

  static shape weight_shape(const conv2d_options& o) {
    return shape{o.out_channels, o.in_channels, o.kernel, o.kernel};
  }
  static conv2d_options check(conv2d_options o) {
    const conv2d_options d{};
    const detail::option_check c("conv2d", detail::describe(o));
    c.at_least("in_channels", o.in_channels, d.in_channels, 1);
    c.at_least("out_channels", o.out_channels, d.out_channels, 1);
    c.at_least("kernel", o.kernel, d.kernel, 1);
    c.at_least("stride", o.stride, d.stride, 1);
    c.at_least("padding", o.padding, d.padding, 0);
    return o;
  }
  bool reflects() const noexcept { return o_.pad_mode == padding_mode::reflect && o_.padding > 0; }
  // The convolution the engine sees: over the explicitly padded input when padding reflects.
  conv_geometry geometry(const tensor_type& input) const {
    const shape& in = input.shape();
    return conv_geometry::of(in.n(), o_.in_channels, in.h(), in.w(), o_.out_channels, o_.kernel, o_.stride,
                             reflects() ? 0 : o_.padding);
  }

  conv2d_options o_;
  D device_;
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
