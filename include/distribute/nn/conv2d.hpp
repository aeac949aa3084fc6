#pragma once
// 2-D convolution of NCHW tensors, by im2col and one Eigen GEMM per example.
//
// Output size: Ho = floor((H + 2p - k) / s) + 1 (likewise Wo), for zero and reflection padding alike.
// Reflection padding (CycleGAN's c7s1 and residual convolutions) pads the input explicitly first and
// then convolves without padding. Weights are [Cout, Cin, k, k] (PyTorch's order).
//
// Per example rather than one GEMM over the batch: the GEMM's shape then does not depend on how a
// batch is split between replicas, so every example's output has the same bits under any strategy.

#include <distribute/nn/detail/im2col.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/tensor/eigen.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace distribute::nn {

enum class padding_mode : std::uint8_t { zero, reflect };

struct conv2d_options {
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 1;
  std::int64_t kernel = 3;
  std::int64_t stride = 1;
  std::int64_t padding = 0;
  padding_mode pad_mode = padding_mode::zero;
  bool bias = true;
};

template <class T = float>
class conv2d {
 public:
  using scalar_type = T;

  conv2d(conv2d_options o, std::uint64_t seed)
      : o_{check(o)},
        weight_{shape{o.out_channels, o.in_channels, o.kernel, o.kernel}, init::normal, detail::sub_seed(seed, 0)},
        bias_{shape{o.bias ? o.out_channels : 0}, init::zero, 0} {}

  const conv2d_options& options() const noexcept { return o_; }
  parameter<T>& weight() noexcept { return weight_; }
  parameter<T>& bias() noexcept { return bias_; }

  // The output shape for an input of `in`.
  shape output_shape(const shape& in) const {
    if (in.rank() != 4 || in.c() != o_.in_channels)
      throw std::invalid_argument("distribute: conv2d with " + std::to_string(o_.in_channels) +
                                  " input channels got a tensor of shape " + in.to_string());
    if (o_.pad_mode == padding_mode::reflect && (o_.padding >= in.h() || o_.padding >= in.w()))
      throw std::invalid_argument("distribute: reflection padding " + std::to_string(o_.padding) +
                                  " needs planes larger than the padding; got " + in.to_string());
    const std::int64_t h = in.h() + 2 * o_.padding - o_.kernel, w = in.w() + 2 * o_.padding - o_.kernel;
    if (h < 0 || w < 0)
      throw std::invalid_argument("distribute: conv2d kernel " + std::to_string(o_.kernel) + " larger than the padded input " + in.to_string());
    return shape::nchw(in.n(), o_.out_channels, h / o_.stride + 1, w / o_.stride + 1);
  }

  template <class R>
  tensor<T> forward(R&, const tensor<T>& x) {
    const shape out = output_shape(x.shape());
    in_shape_ = x.shape();
    if (o_.pad_mode == padding_mode::reflect && o_.padding > 0) {
      const std::int64_t p = o_.padding, c = x.shape().c(), h = x.shape().h(), w = x.shape().w();
      input_.resize(shape::nchw(x.shape().n(), c, h + 2 * p, w + 2 * p));
      const std::int64_t in_size = c * h * w, padded_size = c * (h + 2 * p) * (w + 2 * p);
      for (std::int64_t n = 0; n < x.shape().n(); ++n)
        detail::reflect_pad(x.data() + n * in_size, c, h, w, p, input_.data() + n * padded_size);
    } else {
      input_ = x;
    }
    has_input_ = true;
    tensor<T> y{out};
    const detail::window g = geometry(out);
    const auto wm = as_matrix(std::as_const(weight_.value), o_.out_channels, o_.in_channels * o_.kernel * o_.kernel);
    col_.resize(wm.cols(), out.h() * out.w());
    for (std::int64_t n = 0; n < out.n(); ++n) {
      detail::im2col(input_.data() + n * g.channels * g.height * g.width, g, col_.data());
      auto yn = example_matrix(y, n);
      yn.noalias() = wm * col_;
      if (o_.bias) yn.colwise() += const_vector_map<T>(bias_.value.data(), o_.out_channels);
    }
    return y;
  }

  template <class R>
  tensor<T> backward(R&, const tensor<T>& dy) {
    if (!has_input_) detail::backward_before_forward("conv2d");
    const shape out = output_shape(in_shape_);
    if (dy.shape() != out)
      throw std::invalid_argument("distribute: conv2d backward got dy of shape " + dy.shape().to_string() +
                                  ", expected " + out.to_string());
    const detail::window g = geometry(out);
    const auto wm = as_matrix(std::as_const(weight_.value), o_.out_channels, o_.in_channels * o_.kernel * o_.kernel);
    auto dwm = as_matrix(weight_.grad, o_.out_channels, o_.in_channels * o_.kernel * o_.kernel);
    const bool padded = o_.pad_mode == padding_mode::reflect && o_.padding > 0;
    tensor<T> dx{in_shape_};
    tensor<T>& dinput = padded ? dpadded_ : dx;
    if (padded) {
      dpadded_.resize(input_.shape());
      dpadded_.fill(T(0));
    }
    col_.resize(wm.cols(), out.h() * out.w());
    dcol_.resize(wm.cols(), out.h() * out.w());
    const std::int64_t in_size = g.channels * g.height * g.width;
    for (std::int64_t n = 0; n < out.n(); ++n) {
      const auto dyn = example_matrix(dy, n);
      detail::im2col(input_.data() + n * in_size, g, col_.data());
      dwm.noalias() += dyn * col_.transpose();
      if (o_.bias) {
        auto db = vector_map<T>(bias_.grad.data(), o_.out_channels);
        for (std::int64_t c = 0; c < o_.out_channels; ++c) db[c] += dyn.row(c).sum();
      }
      dcol_.noalias() = wm.transpose() * dyn;
      detail::col2im_add(dcol_.data(), g, dinput.data() + n * in_size);
    }
    if (padded) {
      const std::int64_t c = in_shape_.c(), h = in_shape_.h(), w = in_shape_.w(), p = o_.padding;
      for (std::int64_t n = 0; n < in_shape_.n(); ++n)
        detail::reflect_pad_backward_add(dpadded_.data() + n * in_size, c, h, w, p, dx.data() + n * c * h * w);
    }
    return dx;
  }

  template <class F>
  void for_each_parameter(F&& f) {
    weight_.visit(f);
    if (o_.bias) bias_.visit(f);
  }
  void zero_grad() {
    weight_.zero_grad();
    bias_.zero_grad();
  }
  void set_training(bool) {}

 private:
  static conv2d_options check(conv2d_options o) {
    if (o.in_channels < 1 || o.out_channels < 1 || o.kernel < 1 || o.stride < 1 || o.padding < 0)
      throw std::invalid_argument("distribute: conv2d needs positive channels, kernel and stride, and padding >= 0");
    return o;
  }
  // The convolution as im2col sees it: over the (explicitly) padded input for reflection padding.
  detail::window geometry(const shape& out) const {
    const bool reflect = o_.pad_mode == padding_mode::reflect;
    return {o_.in_channels, input_.shape().h(), input_.shape().w(), o_.kernel, o_.stride,
            reflect ? 0 : o_.padding, out.h(), out.w()};
  }

  using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  conv2d_options o_;
  parameter<T> weight_, bias_;
  tensor<T> input_;    // the input of the last forward, reflection-padded when padding reflects
  tensor<T> dpadded_;
  shape in_shape_{};
  bool has_input_ = false;
  matrix col_, dcol_;  // reused between calls: no allocation in steady state
};

}  // namespace distribute::nn
