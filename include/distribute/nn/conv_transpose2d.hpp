#pragma once
// Transposed 2-D convolution (CycleGAN's u128/u64 up-sampling: k 3, stride 2, padding 1,
// output_padding 1 doubles H and W), the adjoint of conv2d: one GEMM per example and col2im.
//
// Output size: Ho = (H - 1)*s - 2p + k + output_padding (likewise Wo), with output_padding < stride:
// the definition of PyTorch's ConvTranspose2d. Weights are [Cin, Cout, k, k] (PyTorch's order).

#include <distribute/nn/detail/im2col.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/tensor/eigen.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace distribute::nn {

struct conv_transpose2d_options {
  std::int64_t in_channels = 1;
  std::int64_t out_channels = 1;
  std::int64_t kernel = 3;
  std::int64_t stride = 2;
  std::int64_t padding = 1;
  std::int64_t output_padding = 1;
  bool bias = true;
};

template <class T = float>
class conv_transpose2d {
 public:
  using scalar_type = T;

  conv_transpose2d(conv_transpose2d_options o, std::uint64_t seed)
      : o_{check(o)},
        weight_{shape{o.in_channels, o.out_channels, o.kernel, o.kernel}, init::normal, detail::sub_seed(seed, 0)},
        bias_{shape{o.bias ? o.out_channels : 0}, init::zero, 0} {}

  const conv_transpose2d_options& options() const noexcept { return o_; }
  parameter<T>& weight() noexcept { return weight_; }
  parameter<T>& bias() noexcept { return bias_; }

  shape output_shape(const shape& in) const {
    if (in.rank() != 4 || in.c() != o_.in_channels)
      throw std::invalid_argument("distribute: conv_transpose2d with " + std::to_string(o_.in_channels) +
                                  " input channels got a tensor of shape " + in.to_string());
    const std::int64_t h = (in.h() - 1) * o_.stride - 2 * o_.padding + o_.kernel + o_.output_padding;
    const std::int64_t w = (in.w() - 1) * o_.stride - 2 * o_.padding + o_.kernel + o_.output_padding;
    if (h < 1 || w < 1) throw std::invalid_argument("distribute: conv_transpose2d output would be empty for " + in.to_string());
    return shape::nchw(in.n(), o_.out_channels, h, w);
  }

  template <class R>
  tensor<T> forward(R&, const tensor<T>& x) {
    const shape out = output_shape(x.shape());
    input_ = x;
    has_input_ = true;
    tensor<T> y{out};
    const detail::window g = geometry(x.shape(), out);
    const auto wm = as_matrix(std::as_const(weight_.value), o_.in_channels, o_.out_channels * o_.kernel * o_.kernel);
    col_.resize(wm.cols(), x.shape().h() * x.shape().w());
    const std::int64_t out_size = out.c() * out.h() * out.w();
    for (std::int64_t n = 0; n < out.n(); ++n) {
      col_.noalias() = wm.transpose() * example_matrix(x, n);
      detail::col2im_add(col_.data(), g, y.data() + n * out_size);
      if (o_.bias) example_matrix(y, n).colwise() += const_vector_map<T>(bias_.value.data(), o_.out_channels);
    }
    return y;
  }

  template <class R>
  tensor<T> backward(R&, const tensor<T>& dy) {
    if (!has_input_) detail::backward_before_forward("conv_transpose2d");
    const shape out = output_shape(input_.shape());
    if (dy.shape() != out)
      throw std::invalid_argument("distribute: conv_transpose2d backward got dy of shape " + dy.shape().to_string() +
                                  ", expected " + out.to_string());
    const detail::window g = geometry(input_.shape(), out);
    const auto wm = as_matrix(std::as_const(weight_.value), o_.in_channels, o_.out_channels * o_.kernel * o_.kernel);
    auto dwm = as_matrix(weight_.grad, o_.in_channels, o_.out_channels * o_.kernel * o_.kernel);
    tensor<T> dx{input_.shape()};
    col_.resize(wm.cols(), input_.shape().h() * input_.shape().w());
    const std::int64_t out_size = out.c() * out.h() * out.w();
    for (std::int64_t n = 0; n < out.n(); ++n) {
      detail::im2col(dy.data() + n * out_size, g, col_.data());
      example_matrix(dx, n).noalias() = wm * col_;
      dwm.noalias() += example_matrix(input_, n) * col_.transpose();
      if (o_.bias) {
        const auto dyn = example_matrix(dy, n);
        auto db = vector_map<T>(bias_.grad.data(), o_.out_channels);
        for (std::int64_t c = 0; c < o_.out_channels; ++c) db[c] += dyn.row(c).sum();
      }
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
  static conv_transpose2d_options check(conv_transpose2d_options o) {
    if (o.in_channels < 1 || o.out_channels < 1 || o.kernel < 1 || o.stride < 1 || o.padding < 0 ||
        o.output_padding < 0 || o.output_padding >= o.stride)
      throw std::invalid_argument("distribute: conv_transpose2d needs positive channels, kernel and stride, "
                                  "padding >= 0 and 0 <= output_padding < stride");
    return o;
  }
  // Seen from the output: a convolution of the output planes (k, s, p) gives the input's H x W.
  detail::window geometry(const shape& in, const shape& out) const {
    return {o_.out_channels, out.h(), out.w(), o_.kernel, o_.stride, o_.padding, in.h(), in.w()};
  }

  using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

  conv_transpose2d_options o_;
  parameter<T> weight_, bias_;
  tensor<T> input_;
  bool has_input_ = false;
  matrix col_;
};

}  // namespace distribute::nn
