#pragma once
// Layer normalisation (PyTorch's nn.LayerNorm(normalized_shape), Keras's LayerNormalization over the
// trailing axes): every group of the input's trailing extents `normalized_shape` (the last of
// [N, D]; C, H, W of [N, C, H, W]; ...) is normalised by its own mean and biased variance, then scaled
// and shifted per element of the group: y = weight * xhat + bias. With elementwise_affine the weight
// starts at 1 and the bias at 0 (PyTorch's; state dict names "weight", "bias", both of
// normalized_shape); `bias = false` leaves the shift out (PyTorch's bias=False).
//
// Each group is a segment of the engine's passes: its statistics are instance norm's per-plane
// statistics (nn/detail/plane_statistics.hpp: segmented sums in double, kept on the device), and
// every other pass is one call per element; the weight and bias gradients are segmented sums over the
// groups of each position (in double, in group order), added to the gradients.

#include <distribute/nn/detail/dense_kernels.hpp>
#include <distribute/nn/detail/layer_norm_kernels.hpp>
#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/detail/plane_statistics.hpp>
#include <distribute/nn/detail/recorded_norm.hpp>
#include <distribute/nn/layer.hpp>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute::nn {

// Defaults: PyTorch's nn.LayerNorm(normalized_shape) (eps 1e-5, elementwise_affine, bias); the shape
// has no default there, here it is [1].
struct layer_norm_options {
  shape normalized_shape{1};
  double eps = 1e-5;
  bool elementwise_affine = true;
  bool bias = true;
};

namespace detail {
inline std::string describe(const layer_norm_options& o) {
  return "{normalized_shape " + o.normalized_shape.to_string() + ", eps " + short_number(o.eps) +
         (o.elementwise_affine ? (o.bias ? ", elementwise_affine" : ", elementwise_affine, no bias")
                               : ", no elementwise_affine") +
         "}";
}
}  // namespace detail

template <class T = float, device D = cpu>
class layer_norm {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  struct state_type {
    detail::state_stamp stamp;
    tensor<double, D> stats;  // [mean | inverse standard deviation] per group
    tensor_type xhat;
  };
  static constexpr const char* layer_name = "layer_norm";

  explicit layer_norm(layer_norm_options o, const D& device = {}) : o_{check(o)}, device_{device} {
    const shape s = o_.normalized_shape;
    const auto n = static_cast<std::size_t>(s.numel());
    if (o_.elementwise_affine) {
      weight_.value = tensor_type::from_host(s, std::span<const T>(std::vector<T>(n, T(1))), device);
      weight_.grad = tensor_type{s, device};
      if (o_.bias) {
        bias_.value = tensor_type{s, device};
        bias_.grad = tensor_type{s, device};
      }
    }
  }

  const layer_norm_options& options() const noexcept { return o_; }
  parameter<T, D>& weight() noexcept { return weight_; }  // empty without elementwise_affine
  parameter<T, D>& bias() noexcept { return bias_; }      // empty without elementwise_affine or bias

  // The number of elements of a group, and the groups of an input of shape `in` (checked).
  std::int64_t group_size() const noexcept { return o_.normalized_shape.numel(); }
  std::int64_t groups(const shape& in) const {
    const shape& ns = o_.normalized_shape;
    bool fits = in.rank() >= ns.rank();
    for (std::size_t i = 0; fits && i < ns.rank(); ++i) fits = in[in.rank() - ns.rank() + i] == ns[i];
    if (!fits)
      throw std::invalid_argument("distribute: layer_norm " + detail::describe(o_) + " got a tensor of shape " +
                                  in.to_string() + "; its trailing extents must be " + ns.to_string());
    return in.numel() / group_size();
  }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& state) {
    auto& e = detail::engine_of<D>(r);
    const std::int64_t segments = groups(x.shape()), group = group_size();
    state.stats = tensor<double, D>{shape{2 * segments}, device_, uninitialized};
    detail::plane_normalization_statistics(e, x, segments, group, o_.eps, state.stats);
    state.xhat = tensor_type{x.shape(), device_, uninitialized};
    tensor_type y{x.shape(), device_, uninitialized};
    e.for_each_in_segments(
        segments, group,
        detail::kernels::layer_norm_output<T>{x.data(), state.stats.data(), state.stats.data() + segments, weight_ptr(),
                                              bias_ptr(), state.xhat.data(), y.data(), group});
    kept_.stamp(state, this);
    return y;
  }

  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_.last(r, this, layer_name), dy);
  }
  // The backward recorded on a tape (nn::create_graph), written with the tape's operations from x
  // (detail::recorded_norm_backward over the trailing axes).
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type&, typename Tape::variable x, typename Tape::variable,
                                            typename Tape::variable dy, bool frozen) {
    const dims axes = [&] {
      switch (o_.normalized_shape.rank()) {
        case 1: return dims{-1};
        case 2: return dims{-2, -1};
        case 3: return dims{-3, -2, -1};
        default: return dims{-4, -3, -2, -1};
      }
    }();
    using V = typename Tape::variable;
    return detail::recorded_norm_backward(
        t, x, dy, axes, o_.elementwise_affine ? std::optional<V>{t.parameter(weight_, frozen)} : std::nullopt, o_.eps);
  }

  template <class R>
  tensor_type backward(R& r, state_type& state, const tensor_type& dy) {
    detail::claim(r, state.stamp, this, layer_name);
    auto& e = detail::engine_of<D>(r);
    const shape& s = state.xhat.shape();
    if (dy.shape() != s)
      throw std::invalid_argument("distribute: layer_norm " + detail::describe(o_) + " backward got dy of shape " +
                                  dy.shape().to_string() + ", expected " + s.to_string());
    const std::int64_t segments = groups(s), group = group_size();
    if (o_.elementwise_affine && segments > 0) {
      // Per position of the group: sum over the groups of dy * xhat (weight) and of dy (bias).
      tensor<double, D> sums{shape{group}, device_, uninitialized};
      e.segmented_sum(group, segments, detail::kernels::column_product_of<T>{dy.data(), state.xhat.data(), group},
                      sums.data());
      e.for_each(group, detail::kernels::add_sums<T>{weight_.grad.data(), sums.data()});
      if (o_.bias) {
        e.segmented_sum(group, segments, detail::kernels::column_of<T>{dy.data(), group}, sums.data());
        e.for_each(group, detail::kernels::add_sums<T>{bias_.grad.data(), sums.data()});
      }
    }
    // Per group [sum g | sum g xhat], g = dy * weight the gradient at xhat.
    tensor<double, D> sums{shape{2 * segments}, device_, uninitialized};
    e.segmented_sum(segments, group, detail::kernels::layer_norm_xhat_gradient<T>{dy.data(), weight_ptr(), group},
                    sums.data());
    e.segmented_sum(
        segments, group,
        detail::kernels::layer_norm_xhat_gradient_times_xhat<T>{dy.data(), weight_ptr(), state.xhat.data(), group},
        sums.data() + segments);
    tensor_type dx{s, device_, uninitialized};
    e.for_each_in_segments(segments, group,
                           detail::kernels::layer_norm_input_gradient<T>{dy.data(), weight_ptr(), state.xhat.data(),
                                                                         state.stats.data() + segments, sums.data(),
                                                                         dx.data(), segments, group});
    return dx;
  }

  template <class F>
  void for_each_parameter(F&& f) {
    if (!o_.elementwise_affine) return;
    weight_.visit(f);
    if (o_.bias) bias_.visit(f);
  }
  void zero_grad() {
    weight_.zero_grad();
    bias_.zero_grad();
  }
  void set_training(bool) {}
  template <class S>
  void name_state(S& s) {
    s.parameter("weight", weight_);  // empty, and so not named, without elementwise_affine
    s.parameter("bias", bias_);
  }
  // ONNX: LayerNormalization (opset 17) over the trailing axes, with constant 1 and 0 where the layer
  // has no weight or bias.
  template <class G>
  typename G::value to_onnx(G& g, const typename G::value& x) {
    groups(x.shape);
    const auto dims = [&] {
      std::vector<std::int64_t> d;
      for (std::size_t i = 0; i < o_.normalized_shape.rank(); ++i) d.push_back(o_.normalized_shape[i]);
      return d;
    }();
    const auto n = static_cast<std::size_t>(group_size());
    const std::vector<T> ones(n, T(1)), zeros(n, T(0));
    std::vector<std::string> inputs{x.name};
    inputs.push_back(o_.elementwise_affine ? g.initializer("weight", weight_.value)
                                           : g.template initializer<T>("ones", dims, std::span<const T>(ones)));
    inputs.push_back(o_.elementwise_affine && o_.bias
                         ? g.initializer("bias", bias_.value)
                         : g.template initializer<T>("zeros", dims, std::span<const T>(zeros)));
    return g.node(
        "LayerNormalization", std::move(inputs), x.shape,
        {{"axis", -static_cast<std::int64_t>(o_.normalized_shape.rank())}, {"epsilon", static_cast<float>(o_.eps)}});
  }

 private:
  const T* weight_ptr() const noexcept { return o_.elementwise_affine ? weight_.value.data() : nullptr; }
  const T* bias_ptr() const noexcept { return o_.elementwise_affine && o_.bias ? bias_.value.data() : nullptr; }

  static layer_norm_options check(layer_norm_options o) {
    const detail::option_check c("layer_norm", detail::describe(o));
    const layer_norm_options defaults;
    if (o.normalized_shape.rank() == 0)
      throw std::invalid_argument("distribute: layer_norm " + detail::describe(o) +
                                  ": normalized_shape is empty but must give at least one extent");
    for (std::size_t i = 0; i < o.normalized_shape.rank(); ++i)
      c.at_least("normalized_shape extent", o.normalized_shape[i], 1, 1);
    c.positive("eps", o.eps, defaults.eps);
    return o;
  }

  layer_norm_options o_;
  D device_;
  parameter<T, D> weight_, bias_;
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
