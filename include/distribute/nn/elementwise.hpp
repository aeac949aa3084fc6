#pragma once
// Element-wise functions that losses and penalties are written from, with PyTorch's names and
// conventions at the edges (sqrt's gradient is infinite at 0, abs's is 0 there, clamp passes the
// gradient at both bounds, softplus is x itself past its threshold), and `one_hot`.
//
//   auto y = nn::softplus(r, -score);                 // log(1 + exp(-score))
//   auto dx = nn::softplus_backward(r, x, y, dy);     // by hand: x, the forward's y, dL/dy
//
// Each runs as one pass of the replica's engine, one element per work item, on the CPU and on a GPU.
// On an nn::tape (nn/tape_ops.hpp) their gradients are recorded.

#include <distribute/nn/detail/op_kernels.hpp>
#include <distribute/nn/layer.hpp>

#include <concepts>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace distribute::nn {

namespace detail {
template <class T>
void check_clamp(T low, std::type_identity_t<T> high) {
  if (!(low <= high))
    throw std::invalid_argument("distribute: clamp to [" + std::to_string(low) + ", " + std::to_string(high) +
                                "]: the low bound is above the high one");
}
template <class T>
void check_softplus(T beta) {
  if (!(beta > T(0)))
    throw std::invalid_argument("distribute: softplus with beta " + std::to_string(beta) + "; it must be positive");
}
template <class Op, class R, class T, class D>
tensor<T, D> unary(R& r, const tensor<T, D>& x, Op op) {
  tensor<T, D> y{x.shape(), x.device(), uninitialized};
  if (x.size() > 0)
    engine_of<D>(r).for_each(static_cast<std::int64_t>(x.size()),
                             kernels::unary_forward<T, Op>{x.data(), y.data(), op});
  return y;
}
// dL/dx from x, the forward's y and dL/dy.
template <class Op, class R, class T, class D>
tensor<T, D> unary_gradient(R& r, const char* name, const tensor<T, D>& x, const tensor<T, D>& y,
                            const tensor<T, D>& dy, Op op) {
  if (x.shape() != y.shape() || dy.shape() != x.shape())
    throw std::invalid_argument(std::string("distribute: ") + name + " backward got x of shape " +
                                x.shape().to_string() + ", y of shape " + y.shape().to_string() + " and dy of shape " +
                                dy.shape().to_string() + ": the three must be equal");
  tensor<T, D> dx{x.shape(), x.device(), uninitialized};
  if (x.size() > 0)
    engine_of<D>(r).for_each(static_cast<std::int64_t>(x.size()),
                             kernels::unary_backward<T, Op>{x.data(), y.data(), dy.data(), dx.data(), op});
  return dx;
}
}  // namespace detail

// Each function `f(r, x)` and its gradient by hand `f_backward(r, x, y, dy)` (y = f(r, x)).
#define DISTRIBUTE_NN_UNARY(name, op_expr)                                                                   \
  template <class R, class T, class D>                                                                       \
  tensor<T, D> name(R& r, const tensor<T, D>& x) {                                                           \
    return detail::unary(r, x, op_expr);                                                                     \
  }                                                                                                          \
  template <class R, class T, class D>                                                                       \
  tensor<T, D> name##_backward(R& r, const tensor<T, D>& x, const tensor<T, D>& y, const tensor<T, D>& dy) { \
    return detail::unary_gradient(r, #name, x, y, dy, op_expr);                                              \
  }
DISTRIBUTE_NN_UNARY(square, detail::kernels::square_op<T>{})
DISTRIBUTE_NN_UNARY(sqrt, detail::kernels::sqrt_op<T>{})
DISTRIBUTE_NN_UNARY(exp, detail::kernels::exp_op<T>{})
DISTRIBUTE_NN_UNARY(log, detail::kernels::log_op<T>{})
DISTRIBUTE_NN_UNARY(abs, detail::kernels::abs_op<T>{})
DISTRIBUTE_NN_UNARY(sigmoid, detail::kernels::sigmoid_op<T>{})
#undef DISTRIBUTE_NN_UNARY

// x to the power p.
template <class R, class T, class D>
tensor<T, D> pow(R& r, const tensor<T, D>& x, std::type_identity_t<T> p) {
  return detail::unary(r, x, detail::kernels::pow_op<T>{p});
}
template <class R, class T, class D>
tensor<T, D> pow_backward(R& r, const tensor<T, D>& x, const tensor<T, D>& y, const tensor<T, D>& dy,
                          std::type_identity_t<T> p) {
  return detail::unary_gradient(r, "pow", x, y, dy, detail::kernels::pow_op<T>{p});
}

// x limited to [low, high].
template <class R, class T, class D>
tensor<T, D> clamp(R& r, const tensor<T, D>& x, std::type_identity_t<T> low, std::type_identity_t<T> high) {
  detail::check_clamp(low, high);
  return detail::unary(r, x, detail::kernels::clamp_op<T>{low, high});
}
template <class R, class T, class D>
tensor<T, D> clamp_backward(R& r, const tensor<T, D>& x, const tensor<T, D>& y, const tensor<T, D>& dy,
                            std::type_identity_t<T> low, T high) {
  return detail::unary_gradient(r, "clamp", x, y, dy, detail::kernels::clamp_op<T>{low, high});
}

// log(1 + exp(beta x)) / beta, and x where beta x > threshold (PyTorch's Softplus(beta, threshold)).
template <class R, class T, class D>
tensor<T, D> softplus(R& r, const tensor<T, D>& x, std::type_identity_t<T> beta = T(1),
                      std::type_identity_t<T> threshold = T(20)) {
  detail::check_softplus(beta);
  return detail::unary(r, x, detail::kernels::softplus_op<T>{beta, threshold});
}
template <class R, class T, class D>
tensor<T, D> softplus_backward(R& r, const tensor<T, D>& x, const tensor<T, D>& y, const tensor<T, D>& dy,
                               std::type_identity_t<T> beta = T(1), std::type_identity_t<T> threshold = T(20)) {
  return detail::unary_gradient(r, "softplus", x, y, dy, detail::kernels::softplus_op<T>{beta, threshold});
}

// [N, classes] rows of zeros with a 1 at each label (PyTorch's one_hot, as T): labels from the host,
// each checked, the rows made on the replica's device by its engine.
template <class T, class R, std::integral I>
tensor<T, typename R::device_type> one_hot(R& r, std::span<const I> labels, std::int64_t classes) {
  using D = typename R::device_type;
  if (classes < 1) throw std::invalid_argument("distribute: one_hot with " + std::to_string(classes) + " classes");
  std::vector<std::int64_t> l(labels.size());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || static_cast<std::int64_t>(labels[i]) >= classes)
      throw std::invalid_argument("distribute: one_hot label " + std::to_string(labels[i]) + " at position " +
                                  std::to_string(i) + " is outside [0, " + std::to_string(classes) + ")");
    l[i] = static_cast<std::int64_t>(labels[i]);
  }
  const auto n = static_cast<std::int64_t>(l.size());
  const auto on_device = tensor<std::int64_t, D>::from_host(shape{n}, std::span<const std::int64_t>(l), r.device());
  tensor<T, D> y{shape{n, classes}, r.device(), uninitialized};
  if (n > 0)
    detail::engine_of<D>(r).for_each_in_segments(n, classes,
                                                 detail::kernels::one_hot_rows<T>{on_device.data(), y.data(), classes});
  return y;
}
template <class T, class R, std::integral I>
tensor<T, typename R::device_type> one_hot(R& r, const std::vector<I>& labels, std::int64_t classes) {
  return one_hot<T>(r, std::span<const I>(labels), classes);
}

}  // namespace distribute::nn
