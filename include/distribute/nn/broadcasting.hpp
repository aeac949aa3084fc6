#pragma once
// Arithmetic between two tensors under NumPy's (and PyTorch's) broadcasting: shapes aligned at the
// last axis, each pair of extents equal or one of them 1, which repeats. [N, C, H, W] with [C, 1, 1]
// (a per-channel shift), [N, C, 1, 1], [N, 1, H, W] (a mask) or [1] (a scalar) all fit.
//
//   auto y = nn::mul(r, x, gamma);                    // [N, C, H, W] * [C, 1, 1]
//   auto [dx, dgamma] = nn::mul_backward(r, x, gamma, dy);
//
// The gradient of an operand that was repeated is summed over the repeats (nn::sum_to, in double in
// the engine's fixed order). Operands of equal shapes take a plain element-wise pass, with the bits
// of `a + b`, `a * b`.

#include <distribute/detail/element_kernels.hpp>
#include <distribute/nn/detail/op_shapes.hpp>
#include <distribute/nn/detail/tensor_op_kernels.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/nn/reductions.hpp>

#include <cstdint>
#include <utility>

namespace distribute::nn {

namespace detail {

// Two operands walked together over the broadcast shape `out`, by rows.
inline row_walk<2> operand_rows(const shape& a, const shape& b, const shape& out) {
  const strided_map maps[2] = {broadcast_strides(a, out), broadcast_strides(b, out)};
  return rows_of(pad(out).extents, maps);
}

template <template <class> class Op, class R, class T, class D>
tensor<T, D> broadcast_apply(R& r, const char* op, const tensor<T, D>& a, const tensor<T, D>& b) {
  const shape out = broadcast_shape(op, a.shape(), b.shape());
  tensor<T, D> y{out, a.device(), uninitialized};
  if (out.numel() > 0) {
    const row_walk<2> w = operand_rows(a.shape(), b.shape(), out);
    engine_of<D>(r).for_each_in_segments(
        w.rows, w.length,
        kernels::broadcast_binary_rows<T, Op<T>>{a.data(), b.data(), y.data(), w.operands[0], w.operands[1], w.length,
                                                 Op<T>{}});
  }
  return y;
}

// The gradients of a broadcast binary operation: each operand's partial, summed to its shape. An
// operand not wanted gets an empty tensor.
template <template <class> class Op, class R, class T, class D>
std::pair<tensor<T, D>, tensor<T, D>> broadcast_gradients(R& r, const char* op, const tensor<T, D>& a,
                                                          const tensor<T, D>& b, const tensor<T, D>& dy,
                                                          bool want_a = true, bool want_b = true) {
  const shape out = broadcast_shape(op, a.shape(), b.shape());
  if (dy.shape() != out)
    throw std::invalid_argument(std::string("distribute: ") + op + " backward got dy of shape " +
                                dy.shape().to_string() + " for operands of shapes " + a.shape().to_string() + " and " +
                                b.shape().to_string() + ", whose result has shape " + out.to_string());
  const row_walk<2> w = operand_rows(a.shape(), b.shape(), out);
  auto& e = engine_of<D>(r);
  auto partial = [&]<bool First>(const shape& target) {
    tensor<T, D> g{out, a.device(), uninitialized};
    if (out.numel() > 0)
      e.for_each_in_segments(
          w.rows, w.length,
          kernels::broadcast_partial_rows<T, Op<T>, First>{a.data(), b.data(), dy.data(), g.data(), w.operands[0],
                                                           w.operands[1], w.length, Op<T>{}});
    return sum_to(r, g, target);
  };
  std::pair<tensor<T, D>, tensor<T, D>> grads;
  if (want_a) grads.first = partial.template operator()<true>(a.shape());
  if (want_b) grads.second = partial.template operator()<false>(b.shape());
  return grads;
}

}  // namespace detail

// a + b.
template <class R, class T, class D>
tensor<T, D> add(R& r, const tensor<T, D>& a, const tensor<T, D>& b) {
  if (a.shape() != b.shape()) return detail::broadcast_apply<detail::kernels::add_op>(r, "add", a, b);
  tensor<T, D> y{a.shape(), a.device(), uninitialized};
  detail::engine_of<D>(r).for_each(static_cast<std::int64_t>(a.size()),
                                   detail::kernels::sum_of<T>{a.data(), b.data(), y.data()});
  return y;
}
// a - b.
template <class R, class T, class D>
tensor<T, D> sub(R& r, const tensor<T, D>& a, const tensor<T, D>& b) {
  return detail::broadcast_apply<detail::kernels::sub_op>(r, "sub", a, b);
}
// a * b element by element.
template <class R, class T, class D>
tensor<T, D> mul(R& r, const tensor<T, D>& a, const tensor<T, D>& b) {
  if (a.shape() != b.shape()) return detail::broadcast_apply<detail::kernels::mul_op>(r, "mul", a, b);
  tensor<T, D> y{a.shape(), a.device(), uninitialized};
  detail::engine_of<D>(r).for_each(static_cast<std::int64_t>(a.size()),
                                   distribute::detail::kernels::multiply<T>{a.data(), b.data(), y.data()});
  return y;
}
// a / b element by element.
template <class R, class T, class D>
tensor<T, D> div(R& r, const tensor<T, D>& a, const tensor<T, D>& b) {
  return detail::broadcast_apply<detail::kernels::div_op>(r, "div", a, b);
}

// The gradients by hand: (dL/da, dL/db) from dL/dy, each of its operand's shape.
template <class R, class T, class D>
std::pair<tensor<T, D>, tensor<T, D>> add_backward(R& r, const tensor<T, D>& a, const tensor<T, D>& b,
                                                   const tensor<T, D>& dy) {
  return detail::broadcast_gradients<detail::kernels::add_op>(r, "add", a, b, dy);
}
template <class R, class T, class D>
std::pair<tensor<T, D>, tensor<T, D>> sub_backward(R& r, const tensor<T, D>& a, const tensor<T, D>& b,
                                                   const tensor<T, D>& dy) {
  return detail::broadcast_gradients<detail::kernels::sub_op>(r, "sub", a, b, dy);
}
template <class R, class T, class D>
std::pair<tensor<T, D>, tensor<T, D>> mul_backward(R& r, const tensor<T, D>& a, const tensor<T, D>& b,
                                                   const tensor<T, D>& dy) {
  return detail::broadcast_gradients<detail::kernels::mul_op>(r, "mul", a, b, dy);
}
template <class R, class T, class D>
std::pair<tensor<T, D>, tensor<T, D>> div_backward(R& r, const tensor<T, D>& a, const tensor<T, D>& b,
                                                   const tensor<T, D>& dy) {
  return detail::broadcast_gradients<detail::kernels::div_op>(r, "div", a, b, dy);
}

}  // namespace distribute::nn
