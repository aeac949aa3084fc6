#pragma once
// Instance normalisation (CycleGAN's norm): every (example, channel) plane is normalised by its own
// mean and biased variance, so no statistic crosses examples and nothing crosses replicas. Affine
// (gamma N(1, 0.02), beta 0) is optional; CycleGAN's reference uses none.

#include <distribute/nn/detail/norm_epilogue.hpp>
#include <distribute/nn/detail/norm_kernels.hpp>
#include <distribute/nn/detail/plane_statistics.hpp>
#include <distribute/nn/detail/plane_sum_kernels.hpp>
#include <distribute/nn/detail/recorded_norm.hpp>
#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/layer.hpp>

#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute::nn {

struct instance_norm_options {
  std::int64_t channels = 1;
  double eps = 1e-5;
  bool affine = false;
};

template <class T = float, device D = cpu>
class instance_norm {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  // What a forward keeps for its backward (layer.hpp).
  struct state_type {
    detail::state_stamp stamp;
    tensor<double, D> stats;  // [mean | inverse standard deviation] per plane
    tensor_type xhat;
    tensor_type affine;  // [scale | shift] per plane (kernels::plane_affine)
    bool relu = false;   // a ReLU was fused into the output: backward applies its mask
  };
  static constexpr const char* layer_name = "instance_norm";

  instance_norm(instance_norm_options o, std::uint64_t seed, const D& device = {})
      : o_{check(o)},
        device_{device},
        gamma_{shape{o.affine ? o.channels : 0}, init::scale, detail::sub_seed(seed, 0), device},
        beta_{shape{o.affine ? o.channels : 0}, init::zero, 0, device} {}

  static instance_norm_options check(instance_norm_options o) {
    const instance_norm_options d{};
    const detail::option_check c("instance_norm", "{channels " + std::to_string(o.channels) + ", eps " +
                                                      detail::short_number(o.eps) + (o.affine ? ", affine}" : "}"));
    c.at_least("channels", o.channels, d.channels, 1);
    c.positive("eps", o.eps, d.eps);
    return o;
  }

  const instance_norm_options& options() const noexcept { return o_; }

  // The backward recorded on a tape (nn::create_graph), written with the tape's operations from x
  // (detail::recorded_norm_backward over each plane, gamma per channel).
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type& s, typename Tape::variable x, typename Tape::variable,
                                            typename Tape::variable dy, bool frozen) {
    if (s.relu)
      throw missing_rule_error(
          "distribute: instance_norm with a fused ReLU has no recorded backward; call the norm "
          "and the ReLU on the tape one by one");
    using V = typename Tape::variable;
    return detail::recorded_norm_backward(
        t, x, dy, dims{-2, -1},
        o_.affine ? std::optional<V>{detail::channel_parameter(t, gamma_, frozen)} : std::nullopt, o_.eps);
  }
  parameter<T, D>& gamma() noexcept { return gamma_; }
  parameter<T, D>& beta() noexcept { return beta_; }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& state) {
    return forward(r, x, state, detail::norm_epilogue<T, D>{});
  }
  // The forward with what follows the norm fused into its output pass (detail::norm_epilogue):
  // sequential fuses a ReLU that follows, and a residual connection's add (nn/sequential.hpp).
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, detail::norm_epilogue<T, D> then) {
    return forward(r, x, kept_.next(), then);
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& state, detail::norm_epilogue<T, D> then) {
    auto& e = detail::engine_of<D>(r);
    const shape& s = x.shape();
    if (s.rank() != 4 || s.c() != o_.channels)
      throw std::invalid_argument("distribute: instance norm over " + std::to_string(o_.channels) +
                                  " channels got a tensor of shape " + s.to_string());
    if (then.residual && then.residual->shape() != s)
      throw std::invalid_argument("distribute: instance norm: the residual added to its output has shape " +
                                  then.residual->shape().to_string() + ", the output " + s.to_string());
    const std::int64_t planes = s.n() * o_.channels, plane = s.h() * s.w();
    // [mean | inverse standard deviation] per plane, on the device.
    state.stats = tensor<double, D>{shape{2 * planes}, device_, uninitialized};
    state.relu = then.relu;
    state.affine = tensor_type{shape{2 * planes}, device_, uninitialized};
    T* scale = state.affine.data();
    T* shift = scale + planes;
    // The per-plane scale and shift written with the statistics' last epilogue (no pass of their own).
    detail::plane_normalization_statistics(
        e, x, planes, plane, o_.eps, state.stats,
        detail::kernels::plane_affine<T>{o_.affine ? gamma_.value.data() : nullptr,
                                         o_.affine ? beta_.value.data() : nullptr, scale, shift, o_.channels});
    state.xhat = tensor_type{s, device_, uninitialized};
    tensor_type y{s, device_, uninitialized};
    const double* mean = state.stats.data();
    const double* invstd = mean + planes;
    const T* residual = then.residual ? then.residual->data() : nullptr;
    with_flag(then.relu, [&]<bool Relu> {
      if (residual)
        e.for_each_in_segments(planes, plane,
                               detail::kernels::plane_norm_output<T, Relu, true>{
                                   x.data(), mean, invstd, scale, shift, state.xhat.data(), y.data(), residual, plane});
      else
        e.for_each_in_segments(planes, plane,
                               detail::kernels::plane_norm_output<T, Relu, false>{
                                   x.data(), mean, invstd, scale, shift, state.xhat.data(), y.data(), nullptr, plane});
    });
    kept_.stamp(state, this);
    return y;
  }

  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_.last(r, this, layer_name), dy);
  }
  template <class R>
  tensor_type backward(R& r, state_type& state, const tensor_type& dy) {
    detail::claim(r, state.stamp, this, layer_name);
    auto& e = detail::engine_of<D>(r);
    const shape& s = state.xhat.shape();
    if (dy.shape() != s)
      throw std::invalid_argument("distribute: instance norm backward got dy of shape " + dy.shape().to_string() +
                                  ", expected " + s.to_string());
    const std::int64_t C = o_.channels, planes = s.n() * C, plane = s.h() * s.w();
    const detail::kernels::plane_norm_terms<T> t = terms(state, plane);
    // Per plane [sum g | sum g xhat], g the gradient at the affine output (dy through the ReLU's mask).
    // The input gradient's coefficients per plane are the second sum's epilogue (no pass of their own).
    tensor<double, D> sums{shape{2 * planes}, device_, uninitialized};
    tensor_type coef{shape{3 * planes}, device_, uninitialized};
    const detail::kernels::plane_gradient_coefficients<T> coefficients{o_.affine ? gamma_.value.data() : nullptr,
                                                                       state.stats.data() + planes,
                                                                       sums.data(),
                                                                       coef.data(),
                                                                       C,
                                                                       static_cast<double>(plane)};
    with_flag(state.relu, [&]<bool Relu> {
      e.segmented_sum(planes, plane, detail::kernels::plane_norm_gradient<T, Relu>{t, dy.data()}, sums.data());
      detail::segmented_sum_then(e, planes, plane,
                                 detail::kernels::plane_norm_gradient_times_xhat<T, Relu>{t, dy.data()},
                                 sums.data() + planes, coefficients);
    });
    if (o_.affine)
      e.for_each(C, detail::kernels::add_plane_sums_per_channel<T>{sums.data(), gamma_.grad.data(), beta_.grad.data(),
                                                                   planes, C});
    tensor_type dx{s, device_, uninitialized};
    with_flag(state.relu, [&]<bool Relu> {
      e.for_each_in_segments(planes, plane,
                             detail::kernels::plane_norm_input_gradient<T, Relu>{t, dy.data(), coef.data(), dx.data()});
    });
    return dx;
  }

  template <class F>
  void for_each_parameter(F&& f) {
    if (!o_.affine) return;
    gamma_.visit(f);
    beta_.visit(f);
  }
  void zero_grad() {
    gamma_.zero_grad();
    beta_.zero_grad();
  }
  void set_training(bool) {}

 private:
  instance_norm_options o_;
  D device_;
  parameter<T, D> gamma_, beta_;
  detail::kept_state<state_type> kept_;

  detail::kernels::plane_norm_terms<T> terms(const state_type& state, std::int64_t plane) const {
    const auto planes = static_cast<std::int64_t>(state.affine.size()) / 2;
    return {state.xhat.data(), state.affine.data(), state.affine.data() + planes, plane};
  }
  // f.template operator()<flag>(): the passes with the flag as a template argument.
  template <class F>
  static void with_flag(bool flag, F&& f) {
    if (flag) f.template operator()<true>();
    else f.template operator()<false>();
  }
};

}  // namespace distribute::nn
