#pragma once
// A fully connected layer (PyTorch's nn.Linear, Keras's Dense without an activation): y = x W^T + b
// for an input x of [N, in_features]. Weights are [out_features, in_features] (PyTorch's order).
//
// The three passes are matrix products computed by the replica's engine (`gemm`, engine/engine.hpp):
// y = x W^T, dx = dy W, and dW += dy^T x, a sum over the examples in an order fixed by the sizes and
// the engine's thread count; db += the column sums of dy, in double and in example order. With
// `compute_options::split_independent`, an example's output and input gradient have the same bits
// under any split of the batch. Forward keeps its input, all that backward needs (its state_type).

#include <distribute/detail/element_kernels.hpp>
#include <distribute/engine/gemm_geometry.hpp>
#include <distribute/nn/detail/dense_kernels.hpp>
#include <distribute/nn/detail/weight_and_bias.hpp>
#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/layer.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace distribute::nn {

// Defaults: one input and one output feature, with a bias.
struct linear_options {
  std::int64_t in_features = 1;
  std::int64_t out_features = 1;
  bool bias = true;
};

namespace detail {
inline std::string describe(const linear_options& o) {
  return "{in_features " + std::to_string(o.in_features) + ", out_features " + std::to_string(o.out_features) +
         (o.bias ? ", bias" : ", no bias") + "}";
}
}  // namespace detail

template <class T = float, device D = cpu>
class linear : public detail::optional_input_gradient<linear<T, D>>, public detail::weight_and_bias<T, D> {
  using weights = detail::weight_and_bias<T, D>;
  using weights::bias_;
  using weights::weight_;

 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  struct state_type {
    detail::state_stamp stamp;
    tensor_type input;
  };
  static constexpr const char* layer_name = "linear";

  // Weights N(0, 0.02) from `seed` (the scheme of every layer), bias zero.
  linear(linear_options o, std::uint64_t seed, const D& device = {})
      : weights{weight_shape(check(o)), o.bias ? o.out_features : 0, seed, device}, o_{o}, device_{device} {}

  const linear_options& options() const noexcept { return o_; }

  // The output shape for an input of `in`: [N, out_features] for [N, in_features].
  shape output_shape(const shape& in) const {
    if (in.rank() != 2 || in[1] != o_.in_features)
      throw std::invalid_argument("distribute: linear " + detail::describe(o_) + " got a tensor of shape " +
                                  in.to_string() + "; it takes [N, " + std::to_string(o_.in_features) + "]" +
                                  (in.rank() > 2 ? " (flatten the input first: nn::flatten)" : ""));
    return shape{in[0], o_.out_features};
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
    e.gemm(gemm_geometry{.m = out[0], .n = o_.out_features, .k = o_.in_features, .transpose_b = true}, x.data(),
           weight_.value.data(), y.data());
    if (o_.bias)
      e.for_each_in_segments(out[0], o_.out_features,
                             detail::kernels::add_row_bias<T>{y.data(), bias_.value.data(), o_.out_features});
    kept_.stamp(s, this);
    return y;
  }

  // backward(r, dy), backward(r, state, dy) and their no_input_gradient forms: detail::optional_input_gradient;
  // weight(), bias(), for_each_parameter, zero_grad, set_training: detail::weight_and_bias.

  // The backward recorded on a tape (nn::create_graph): dx = dy W, an operation linear in dy. Its own
  // backward, for an incoming gradient g of dx, is g W^T for dy and, unless frozen, dy^T g for W (the
  // bias has no second-order part).
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
    const std::int64_t n = s.input.shape()[0], in = o_.in_features, out = o_.out_features;
    const tensor_type* weights = &w;
    auto& r = t.replica();
    auto data_gradient = [&r, n, in, out, weights](const tensor_type& d) {
      tensor_type dx{shape{n, in}, d.device(), uninitialized};
      detail::engine_of<D>(r).gemm(gemm_geometry{.m = n, .n = in, .k = out}, d.data(), weights->data(), dx.data());
      return dx;
    };
    auto apply = [&r, n, in, out, weights](const tensor_type& x) {
      tensor_type y{shape{n, out}, x.device(), uninitialized};
      detail::engine_of<D>(r).gemm(gemm_geometry{.m = n, .n = out, .k = in, .transpose_b = true}, x.data(),
                                   weights->data(), y.data());
      return y;
    };
    if constexpr (std::is_same_v<Sink, std::nullptr_t>) {
      return t.linear_map("linear's gradient", dy, data_gradient, apply);
    } else {
      return t.record_parameter_operation(
          "linear's gradient", data_gradient(dy.value()), dy,
          [&r, n, in, out, dy, apply, sink = std::move(add_weight_gradient)](const tensor_type& gx, bool want_dy) {
            tensor_type dw{shape{out, in}, gx.device()};
            detail::engine_of<D>(r).gemm(
                gemm_geometry{.m = out, .n = in, .k = n, .transpose_a = true, .accumulate = true}, dy.value().data(),
                gx.data(), dw.data());
            sink(dw);
            return want_dy ? apply(gx) : tensor_type{};
          });
    }
  }

 private:
  friend class detail::optional_input_gradient<linear>;
  template <class R>
  tensor_type backward_pass(R& r, state_type& s, const tensor_type& dy, bool input_gradient) {
    detail::claim(r, s.stamp, this, layer_name);
    auto& e = detail::engine_of<D>(r);
    const tensor_type& input_ = s.input;
    const shape out = output_shape(input_.shape());
    if (dy.shape() != out)
      throw std::invalid_argument("distribute: linear " + detail::describe(o_) + " backward got dy of shape " +
                                  dy.shape().to_string() + ", expected " + out.to_string());
    const std::int64_t n = out[0];
    e.gemm(gemm_geometry{.m = o_.out_features, .n = o_.in_features, .k = n, .transpose_a = true, .accumulate = true},
           dy.data(), input_.data(), weight_.grad.data());
    if (o_.bias && n > 0) {
      tensor<double, D> sums{shape{o_.out_features}, device_};
      e.segmented_sum(o_.out_features, n, detail::kernels::column_of<T>{dy.data(), o_.out_features}, sums.data());
      e.for_each(o_.out_features, detail::kernels::add_sums<T>{bias_.grad.data(), sums.data()});
    }
    if (!input_gradient) return tensor_type{};
    tensor_type dx{input_.shape(), device_, uninitialized};
    e.gemm(gemm_geometry{.m = n, .n = o_.in_features, .k = o_.out_features}, dy.data(), weight_.value.data(),
           dx.data());
    return dx;
  }

  static shape weight_shape(const linear_options& o) { return shape{o.out_features, o.in_features}; }
  static linear_options check(linear_options o) {
    const detail::option_check c("linear", detail::describe(o));
    const linear_options defaults;
    c.at_least("in_features", o.in_features, defaults.in_features, 1);
    c.at_least("out_features", o.out_features, defaults.out_features, 1);
    return o;
  }

  linear_options o_;
  D device_;
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
