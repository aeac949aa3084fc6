#pragma once
// Gradient penalties on a discriminator's input gradient, each one call on a tape:
//
//   R1 (Mescheder et al. 2018)       r1_penalty(t, real, d)        gamma/2 * mean_i ||dD(x_i)/dx_i||^2, x real
//   R2                               r2_penalty(t, fake, d)        the same on generated images
//   WGAN-GP (Gulrajani et al. 2017)  gradient_penalty(t, real, fake, d)
//                                    lambda * mean_i (||dD(x^_i)/dx^_i|| - 1)^2, x^ = fake + alpha (real - fake)
//
// `d` is the discriminator as a callable from a variable to its score (any shape: the scores are
// summed before the gradient, as `autograd.grad(d(x).sum(), x, create_graph=True)`), e.g.
// `[&](auto x) { return t(disc, x, labels); }`. Each returns a one-element variable to add to the
// discriminator's loss before `t.backward(loss)`: its gradient reaches the discriminator's parameters
// through the input gradient (tape::gradient with nn::create_graph), so every layer between the input
// and the score needs a recorded backward (docs/nn.md, "Gradient penalties"). The images are new
// inputs of the tape: no gradient flows from a penalty into whatever made them (the generator).
//
// Lazy regularisation (StyleGAN2): with `every = k`, the penalty is computed at the steps that are
// multiples of k and weighted by k, and is a zero constant (nothing recorded, nothing computed) at the
// others. Under a strategy, give the global batch (penalty_options::global_batch) as to the losses.
// WGAN-GP draws alpha ~ U(0, 1] per example from `seed`, the step and the replica's id: the
// same on a rerun, different across replicas and steps. Under a strategy each replica computes its
// penalty on its own examples, and the parameter gradients all-reduce with the rest.

#include <distribute/nn/detail/option_check.hpp>
#include <distribute/nn/detail/random.hpp>
#include <distribute/nn/tape_ops.hpp>

#include <cmath>
#include <concepts>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute::nn {

// Defaults: weight 10 (StyleGAN2's gamma for R1 at 1024 px; WGAN-GP's lambda), applied every step.
struct penalty_options {
  double weight = 10.0;    // R1 and R2: gamma (the penalty is gamma / 2 times the mean squared norm); WGAN-GP: lambda
  std::int64_t every = 1;  // lazy regularisation: applied at steps that are multiples of `every`, weighted by `every`
  std::uint64_t seed = 0;  // WGAN-GP: the interpolation draws (with the step and the replica's id)
  // The examples the mean runs over, across all replicas: the global batch, as the losses take it
  // (nn::l1(r, y, target, global_batch)), so that the all-reduced (summed) gradients are those of the
  // mean over the global batch. 0: this replica's batch (one device).
  std::int64_t global_batch = 0;
};

namespace detail {

template <class F, class V>
concept scores_of = requires(F& f, V x) {
  { f(x) } -> std::same_as<V>;
};

inline void check(const char* penalty, const penalty_options& o, std::int64_t step) {
  const penalty_options d;
  const option_check c(penalty, "{weight " + short_number(o.weight) + ", every " + std::to_string(o.every) + "}");
  c.require(std::isfinite(o.weight) && o.weight >= 0, "weight", o.weight, d.weight, "must be finite and at least 0");
  c.at_least("every", o.every, d.every, 1);
  c.at_least("global_batch", o.global_batch, d.global_batch, 0);
  if (step < 0)
    throw std::invalid_argument(std::string("distribute: ") + penalty + " at step " + std::to_string(step) +
                                ": steps count from 0");
}

// A batch of at least one example along the first axis.
inline void check_batch(const char* penalty, const shape& s) {
  if (s.rank() < 2 || s[0] == 0)
    throw std::invalid_argument(std::string("distribute: ") + penalty + " of a batch of shape " + s.to_string() +
                                ": it takes at least one example along the first axis");
}

// Every axis but the batch's (a tensor of rank 2 to 4).
inline dims example_axes(const shape& s) {
  switch (s.rank()) {
    case 2: return dims{1};
    case 3: return dims{1, 2};
    default: return dims{1, 2, 3};
  }
}

// A one-element zero through which nothing flows: the penalty at a step lazy regularisation skips.
template <class R, class T>
tape_variable<R, T> no_penalty(tape<R, T>& t) {
  return t.constant(tensor<T, typename R::device_type>{shape{}, t.replica().device()});
}

// dD/dx at x (a new input of the tape), recorded.
template <class R, class T, class F>
tape_variable<R, T> input_gradient(tape<R, T>& t, const tensor<T, typename R::device_type>& x, F& discriminator,
                                   const char* penalty) {
  static_assert(scores_of<F, tape_variable<R, T>>,
                "distribute: a gradient penalty's discriminator is a callable from the tape's variable to the "
                "score's variable, e.g. [&](auto x) { return t(disc, x); }");
  check_batch(penalty, x.shape());
  const tape_variable<R, T> in = t.watch(x);
  return t.gradient(sum(t, discriminator(in)), in, create_graph);
}

// The mean over the global batch: the sum of this replica's terms divided by o.global_batch (or by
// its own batch), times `weight`.
template <class R, class T>
tape_variable<R, T> weighted_mean(tape<R, T>& t, tape_variable<R, T> terms, const penalty_options& o, double weight) {
  const std::int64_t n = o.global_batch > 0 ? o.global_batch : terms.shape()[0];
  return scale(t, sum(t, terms), static_cast<T>(weight / static_cast<double>(n)));
}

// weight * mean_i ||g_i||^2.
template <class R, class T>
tape_variable<R, T> mean_squared_norm(tape<R, T>& t, tape_variable<R, T> g, const penalty_options& o, double weight) {
  return weighted_mean(t, sum(t, square(t, g), example_axes(g.shape())), o, weight);
}

// R1 or R2 (`penalty` names it in errors): gamma/2 * mean over the examples of ||d sum(D(x)) / dx||^2.
template <class R, class T, class F>
tape_variable<R, T> squared_norm_penalty(const char* penalty, tape<R, T>& t,
                                         const tensor<T, typename R::device_type>& x, F& discriminator,
                                         const penalty_options& o, std::int64_t step) {
  check(penalty, o, step);
  if (step % o.every != 0) return no_penalty(t);
  const auto g = input_gradient(t, x, discriminator, penalty);
  return mean_squared_norm(t, g, o, o.weight / 2 * static_cast<double>(o.every));
}
// The same from a forward already made: `x` watched by the tape, `scores` D's output on it.
template <class R, class T>
tape_variable<R, T> squared_norm_penalty(const char* penalty, tape<R, T>& t, tape_variable<R, T> x,
                                         tape_variable<R, T> scores, const penalty_options& o, std::int64_t step) {
  check(penalty, o, step);
  if (step % o.every != 0) return no_penalty(t);
  check_batch(penalty, x.shape());
  const auto g = t.gradient(sum(t, scores), x, create_graph);
  return mean_squared_norm(t, g, o, o.weight / 2 * static_cast<double>(o.every));
}

}  // namespace detail

// R1: gamma/2 * mean over the examples of ||d sum(D(x)) / dx||^2 at the real images x.
template <class R, class T, class F>
tape_variable<R, T> r1_penalty(tape<R, T>& t, const tensor<T, typename R::device_type>& real, F&& discriminator,
                               penalty_options o = {}, std::int64_t step = 0) {
  return detail::squared_norm_penalty("r1_penalty", t, real, discriminator, o, step);
}

// R2: the same at generated images (detached: no gradient reaches the generator).
template <class R, class T, class F>
tape_variable<R, T> r2_penalty(tape<R, T>& t, const tensor<T, typename R::device_type>& fake, F&& discriminator,
                               penalty_options o = {}, std::int64_t step = 0) {
  return detail::squared_norm_penalty("r2_penalty", t, fake, discriminator, o, step);
}

// R1 and R2 sharing a forward the loss has made already (the form PyTorch code usually takes, with
// `real.requires_grad_()`): `x` the tape's variable of the images (t.watch(images)) and `scores`
// the discriminator's output on it. One forward of D fewer than the forms above.
template <class R, class T>
tape_variable<R, T> r1_penalty(tape<R, T>& t, tape_variable<R, T> x, tape_variable<R, T> scores, penalty_options o = {},
                               std::int64_t step = 0) {
  return detail::squared_norm_penalty("r1_penalty", t, x, scores, o, step);
}
template <class R, class T>
tape_variable<R, T> r2_penalty(tape<R, T>& t, tape_variable<R, T> x, tape_variable<R, T> scores, penalty_options o = {},
                               std::int64_t step = 0) {
  return detail::squared_norm_penalty("r2_penalty", t, x, scores, o, step);
}

// WGAN-GP's interpolation weights: one alpha in (0, 1] per example, from the seed, the step and the
// replica's id.
inline std::vector<double> interpolation_weights(std::int64_t examples, std::uint64_t seed, std::int64_t step,
                                                 int replica_id) {
  detail::splitmix64 gen{detail::sub_seed(detail::sub_seed(seed, static_cast<std::uint64_t>(replica_id)),
                                          static_cast<std::uint64_t>(step))};
  std::vector<double> alpha(static_cast<std::size_t>(examples));
  for (double& a : alpha) a = gen.uniform();
  return alpha;
}

// WGAN-GP's penalty at given points x^: lambda * mean_i (||d sum(D(x^)) / dx^_i|| - 1)^2 (the norm is
// 2-norm over each example's values; its derivative is infinite where a gradient is exactly zero,
// as PyTorch's sqrt-of-sum spelling is).
template <class R, class T, class F>
tape_variable<R, T> gradient_penalty_at(tape<R, T>& t, const tensor<T, typename R::device_type>& points,
                                        F&& discriminator, penalty_options o = {}) {
  detail::check("gradient_penalty", o, 0);
  const auto g = detail::input_gradient(t, points, discriminator, "gradient_penalty");
  const auto norm = sqrt(t, sum(t, square(t, g), detail::example_axes(g.shape())));
  tensor<T, typename R::device_type> one{shape{1}, t.replica().device(), uninitialized};
  one.fill(T(1), 0, 1);
  const auto off = sub(t, norm, t.constant(std::move(one)));
  return detail::weighted_mean(t, square(t, off), o, o.weight * static_cast<double>(o.every));
}

// WGAN-GP: the penalty at x^ = fake + alpha (real - fake), alpha drawn per example
// (interpolation_weights with the replica's id).
template <class R, class T, class F>
tape_variable<R, T> gradient_penalty(tape<R, T>& t, const tensor<T, typename R::device_type>& real,
                                     const tensor<T, typename R::device_type>& fake, F&& discriminator,
                                     penalty_options o = {}, std::int64_t step = 0) {
  using D = typename R::device_type;
  detail::check("gradient_penalty", o, step);
  if (real.shape() != fake.shape())
    throw std::invalid_argument("distribute: gradient_penalty of real images of shape " + real.shape().to_string() +
                                " and generated ones of shape " + fake.shape().to_string() + ": they must match");
  if (step % o.every != 0) return detail::no_penalty(t);
  auto& r = t.replica();
  int replica_id = 0;
  if constexpr (requires { r.replica_id(); }) replica_id = r.replica_id();
  const shape s = real.shape();
  detail::check_batch("gradient_penalty", s);
  const std::vector<double> drawn = interpolation_weights(s[0], o.seed, step, replica_id);
  const std::vector<T> alpha(drawn.begin(), drawn.end());
  std::vector<std::int64_t> extents(s.rank(), 1);
  extents[0] = s[0];
  const shape per_example = shape::from_extents(extents);
  const auto a = tensor<T, D>::from_host(per_example, std::span<const T>(alpha), r.device());
  const tensor<T, D> points = add(r, fake, mul(r, a, sub(r, real, fake)));
  return gradient_penalty_at(t, points, discriminator, o);
}

}  // namespace distribute::nn
