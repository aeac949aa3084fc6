#pragma once
// Dropout (PyTorch's nn.Dropout, Keras's Dropout): in training, each element is zeroed with
// probability `rate` and the kept ones are scaled by 1 / (1 - rate), so that the expectation is the
// input; in evaluation (`set_training(false)`) it is the identity. Backward multiplies dy by the same
// mask, which forward keeps (its state_type, layer.hpp).
//
// The mask is drawn by the engine from a counter-based stream (nn/detail/dropout_kernels.hpp): element i of
// a forward pass depends on the layer's seed, the replica's id (replicas drop different elements of
// their different examples) and the number of training forward passes so far, never on the thread
// count. That count is the layer's buffer (`for_each_buffer`), so a checkpoint resumes the sequence
// of masks and `verify_mirrored` sees replicas that stepped differently.

#include <distribute/detail/element_kernels.hpp>
#include <distribute/nn/detail/dropout_kernels.hpp>
#include <distribute/nn/detail/random.hpp>
#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/layer.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>

namespace distribute::nn {

// Defaults: half the elements dropped (PyTorch's p = 0.5).
struct dropout_options {
  double rate = 0.5;
};

namespace detail {
// 0.5, 1e-05: as a person would write the rate.
inline std::string describe(const dropout_options& o) { return "{rate " + short_number(o.rate) + "}"; }
}  // namespace detail

template <class T = float, device D = cpu>
class dropout {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  struct state_type {
    detail::state_stamp stamp;
    tensor_type mask;  // 0 or 1 / (1 - rate) per element, when masked
    shape in_shape{};
    bool masked = false;
  };
  static constexpr const char* layer_name = "dropout";

  dropout(dropout_options o, std::uint64_t seed) : o_{check(o)}, seed_{seed} {}

  const dropout_options& options() const noexcept { return o_; }
  bool training() const noexcept { return training_; }
  // Training forward passes so far: the position in the sequence of masks.
  std::uint64_t passes() const noexcept { return static_cast<std::uint64_t>(passes_); }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    auto& e = detail::engine_of<D>(r);
    s.in_shape = x.shape();
    s.masked = training_ && o_.rate > 0;
    kept_.stamp(s, this);
    if (!training_) return x;
    const std::uint64_t pass = static_cast<std::uint64_t>(passes_);
    passes_ += 1;
    if (!s.masked) return x;
    const std::uint64_t key =
        detail::sub_seed(detail::sub_seed(seed_, static_cast<std::uint64_t>(r.replica_id())), pass);
    const auto threshold = static_cast<std::uint64_t>(std::ldexp(o_.rate, 53));
    s.mask = tensor_type{x.shape(), x.device(), uninitialized};
    tensor_type y{x.shape(), x.device(), uninitialized};
    e.for_each(static_cast<std::int64_t>(x.size()),
               detail::kernels::dropout_forward<T>{x.data(), y.data(), s.mask.data(), key, threshold,
                                                   static_cast<T>(1.0 / (1.0 - o_.rate))});
    return y;
  }

  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_.last(r, this, layer_name), dy);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    detail::claim(r, s.stamp, this, layer_name);
    auto& e = detail::engine_of<D>(r);
    if (dy.shape() != s.in_shape)
      throw std::invalid_argument("distribute: dropout " + detail::describe(o_) + " backward got dy of shape " +
                                  dy.shape().to_string() + ", expected " + s.in_shape.to_string());
    if (!s.masked) return dy;
    tensor_type dx{dy.shape(), dy.device(), uninitialized};
    e.for_each(static_cast<std::int64_t>(dy.size()),
               distribute::detail::kernels::multiply<T>{dy.data(), s.mask.data(), dx.data()});
    return dx;
  }

  template <class F>
  void for_each_parameter(F&&) {}
  // The count of training forward passes (a double: buffers are doubles; exact below 2^53).
  template <class F>
  void for_each_buffer(F&& f) {
    f(std::span<double>(&passes_, 1));
  }
  void zero_grad() {}
  void set_training(bool on) noexcept { training_ = on; }

 private:
  static dropout_options check(dropout_options o) {
    detail::option_check("dropout", detail::describe(o)).within_below("rate", o.rate, dropout_options{}.rate, 0, 1);
    return o;
  }

  dropout_options o_;
  std::uint64_t seed_;
  double passes_ = 0;
  bool training_ = true;
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
