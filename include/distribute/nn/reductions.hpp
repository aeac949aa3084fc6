#pragma once
// Reductions over chosen axes (PyTorch's sum, mean, amax and argmax with `dim` and `keepdim`), and
// the two shape moves that are their gradients: `broadcast_to` (a sum's gradient spread back over
// the axes it summed) and `sum_to` (a broadcast's gradient summed down to its operand's shape).
//
//   auto s = nn::sum(r, x, {2, 3}, true);         // [N, C, H, W] -> [N, C, 1, 1]
//   auto m = nn::mean(r, x);                      // over all: a rank-0 tensor of one element
//   auto p = nn::argmax(r, logits, 1);            // [N, K] -> [N] class indices (std::int64_t)
//
// Sums and means add in double in the engine's fixed order (segmented_sum), so no result depends on
// the thread count, and are rounded to T once. The maximum takes the first of equal maxima (and a
// NaN over every number, as PyTorch's); its gradient goes to that element alone. Without `keepdim`
// the reduced axes are dropped: a reduction over every axis gives a shape of rank 0 (one element).

#include <distribute/nn/detail/op_shapes.hpp>
#include <distribute/nn/layer.hpp>

#include <array>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace distribute::nn {

namespace detail {

inline std::array<bool, shape::max_rank> every_axis(const shape& s) {
  std::array<bool, shape::max_rank> m{};
  for (std::size_t i = 0; i < s.rank(); ++i) m[i] = true;
  return m;
}

// out[s] = the sum of reduction `m`'s terms of segment s: through one stride each where the kept and
// the reduced axes merge into one (a plane's sum, a batch's, the whole tensor's), which the CPU's
// fixed-order loop vectorises; through the general walk elsewhere. The same terms in the same order.
template <class E, class T>
void sum_terms(E& e, const reduction_maps& m, const T* x, double* out) {
  const auto one_axis = [](const strided_map& w) { return w.axes <= 1; };
  if (one_axis(m.kept) && one_axis(m.reduced))
    e.segmented_sum(
        m.segments, m.length,
        kernels::strided_term<T>{x, m.kept.axes ? m.kept.strides[3] : 0, m.reduced.axes ? m.reduced.strides[3] : 0},
        out);
  else e.segmented_sum(m.segments, m.length, kernels::reduction_term<T>{x, m.kept, m.reduced}, out);
}

// The sum of reduction `m`'s terms of x, times `per_term`, as `out_shape`.
template <class R, class T, class D>
tensor<T, D> scaled_sum(R& r, const tensor<T, D>& x, const reduction_maps& m, const shape& out_shape, double per_term) {
  tensor<T, D> y{out_shape, x.device(), uninitialized};
  if (m.segments == 0) return y;
  auto& e = engine_of<D>(r);
  if (m.length == 0) {  // a sum of nothing is 0, a mean of nothing NaN (0 times an infinite 1 / count)
    y.fill(static_cast<T>(0.0 * per_term), 0, y.size());
    return y;
  }
  tensor<double, D> sums{shape{m.segments}, x.device(), uninitialized};
  sum_terms(e, m, x.data(), sums.data());
  e.for_each(m.segments, kernels::scaled_from_double<T>{sums.data(), y.data(), per_term});
  return y;
}
// The same over the axes of `mask`.
template <class R, class T, class D>
tensor<T, D> scaled_sum(R& r, const tensor<T, D>& x, const std::array<bool, shape::max_rank>& mask,
                        const shape& out_shape, double per_term) {
  return scaled_sum(r, x, reduction_of(x.shape(), padded_mask(x.shape(), mask)), out_shape, per_term);
}

// The maximum over `mask` and where it is (an index into the reduced axes, row-major).
template <class R, class T, class D>
std::pair<tensor<T, D>, tensor<std::int64_t, D>> max_and_place(R& r, const char* op, const tensor<T, D>& x,
                                                               const std::array<bool, shape::max_rank>& mask,
                                                               const shape& out_shape) {
  const reduction_maps m = reduction_of(x.shape(), padded_mask(x.shape(), mask));
  if (m.length == 0 && m.segments > 0)
    throw std::invalid_argument(std::string("distribute: ") + op + " over an axis of extent 0 of a tensor of shape " +
                                x.shape().to_string() + ": the maximum of nothing");
  constexpr std::int64_t chunk = 256;
  auto& e = engine_of<D>(r);
  std::int64_t length = m.length;
  tensor<T, D> values;
  tensor<std::int64_t, D> places;
  bool first = true;
  do {
    const std::int64_t chunks = (length + chunk - 1) / chunk;
    tensor<T, D> v{shape{m.segments * chunks}, x.device(), uninitialized};
    tensor<std::int64_t, D> p{shape{m.segments * chunks}, x.device(), uninitialized};
    if (m.segments > 0)
      e.for_each_in_segments(
          m.segments, chunks,
          kernels::max_chunk_pass<T>{first ? x.data() : nullptr, m.kept, m.reduced, first ? nullptr : values.data(),
                                     first ? nullptr : places.data(), length, chunk, v.data(), p.data(), chunks});
    values = std::move(v);
    places = std::move(p);
    length = chunks;
    first = false;
  } while (length > 1);
  values.reshape(out_shape);
  places.reshape(out_shape);
  return {std::move(values), std::move(places)};
}

inline shape aligned_target(const char* op, const shape& from, const shape& target) {
  bool fit = target.rank() <= from.rank();
  const padded_shape pf = pad(from), pt = pad(target);
  for (int k = 0; fit && k < 4; ++k) fit = pt.extents[k] == pf.extents[k] || pt.extents[k] == 1;
  if (!fit)
    throw std::invalid_argument(
        std::string("distribute: ") + op + " of a tensor of shape " + from.to_string() + " to shape " +
        target.to_string() + ": each extent of the target, aligned at the last axis, must equal the tensor's or be 1");
  return target;
}

}  // namespace detail

// The sum over `axes` (every axis when none are given).
template <class R, class T, class D>
tensor<T, D> sum(R& r, const tensor<T, D>& x, const dims& axes, bool keepdim = false) {
  const auto mask = detail::axis_mask("sum", x.shape(), axes);
  return detail::scaled_sum(r, x, mask, detail::reduced_shape(x.shape(), mask, keepdim), 1.0);
}
template <class R, class T, class D>
tensor<T, D> sum(R& r, const tensor<T, D>& x) {
  const auto mask = detail::every_axis(x.shape());
  return detail::scaled_sum(r, x, mask, detail::reduced_shape(x.shape(), mask, false), 1.0);
}

// The mean over `axes` (every axis when none are given); over no elements, NaN as PyTorch's.
template <class R, class T, class D>
tensor<T, D> mean(R& r, const tensor<T, D>& x, const dims& axes, bool keepdim = false) {
  const auto mask = detail::axis_mask("mean", x.shape(), axes);
  const shape out = detail::reduced_shape(x.shape(), mask, keepdim);
  const std::int64_t count = out.numel() == 0 ? 0 : x.shape().numel() / out.numel();
  return detail::scaled_sum(r, x, mask, out, 1.0 / static_cast<double>(count));
}
template <class R, class T, class D>
tensor<T, D> mean(R& r, const tensor<T, D>& x) {
  const auto mask = detail::every_axis(x.shape());
  return detail::scaled_sum(r, x, mask, detail::reduced_shape(x.shape(), mask, false),
                            1.0 / static_cast<double>(x.shape().numel()));
}

// The maximum over `axes` (PyTorch's amax; every axis when none are given).
template <class R, class T, class D>
tensor<T, D> max(R& r, const tensor<T, D>& x, const dims& axes, bool keepdim = false) {
  const auto mask = detail::axis_mask("max", x.shape(), axes);
  return detail::max_and_place(r, "max", x, mask, detail::reduced_shape(x.shape(), mask, keepdim)).first;
}
template <class R, class T, class D>
tensor<T, D> max(R& r, const tensor<T, D>& x) {
  const auto mask = detail::every_axis(x.shape());
  return detail::max_and_place(r, "max", x, mask, detail::reduced_shape(x.shape(), mask, false)).first;
}

// Where the maximum along `axis` is (the first of equal maxima); no gradient flows through it.
template <class R, class T, class D>
tensor<std::int64_t, D> argmax(R& r, const tensor<T, D>& x, int axis, bool keepdim = false) {
  const auto mask = detail::axis_mask("argmax", x.shape(), dims{axis});
  return detail::max_and_place(r, "argmax", x, mask, detail::reduced_shape(x.shape(), mask, keepdim)).second;
}
// Over the flattened tensor (PyTorch's argmax without dim): a rank-0 tensor.
template <class R, class T, class D>
tensor<std::int64_t, D> argmax(R& r, const tensor<T, D>& x) {
  const auto mask = detail::every_axis(x.shape());
  return detail::max_and_place(r, "argmax", x, mask, detail::reduced_shape(x.shape(), mask, false)).second;
}

// x repeated along its axes of extent 1 to `target` (NumPy's broadcast_to): the gradient of a sum
// with keepdim. Aligned at the last axis.
template <class R, class T, class D>
tensor<T, D> broadcast_to(R& r, const tensor<T, D>& x, const shape& target) {
  if (detail::broadcast_shape("broadcast_to", x.shape(), target) != target)
    throw std::invalid_argument("distribute: broadcast_to of a tensor of shape " + x.shape().to_string() +
                                " to shape " + target.to_string() + ": the result would be larger than the target");
  tensor<T, D> y{target, x.device(), uninitialized};
  if (target.numel() > 0) {
    const detail::strided_map maps[1] = {detail::broadcast_strides(x.shape(), target)};
    const auto w = detail::rows_of(detail::pad(target).extents, maps);
    detail::engine_of<D>(r).for_each_in_segments(
        w.rows, w.length, detail::kernels::gather_rows<T>{x.data(), y.data(), w.operands[0], w.length});
  }
  return y;
}

// g summed over the axes along which `target` was broadcast to g's shape: the gradient of a
// broadcast operand. Aligned at the last axis.
template <class R, class T, class D>
tensor<T, D> sum_to(R& r, const tensor<T, D>& g, const shape& target) {
  detail::aligned_target("sum_to", g.shape(), target);
  if (target == g.shape()) return g;
  const detail::padded_shape pg = detail::pad(g.shape()), pt = detail::pad(target);
  std::array<bool, 4> reduced{};
  for (int k = 0; k < 4; ++k) reduced[static_cast<std::size_t>(k)] = pt.extents[k] == 1 && pg.extents[k] != 1;
  return detail::scaled_sum(r, g, detail::reduction_of(g.shape(), reduced), target, 1.0);
}

// The maximum over `axes` and where it is, as PyTorch's max(x, dim) returns both: `places` are
// row-major indices into the reduced axes (for one axis, its index).
template <class T, class D>
struct max_result {
  tensor<T, D> values;
  tensor<std::int64_t, D> places;
};
template <class R, class T, class D>
max_result<T, D> max_and_argmax(R& r, const tensor<T, D>& x, const dims& axes, bool keepdim = false) {
  const auto mask = detail::axis_mask("max", x.shape(), axes);
  auto [v, p] = detail::max_and_place(r, "max", x, mask, detail::reduced_shape(x.shape(), mask, keepdim));
  return {std::move(v), std::move(p)};
}

// The gradient of a maximum by hand: dy (the maximum's shape, keepdim or not) put where
// `places` (max_and_argmax's) says, zeros elsewhere.
template <class R, class T, class D>
tensor<T, D> max_backward(R& r, const shape& x_shape, const dims& axes, const tensor<std::int64_t, D>& places,
                          const tensor<T, D>& dy) {
  const auto mask = detail::axis_mask("max backward", x_shape, axes);
  const detail::reduction_maps m = detail::reduction_of(x_shape, detail::padded_mask(x_shape, mask));
  if (dy.shape().numel() != m.segments || places.shape().numel() != m.segments)
    throw std::invalid_argument("distribute: max backward got dy of shape " + dy.shape().to_string() +
                                " for the maximum of a tensor of shape " + x_shape.to_string());
  tensor<T, D> dx{x_shape, dy.device()};
  if (m.segments > 0)
    detail::engine_of<D>(r).for_each(
        m.segments, detail::kernels::scatter_to_places<T>{dy.data(), places.data(), dx.data(), m.kept, m.reduced});
  return dx;
}

}  // namespace distribute::nn
