#pragma once
// Dynamic loss scaling (PyTorch's torch.amp.GradScaler, Keras's LossScaleOptimizer), with the
// decision to skip a step agreed by every replica.
//
// What it is for: mixed-precision training multiplies the loss gradient by a large factor (the
// scale) before the backward pass, so that small gradients do not underflow in half precision, and
// divides the parameters' gradients by it before the update. When the scale is too large some
// gradient overflows to inf (or becomes NaN): that step is skipped and the scale halved; after
// `growth_interval` clean steps in a row it doubles. The library computes in float32 only today (no
// half-precision layers yet), so for a float model scaling by a power of two changes no bit of a clean
// step; what the scaler then does is guard against overflow: a step whose gradients hold an inf or a
// NaN is skipped on every replica, and the scale backs off until the gradients fit.
//
// Use, per replica, inside a step, in this order:
//
//   auto loss = nn::mse(r, y, target, global_batch);
//   scaler.scale_loss_gradient(r, loss);                  // loss.grad *= scale (loss.value untouched)
//   model.backward(r, loss.grad, nn::no_input_gradient);
//   r.all_reduce_gradients(model);                        // the sum of the shares, as without a scaler
//   const bool stepped = scaler.step(r, optimizer, model);
//
// `step` divides every gradient by the scale (on the replica's engine), counts the gradients' infs
// and NaNs (a reduction on the engine; one number per chunk of a gradient comes to the host, so a GPU
// model's gradients are never read on the host), then AGREES: the replicas all-reduce a found-inf
// flag with max, so that either every replica of every worker steps or every one skips. It calls
// `optimizer.step(r, model)` unless some replica found one, updates the scale the same way on every
// replica, and returns whether the step was taken. After the gradient all-reduce every replica holds
// the same sums, and an inf anywhere is an inf (or NaN) in every sum, so the replicas would agree
// anyway; the flag's all-reduce makes the agreement hold whatever the gradients are (a replica whose
// gradients went wrong after the reduction, a custom reduction that is not a plain sum), and it costs
// one scalar collective a step. The scaler's state (the scale, the clean steps counted towards growth,
// the skipped steps) changes only on values every replica agrees on, so mirrored scalers stay
// identical: `strategy.verify_mirrored(scalers)` compares `state_digest()`, and `save`/`load` write
// and read it for checkpoints.
//
// On a skipped step the gradients are left unscaled (and non-finite); zero them before the next step
// as usual. With gradient accumulation (`nn::compute_gradients`), scale the gradient inside the loss
// callable.

#include <distribute/config.hpp>
#include <distribute/detail/digest.hpp>
#include <distribute/detail/element_kernels.hpp>
#include <distribute/engine/serial.hpp>
#include <distribute/nn/losses.hpp>
#include <distribute/nn/parameter.hpp>
#include <distribute/optim/detail/state_buffers.hpp>
#include <distribute/optim/detail/state_io.hpp>
#include <distribute/reduce_op.hpp>
#include <distribute/tensor/shape.hpp>
#include <distribute/tensor/tensor.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <istream>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace distribute::optim {

// PyTorch's GradScaler defaults, and the range the scale is kept in.
struct loss_scale_options {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;   // the scale after growth_interval clean steps in a row: scale * growth_factor
  double backoff_factor = 0.5;  // the scale after a skipped step: scale * backoff_factor
  std::int64_t growth_interval = 2000;
  // The floor and the ceiling of the scale. The defaults are the widest range in which the scale and
  // its reciprocal are normal floats (2^-126 .. 2^126), so the scale stays a finite positive float
  // and unscaling never multiplies by a denormal (which flush-to-zero would make 0); within it the
  // scale moves as PyTorch's does. Set min_scale = 1 for TensorFlow's floor (never scale the loss down).
  double min_scale = 0x1p-126;
  double max_scale = 0x1p126;
};

namespace detail {

// 1 for an element of a chunk of g that is an inf or a NaN, 0 for a finite one (x - x is 0 exactly
// for a finite x and NaN otherwise, and NaN compares unequal to everything). Chunk s holds the
// elements [s * length, s * length + length) that are below n.
template <class T>
struct non_finite_term {
  const T* g;
  std::int64_t n, length;
  DISTRIBUTE_HOST_DEVICE double operator()(std::int64_t s, std::int64_t i) const {
    const std::int64_t j = s * length + i;
    if (j >= n) return 0.0;
    const double x = static_cast<double>(g[j]);
    return (x - x == 0.0) ? 0.0 : 1.0;
  }
};

// The elements of each chunk the engine counts as one sum (the chunks of a gradient spread over the
// CPU engine's threads; one value per chunk comes to the host).
inline constexpr std::int64_t non_finite_chunk = std::int64_t{1} << 16;

// How many elements of the spans `grads` (memory engine `e` computes on) are infs or NaNs, counted
// by the engine; only the per-chunk counts come to the host.
template <class E, class T>
double count_non_finite(E& e, const std::vector<std::span<T>>& grads) {
  std::int64_t total = 0;
  for (const auto& g : grads) {
    const auto n = static_cast<std::int64_t>(g.size());
    if (n > 0) total += (n + non_finite_chunk - 1) / non_finite_chunk;
  }
  if (total == 0) return 0;
  auto count_into = [&](double* out) {
    std::int64_t at = 0;
    for (const auto& g : grads) {
      const auto n = static_cast<std::int64_t>(g.size());
      if (n == 0) continue;
      const std::int64_t length = std::min(n, non_finite_chunk), chunks = (n + length - 1) / length;
      e.segmented_sum(chunks, length, non_finite_term<T>{g.data(), n, length}, out + at);
      at += chunks;
    }
  };
  std::vector<double> host(static_cast<std::size_t>(total));
  if constexpr (host_engine<E>) {
    count_into(host.data());
  } else {
    tensor<double, typename std::remove_cvref_t<E>::device_type> sums{shape{total}, e.device()};
    count_into(sums.data());
    e.to_host(sums.data(), host.size(), host.data());
  }
  double count = 0;
  for (double c : host) count += c;
  return count;
}

inline std::string scale_number(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace detail

class loss_scaler {
 public:
  loss_scaler() : loss_scaler(loss_scale_options{}) {}
  // std::invalid_argument for options out of range (each error names the option and its value).
  explicit loss_scaler(loss_scale_options o) : o_{o}, scale_{o.init_scale} { check(o_); }

  const loss_scale_options& options() const noexcept { return o_; }
  // The factor the loss gradient is multiplied by this step.
  double scale() const noexcept { return scale_; }
  // Clean steps since the scale last changed (growth comes when this reaches growth_interval).
  std::int64_t clean_steps() const noexcept { return clean_; }
  // Steps skipped since the scaler was made (or as loaded).
  std::int64_t skipped_steps() const noexcept { return skipped_; }

  // --- before the backward pass ---------------------------------------------------------------------

  // grad *= scale, on replica r's engine (the gradient of the loss with respect to the prediction,
  // where the backward pass starts).
  template <class R, class T, class D>
    requires requires(R& r) { r.engine(); }
  void scale_loss_gradient(R& r, tensor<T, D>& grad) const {
    scale_on(r.engine(), grad);
  }
  // The loss's gradient scaled in place; its value (for reporting) stays the unscaled loss.
  template <class R, class T, class D>
    requires requires(R& r) { r.engine(); }
  void scale_loss_gradient(R& r, nn::loss_result<T, D>& loss) const {
    scale_on(r.engine(), loss.grad);
  }
  // The same on the calling thread (a host tensor, no replica).
  template <class T>
  void scale_loss_gradient(tensor<T>& grad) const {
    distribute::serial_engine e;
    scale_on(e, grad);
  }
  template <class T>
  void scale_loss_gradient(nn::loss_result<T>& loss) const {
    scale_loss_gradient(loss.grad);
  }

  // --- after the gradient all-reduce ----------------------------------------------------------------

  // Unscales the gradients, agrees with every replica on whether any of them holds an inf or a NaN,
  // steps `optimizer` on replica r's engine unless one does, and updates the scale. Returns whether
  // the step was taken (the same on every replica). Every replica must call it, once per step.
  template <class R, class O, nn::parameterized M>
    requires requires(R& r, O& o, M& m) {
      r.engine();
      r.all_reduce(reduce_op::max, 1.0f);
      o.step(r, m);
    }
  bool step(R& r, O& optimizer, M& model) {
    const bool local = unscale_and_check(r.engine(), model);
    const bool found = r.all_reduce(reduce_op::max, local ? 1.0f : 0.0f) > 0.0f;
    if (!found) optimizer.step(r, model);
    update(found);
    return !found;
  }
  // The same on the calling thread, for one copy of a host model (nothing to agree with).
  template <class O, nn::parameterized M>
    requires distribute::detail::host_parameters<M> && requires(O& o, M& m) { o.step(m); }
  bool step(O& optimizer, M& model) {
    distribute::serial_engine e;
    const bool found = unscale_and_check(e, model);
    if (!found) optimizer.step(model);
    update(found);
    return !found;
  }

  // --- state ----------------------------------------------------------------------------------------

  // A tag, the scale (double), the clean steps and the skipped steps (int64); native byte order, like
  // the optimisers' state. The options are the program's, not state.
  void save(std::ostream& os) const {
    detail::write_tag(os, tag);
    detail::write_pod(os, scale_);
    detail::write_pod(os, clean_);
    detail::write_pod(os, skipped_);
  }
  // Replaces the state with a saved one; on an error (std::runtime_error: not a loss scaler's state,
  // truncated, or values no scaler with these options could hold) the state is unchanged.
  void load(std::istream& is) {
    char got[8]{};
    if (!is.read(got, 8)) throw std::runtime_error("distribute: truncated loss scaler state (no tag)");
    if (!std::equal(got, got + 8, tag))
      throw std::runtime_error("distribute: not a saved loss scaler state (wrong tag)");
    const auto scale = read<double>(is, "scale");
    const auto clean = read<std::int64_t>(is, "clean step count");
    const auto skipped = read<std::int64_t>(is, "skipped step count");
    if (!std::isfinite(scale) || !(scale > 0))
      throw std::runtime_error("distribute: corrupt loss scaler state: the scale is " + detail::scale_number(scale) +
                               ", not a finite positive number");
    if (scale < o_.min_scale || scale > o_.max_scale)
      throw std::runtime_error("distribute: loss scaler state with a scale of " + detail::scale_number(scale) +
                               ", outside this scaler's [min_scale, max_scale] = [" +
                               detail::scale_number(o_.min_scale) + ", " + detail::scale_number(o_.max_scale) + "]");
    if (clean < 0 || skipped < 0)
      throw std::runtime_error("distribute: corrupt loss scaler state: a negative step count (clean " +
                               std::to_string(clean) + ", skipped " + std::to_string(skipped) + ")");
    scale_ = scale;
    clean_ = clean;
    skipped_ = skipped;
  }
  // For verify_mirrored: equal on every replica while the copies agree.
  std::uint64_t state_digest() const {
    std::uint64_t h = distribute::detail::fnv1a(&scale_, sizeof scale_);
    h = distribute::detail::fnv1a(&clean_, sizeof clean_, h);
    return distribute::detail::fnv1a(&skipped_, sizeof skipped_, h);
  }

 private:
  static constexpr char tag[8] = {'s', 'c', 'a', 'l', 'e', 'r', '1', 0};
  static constexpr double lowest = 0x1p-126, highest = 0x1p126;

  static void check(const loss_scale_options& o) {
    auto fail = [](const char* name, double v, const std::string& rule) {
      throw std::invalid_argument(std::string("distribute: loss_scaler: ") + name + " is " + detail::scale_number(v) +
                                  " but " + rule);
    };
    auto in_range = [&](const char* name, double v) {
      if (!(v >= lowest && v <= highest)) fail(name, v, "must be a finite positive float in [2^-126, 2^126]");
    };
    in_range("min_scale", o.min_scale);
    in_range("max_scale", o.max_scale);
    in_range("init_scale", o.init_scale);
    if (o.min_scale > o.max_scale)
      fail("min_scale", o.min_scale, "must not exceed max_scale (" + detail::scale_number(o.max_scale) + ")");
    if (o.init_scale < o.min_scale || o.init_scale > o.max_scale)
      fail("init_scale", o.init_scale,
           "must lie in [min_scale, max_scale] = [" + detail::scale_number(o.min_scale) + ", " +
               detail::scale_number(o.max_scale) + "]");
    if (!(o.growth_factor > 1.0 && std::isfinite(o.growth_factor)))
      fail("growth_factor", o.growth_factor, "must be finite and above 1");
    if (!(o.backoff_factor > 0.0 && o.backoff_factor < 1.0))
      fail("backoff_factor", o.backoff_factor, "must be in (0, 1)");
    if (o.growth_interval < 1) fail("growth_interval", static_cast<double>(o.growth_interval), "must be at least 1");
  }

  template <class V>
  static V read(std::istream& is, const char* what) {
    V v{};
    if (!is.read(reinterpret_cast<char*>(&v), sizeof v))
      throw std::runtime_error(std::string("distribute: truncated loss scaler state (no ") + what + ")");
    return v;
  }

  template <class E, class T, class D>
  void scale_on(E& e, tensor<T, D>& grad) const {
    e.for_each(static_cast<std::int64_t>(grad.size()),
               distribute::detail::kernels::scale<T>{grad.data(), grad.data(), static_cast<T>(scale_)});
  }

  // g *= 1 / scale for every gradient of `model`, then whether any element is an inf or a NaN.
  template <class E, class M>
  bool unscale_and_check(E& e, M& model) const {
    using T = typename M::scalar_type;
    const T inverse = static_cast<T>(1.0 / scale_);
    std::vector<std::span<T>> grads;
    model.for_each_parameter([&](std::span<T>, std::span<T> g) {
      grads.push_back(g);
      e.for_each(static_cast<std::int64_t>(g.size()),
                 distribute::detail::kernels::scale<T>{g.data(), g.data(), inverse});
    });
    return detail::count_non_finite(e, grads) > 0;
  }

  // Backs off after a skipped step (to min_scale at the least); grows after growth_interval clean
  // steps in a row (to max_scale at the most).
  void update(bool skipped) {
    if (skipped) {
      scale_ = std::max(scale_ * o_.backoff_factor, o_.min_scale);
      clean_ = 0;
      ++skipped_;
    } else if (++clean_ >= o_.growth_interval) {
      scale_ = std::min(scale_ * o_.growth_factor, o_.max_scale);
      clean_ = 0;
    }
  }

  loss_scale_options o_{};
  double scale_ = 65536.0;
  std::int64_t clean_ = 0;
  std::int64_t skipped_ = 0;
};

}  // namespace distribute::optim
