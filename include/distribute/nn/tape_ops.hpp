#pragma once
// The operations between layers recorded on an nn::tape: the same names and arguments as by hand,
// with the tape in place of the replica and its variables in place of tensors.
//
//   nn::tape t{r};
//   auto h = t(encoder, t.watch(x));
//   auto z = nn::reshape(t, h, {-1, 64, 7, 7});
//   auto score = nn::sum(t, nn::mul(t, embed_y, features), 1);        // a projection term
//   auto loss = nn::mean(t, nn::softplus(t, nn::scale(t, score, -1.0f)));
//   t.backward(loss);                                                 // dL/dL = 1
//
// Each records the backward of nn/shape_ops.hpp, nn/reductions.hpp, nn/broadcasting.hpp and
// nn/elementwise.hpp; a function's gradient recomputes f(x) from x where it needs y, rather than keep
// a second tensor per call. argmax and one_hot have no gradient: use them by hand (t.constant).
// Each also has a recorded backward, so a gradient taken with nn::create_graph passes through it
// (the linear ones to any order; a function's to the second).

#include <distribute/nn/broadcasting.hpp>
#include <distribute/nn/elementwise.hpp>
#include <distribute/nn/reductions.hpp>
#include <distribute/nn/shape_ops.hpp>
#include <distribute/nn/tape.hpp>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <type_traits>

namespace distribute::nn {

namespace detail {
// dx = dy * f'(x) with y = f(x) recomputed.
template <class T, class Op>
struct unary_backward_from_x {
  const T* x;
  const T* dy;
  T* dx;
  Op op;
  static constexpr std::int64_t block_size = lanes::width;
  DISTRIBUTE_HOST_DEVICE void operator()(std::int64_t i) const { dx[i] = dy[i] * op.derivative(x[i], op.value(x[i])); }
  // The same values a block at a time (kernels::unary_forward's run_block): f'(x) from its own block
  // where the operation has one, else from f(x)'s.
  void run_block(std::int64_t i, std::int64_t count) const
    requires kernels::derivative_in_blocks<Op, T> || kernels::value_in_blocks<Op, T>
  {
    float d[lanes::width];
    if constexpr (kernels::derivative_in_blocks<Op, T>) {
      kernels::through_block(x + i, d, count, [this](const float* a, float* b) { op.derivative_block(a, b); });
    } else {
      float v[lanes::width];
      kernels::through_block(x + i, v, count, [this](const float* a, float* b) { op.value_block(a, b); });
      for (std::int64_t l = 0; l < count; ++l) d[l] = op.derivative(x[i + l], v[l]);
    }
    for (std::int64_t l = 0; l < count; ++l) dx[i + l] = dy[i + l] * d[l];
  }
};

// y = f(x); its recorded backward (create_graph) is dy * f'(x), with f' an operation of its own
// whose derivative is f'' (an operation without one has no recorded backward).
template <class R, class T, class Op>
typename tape<R, T>::variable record_unary(tape<R, T>& t, typename tape<R, T>::variable x, Op op) {
  using D = typename R::device_type;
  using V = typename tape<R, T>::variable;
  auto dx_of = [&t, x, op](const tensor<T, D>& dy) {
    tensor<T, D> dx{dy.shape(), dy.device(), uninitialized};
    if (dy.size() > 0)
      engine_of<D>(t.replica())
          .for_each(static_cast<std::int64_t>(dy.size()),
                    unary_backward_from_x<T, Op>{x.value().data(), dy.data(), dx.data(), op});
    return dx;
  };
  if constexpr (requires(T v) { op.second(v); })
    return t.record_operation(Op::name, unary(t.replica(), x.value(), op), x, std::move(dx_of), [&t, x, op](V dy) {
      return t.mul(dy, record_unary(t, x, kernels::derivative_of<Op>{op}));
    });
  else
    return t.record_operation(Op::name, unary(t.replica(), x.value(), op), x, std::move(dx_of),
                              typename tape<R, T>::no_rule{});
}

// A sum or mean over the axes `mask` marks (linear in x): its gradient is dy spread back over them,
// times k.
template <class R, class T, class F>
typename tape<R, T>::variable record_reduction(tape<R, T>& t, typename tape<R, T>::variable x, F reduce,
                                               const std::array<bool, shape::max_rank>& mask, T k) {
  using D = typename R::device_type;
  const shape kept = reduced_shape(x.shape(), mask, true), from = x.shape();
  return t.linear_map("a reduction", x, std::move(reduce), [&t, kept, from, k](const tensor<T, D>& dy) {
    tensor<T, D> g = dy;
    g.reshape(kept);
    tensor<T, D> dx = broadcast_to(t.replica(), g, from);
    if (k != T(1)) dx = scale(t.replica(), dx, k);
    return dx;
  });
}
}  // namespace detail

template <class R, class T>
using tape_variable = typename tape<R, T>::variable;

// Shapes.
template <class R, class T>
tape_variable<R, T> reshape(tape<R, T>& t, tape_variable<R, T> x, std::initializer_list<std::int64_t> target) {
  return t.reshape(x, detail::inferred_shape(x.shape(), target));
}
template <class R, class T>
tape_variable<R, T> reshape(tape<R, T>& t, tape_variable<R, T> x, const shape& target) {
  return t.reshape(x, target);
}
template <class R, class T>
tape_variable<R, T> view(tape<R, T>& t, tape_variable<R, T> x, std::initializer_list<std::int64_t> target) {
  return reshape(t, x, target);
}
template <class R, class T>
tape_variable<R, T> permute(tape<R, T>& t, tape_variable<R, T> x, std::initializer_list<int> order) {
  const auto o = detail::checked_order("permute", x.shape(), order);
  const auto inverse = detail::inverse_order(o, x.shape().rank());
  return t.linear_map(
      "permute", x, [&t, o](const auto& v) { return detail::permuted(t.replica(), v, o); },
      [&t, inverse](const auto& dy) { return detail::permuted(t.replica(), dy, inverse); });
}
template <class R, class T>
tape_variable<R, T> transpose(tape<R, T>& t, tape_variable<R, T> x, int a, int b) {
  const auto swap = [&t, a, b](const auto& v) { return transpose(t.replica(), v, a, b); };
  return t.linear_map("transpose", x, swap, swap);
}
// x repeated along its axes of extent 1 (nn::broadcast_to); g summed down to `target` (nn::sum_to).
template <class R, class T>
tape_variable<R, T> broadcast_to(tape<R, T>& t, tape_variable<R, T> x, const shape& target) {
  return t.broadcast_to(x, target);
}
template <class R, class T>
tape_variable<R, T> sum_to(tape<R, T>& t, tape_variable<R, T> x, const shape& target) {
  return t.sum_to(x, target);
}

// Reductions.
template <class R, class T>
tape_variable<R, T> sum(tape<R, T>& t, tape_variable<R, T> x, const dims& axes, bool keepdim = false) {
  const auto mask = detail::axis_mask("sum", x.shape(), axes);
  return detail::record_reduction(
      t, x, [&t, axes, keepdim](const auto& v) { return sum(t.replica(), v, axes, keepdim); }, mask, T(1));
}
template <class R, class T>
tape_variable<R, T> sum(tape<R, T>& t, tape_variable<R, T> x) {
  return detail::record_reduction(
      t, x, [&t](const auto& v) { return sum(t.replica(), v); }, detail::every_axis(x.shape()), T(1));
}
template <class R, class T>
tape_variable<R, T> mean(tape<R, T>& t, tape_variable<R, T> x, const dims& axes, bool keepdim = false) {
  const auto mask = detail::axis_mask("mean", x.shape(), axes);
  const std::int64_t count = detail::reduced_shape(x.shape(), mask, true).numel();
  const T k = count == 0 || x.shape().numel() == 0 ? T(0) : T(1) / static_cast<T>(x.shape().numel() / count);
  return detail::record_reduction(
      t, x, [&t, axes, keepdim](const auto& v) { return mean(t.replica(), v, axes, keepdim); }, mask, k);
}
template <class R, class T>
tape_variable<R, T> mean(tape<R, T>& t, tape_variable<R, T> x) {
  return detail::record_reduction(
      t, x, [&t](const auto& v) { return mean(t.replica(), v); }, detail::every_axis(x.shape()),
      T(1) / static_cast<T>(x.shape().numel()));
}
// The maximum's gradient goes to the first maximal element of each reduced group; recorded
// (create_graph), it is that scatter as an operation linear in dy.
template <class R, class T>
tape_variable<R, T> max(tape<R, T>& t, tape_variable<R, T> x, const dims& axes, bool keepdim = false) {
  using D = typename R::device_type;
  auto [v, p] = max_and_argmax(t.replica(), x.value(), axes, keepdim);
  auto places = std::make_shared<tensor<std::int64_t, D>>(std::move(p));
  const shape from = x.shape(), to = v.shape();
  const auto scatter = [&t, from, axes, places](const tensor<T, D>& dy) {
    return max_backward(t.replica(), from, axes, *places, dy);
  };
  return t.record_operation(std::move(v), x, scatter, [&t, scatter, to, axes, keepdim](tape_variable<R, T> dy) {
    tensor<T, D> ones{to, t.replica().device(), uninitialized};
    ones.fill(T(1), 0, ones.size());
    auto mask = std::make_shared<tensor<T, D>>(scatter(ones));
    return t.linear_map("max's gradient", dy, scatter, [&t, mask, axes, keepdim](const tensor<T, D>& g) {
      return sum(t.replica(), mul(t.replica(), g, *mask), axes, keepdim);
    });
  });
}
template <class R, class T>
tape_variable<R, T> max(tape<R, T>& t, tape_variable<R, T> x) {
  return max(t, x, dims::all(x.shape().rank()), false);
}

// Broadcasting arithmetic.
template <class R, class T>
tape_variable<R, T> add(tape<R, T>& t, tape_variable<R, T> a, tape_variable<R, T> b) {
  return t.add(a, b);
}
template <class R, class T>
tape_variable<R, T> sub(tape<R, T>& t, tape_variable<R, T> a, tape_variable<R, T> b) {
  return t.sub(a, b);
}
template <class R, class T>
tape_variable<R, T> mul(tape<R, T>& t, tape_variable<R, T> a, tape_variable<R, T> b) {
  return t.mul(a, b);
}
template <class R, class T>
tape_variable<R, T> div(tape<R, T>& t, tape_variable<R, T> a, tape_variable<R, T> b) {
  return t.div(a, b);
}
template <class R, class T>
tape_variable<R, T> scale(tape<R, T>& t, tape_variable<R, T> x, std::type_identity_t<T> k) {
  return t.scale(x, k);
}

// Functions.
template <class R, class T>
tape_variable<R, T> square(tape<R, T>& t, tape_variable<R, T> x) {
  return detail::record_unary(t, x, detail::kernels::square_op<T>{});
}
template <class R, class T>
tape_variable<R, T> sqrt(tape<R, T>& t, tape_variable<R, T> x) {
  return detail::record_unary(t, x, detail::kernels::sqrt_op<T>{});
}
template <class R, class T>
tape_variable<R, T> exp(tape<R, T>& t, tape_variable<R, T> x) {
  return detail::record_unary(t, x, detail::kernels::exp_op<T>{});
}
template <class R, class T>
tape_variable<R, T> log(tape<R, T>& t, tape_variable<R, T> x) {
  return detail::record_unary(t, x, detail::kernels::log_op<T>{});
}
template <class R, class T>
tape_variable<R, T> abs(tape<R, T>& t, tape_variable<R, T> x) {
  return detail::record_unary(t, x, detail::kernels::abs_op<T>{});
}
template <class R, class T>
tape_variable<R, T> sigmoid(tape<R, T>& t, tape_variable<R, T> x) {
  return detail::record_unary(t, x, detail::kernels::sigmoid_op<T>{});
}
template <class R, class T>
tape_variable<R, T> pow(tape<R, T>& t, tape_variable<R, T> x, std::type_identity_t<T> p) {
  return detail::record_unary(t, x, detail::kernels::pow_op<T>{p});
}
template <class R, class T>
tape_variable<R, T> clamp(tape<R, T>& t, tape_variable<R, T> x, std::type_identity_t<T> low,
                          std::type_identity_t<T> high) {
  detail::check_clamp<T>(low, high);
  return detail::record_unary(t, x, detail::kernels::clamp_op<T>{low, high});
}
template <class R, class T>
tape_variable<R, T> softplus(tape<R, T>& t, tape_variable<R, T> x, std::type_identity_t<T> beta = T(1),
                             std::type_identity_t<T> threshold = T(20)) {
  detail::check_softplus<T>(beta);
  return detail::record_unary(t, x, detail::kernels::softplus_op<T>{beta, threshold});
}

}  // namespace distribute::nn
