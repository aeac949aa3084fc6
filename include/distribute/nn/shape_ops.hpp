#pragma once
// Operations that rearrange a tensor without arithmetic: `reshape` (PyTorch's reshape and view;
// one extent of -1 is inferred), `permute` (an order of all the axes) and `transpose` (two axes
// swapped). Recorded on an nn::tape their gradients are routed back (nn/tape_ops.hpp): a reshape's
// gradient is the gradient under the input's shape, a permutation's the inverse permutation.
//
//   auto h = nn::reshape(r, z, {-1, 128, 7, 7});      // [N, 6272] -> [N, 128, 7, 7]
//   auto t = nn::permute(r, x, {0, 2, 3, 1});         // NCHW -> NHWC
//
// reshape copies the values (tensors own their storage); permute gathers them, one element per work
// item of the replica's engine.

#include <distribute/nn/detail/op_shapes.hpp>
#include <distribute/nn/layer.hpp>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace distribute::nn {

namespace detail {
// `target` with its one -1 replaced so that it holds as many elements as `from`.
inline shape inferred_shape(const shape& from, std::initializer_list<std::int64_t> target) {
  if (target.size() > shape::max_rank)
    throw std::invalid_argument("distribute: reshape to " + std::to_string(target.size()) +
                                " extents; a tensor has at most 4");
  std::array<std::int64_t, shape::max_rank> out{};
  std::size_t rank = 0, unknown = shape::max_rank;
  std::int64_t known = 1;
  std::string asked = "(";
  for (std::int64_t e : target) {
    asked += (rank ? ", " : "") + std::to_string(e);
    if (e == -1) {
      if (unknown != shape::max_rank)
        throw std::invalid_argument("distribute: reshape of " + from.to_string() + " to a shape with two -1s");
      unknown = rank;
    } else if (e < 0) {
      throw std::invalid_argument("distribute: reshape to a negative extent " + std::to_string(e));
    } else {
      known *= e;
    }
    out[rank++] = e;
  }
  asked += ")";
  if (unknown != shape::max_rank) {
    if (known == 0 || from.numel() % known != 0)
      throw std::invalid_argument("distribute: reshape of a tensor of shape " + from.to_string() + " to " + asked +
                                  ": " + std::to_string(from.numel()) + " elements do not divide into the rest");
    out[unknown] = from.numel() / known;
  }
  const shape s = shape::from_extents(std::span<const std::int64_t>(out.data(), rank));
  if (s.numel() != from.numel())
    throw std::invalid_argument("distribute: reshape of a tensor of shape " + from.to_string() + " (" +
                                std::to_string(from.numel()) + " elements) to " + asked + " (" +
                                std::to_string(s.numel()) + ")");
  return s;
}

// The permutation `order` of `s`'s axes, checked: each axis once.
inline std::array<int, shape::max_rank> checked_order(const char* op, const shape& s,
                                                      std::initializer_list<int> order) {
  std::array<int, shape::max_rank> p{};
  std::array<bool, shape::max_rank> seen{};
  const auto rank = static_cast<int>(s.rank());
  std::string asked = "(";
  for (int a : order) asked += (asked.size() > 1 ? ", " : "") + std::to_string(a);
  asked += ")";
  bool fit = order.size() == s.rank();
  std::size_t i = 0;
  for (int a : order) {
    if (!fit) break;
    const int axis = a < 0 ? a + rank : a;
    fit = axis >= 0 && axis < rank && !seen[static_cast<std::size_t>(axis)];
    if (fit) seen[static_cast<std::size_t>(axis)] = true;
    p[i++] = axis;
  }
  if (!fit)
    throw std::invalid_argument("distribute: " + std::string(op) + " of a tensor of shape " + s.to_string() + " by " +
                                asked + ": it needs each of the " + std::to_string(rank) + " axes once");
  return p;
}

// y[...] = x[...] with y's axis i being x's axis order[i].
template <class R, class T, class D>
tensor<T, D> permuted(R& r, const tensor<T, D>& x, const std::array<int, shape::max_rank>& order) {
  const shape& s = x.shape();
  std::array<std::int64_t, shape::max_rank> out{};
  for (std::size_t i = 0; i < s.rank(); ++i) out[i] = s[static_cast<std::size_t>(order[i])];
  const shape os = shape::from_extents(std::span<const std::int64_t>(out.data(), s.rank()));
  const padded_shape px = pad(s), po = pad(os);
  strided_map m;
  for (std::size_t i = 0; i < s.rank(); ++i) {
    m.extents[po.offset + i] = po.extents[po.offset + i];
    m.strides[po.offset + i] = px.strides[px.offset + static_cast<std::size_t>(order[i])];
  }
  tensor<T, D> y{os, x.device(), uninitialized};
  if (os.numel() > 0) {
    const strided_map maps[1] = {m};
    const auto w = rows_of(po.extents, maps);
    engine_of<D>(r).for_each_in_segments(w.rows, w.length,
                                         kernels::gather_rows<T>{x.data(), y.data(), w.operands[0], w.length});
  }
  return y;
}
inline std::array<int, shape::max_rank> inverse_order(const std::array<int, shape::max_rank>& order, std::size_t rank) {
  std::array<int, shape::max_rank> inv{};
  for (std::size_t i = 0; i < rank; ++i) inv[static_cast<std::size_t>(order[i])] = static_cast<int>(i);
  return inv;
}
}  // namespace detail

// x's values under `target` (as many elements; one extent may be -1, inferred).
template <class R, class T, class D>
tensor<T, D> reshape(R&, const tensor<T, D>& x, std::initializer_list<std::int64_t> target) {
  tensor<T, D> y = x;
  y.reshape(detail::inferred_shape(x.shape(), target));
  return y;
}
template <class R, class T, class D>
tensor<T, D> reshape(R&, const tensor<T, D>& x, const shape& target) {
  if (target.numel() != x.shape().numel())
    throw std::invalid_argument("distribute: reshape of a tensor of shape " + x.shape().to_string() + " to " +
                                target.to_string() + ": the element counts differ");
  tensor<T, D> y = x;
  y.reshape(target);
  return y;
}
// PyTorch's view: here the same as reshape (a copy under the new shape).
template <class R, class T, class D>
tensor<T, D> view(R& r, const tensor<T, D>& x, std::initializer_list<std::int64_t> target) {
  return reshape(r, x, target);
}

// x's axes in the order given (PyTorch's permute): result axis i is x's axis order[i].
template <class R, class T, class D>
tensor<T, D> permute(R& r, const tensor<T, D>& x, std::initializer_list<int> order) {
  return detail::permuted(r, x, detail::checked_order("permute", x.shape(), order));
}

// x with axes a and b swapped (PyTorch's transpose(a, b)).
template <class R, class T, class D>
tensor<T, D> transpose(R& r, const tensor<T, D>& x, int a, int b) {
  const auto rank = static_cast<int>(x.shape().rank());
  const int pa = a < 0 ? a + rank : a, pb = b < 0 ? b + rank : b;
  if (pa < 0 || pa >= rank || pb < 0 || pb >= rank)
    throw std::invalid_argument("distribute: transpose of axes " + std::to_string(a) + " and " + std::to_string(b) +
                                " of a tensor of shape " + x.shape().to_string());
  std::array<int, shape::max_rank> order{};
  for (int i = 0; i < rank; ++i) order[static_cast<std::size_t>(i)] = i;
  order[static_cast<std::size_t>(pa)] = pb;
  order[static_cast<std::size_t>(pb)] = pa;
  return detail::permuted(r, x, order);
}

}  // namespace distribute::nn
