#pragma once
// The shape arithmetic of the operations between layers: axes lists, NumPy's broadcasting rule, and
// the strided maps (op_kernels.hpp) through which the passes read their operands. Shapes have at most
// 4 extents; a map pads a shape on the left with extents of 1, so that every pass walks 4 axes.

#include <distribute/nn/detail/op_kernels.hpp>
#include <distribute/tensor/shape.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace distribute::nn {

// Axes of a tensor, as PyTorch's `dim` (a number or a list; a negative one counts from the end).
class dims {
 public:
  dims() = default;
  dims(int axis) : count_{1} { axes_[0] = axis; }  // NOLINT: one axis reads as `dims`
  dims(std::initializer_list<int> axes) {
    if (axes.size() > shape::max_rank)
      throw std::invalid_argument("distribute: " + std::to_string(axes.size()) + " axes given; a tensor has at most " +
                                  std::to_string(shape::max_rank));
    for (int a : axes) axes_[count_++] = a;
  }
  // Axes 0 to rank - 1: every axis.
  static dims all(std::size_t rank) {
    dims d;
    for (std::size_t i = 0; i < rank; ++i) d.axes_[d.count_++] = static_cast<int>(i);
    return d;
  }
  std::size_t size() const { return count_; }
  int operator[](std::size_t i) const { return axes_[i]; }

 private:
  std::array<int, shape::max_rank> axes_{};
  std::size_t count_ = 0;
};

namespace detail {

inline std::string op_error(const char* op) { return std::string("distribute: ") + op; }

// Which axes of a rank-`rank` tensor `d` names (negative from the end), each once and in range.
inline std::array<bool, shape::max_rank> axis_mask(const char* op, const shape& s, const dims& d) {
  std::array<bool, shape::max_rank> mask{};
  const auto rank = static_cast<int>(s.rank());
  for (std::size_t i = 0; i < d.size(); ++i) {
    const int a = d[i] < 0 ? d[i] + rank : d[i];
    if (a < 0 || a >= rank)
      throw std::invalid_argument(op_error(op) + " over axis " + std::to_string(d[i]) + " of a tensor of shape " +
                                  s.to_string() + ": the axes are -" + std::to_string(rank) + " to " +
                                  std::to_string(rank - 1));
    if (mask[static_cast<std::size_t>(a)])
      throw std::invalid_argument(op_error(op) + " names axis " + std::to_string(a) + " twice for a tensor of shape " +
                                  s.to_string());
    mask[static_cast<std::size_t>(a)] = true;
  }
  return mask;
}

// `s`'s extents padded on the left to 4 with 1s, and its row-major strides.
struct padded_shape {
  std::int64_t extents[4] = {1, 1, 1, 1};
  std::int64_t strides[4] = {0, 0, 0, 0};
  std::size_t offset = 4;  // where s's first axis lands
};
inline padded_shape pad(const shape& s) {
  padded_shape p;
  p.offset = 4 - s.rank();
  for (std::size_t i = 0; i < s.rank(); ++i) p.extents[p.offset + i] = s[i];
  std::int64_t stride = 1;
  for (int k = 3; k >= 0; --k) {
    p.strides[k] = stride;
    stride *= p.extents[k];
  }
  return p;
}

// The same walk over fewer axes: those of extent 1 dropped, and an axis merged into the next inner
// one where it continues it (its stride is the inner one's times the inner extent; two axes of
// stride 0 continue each other too).
inline strided_map simplified(const strided_map& m) {
  std::int64_t e[4], st[4];
  int n = 0;  // axes kept, innermost first
  for (int k = 3; k >= 0; --k) {
    if (m.extents[k] == 1) continue;
    if (n > 0 && m.strides[k] == st[n - 1] * e[n - 1]) {
      e[n - 1] *= m.extents[k];
      continue;
    }
    e[n] = m.extents[k];
    st[n] = m.strides[k];
    ++n;
  }
  strided_map out;
  out.axes = n;
  for (int j = 0; j < n; ++j) {
    out.extents[3 - j] = e[j];
    out.strides[3 - j] = st[j];
  }
  return out;
}

// NumPy's rule: aligned at the last axis, each pair of extents equal or one of them 1.
inline shape broadcast_shape(const char* op, const shape& a, const shape& b) {
  const padded_shape pa = pad(a), pb = pad(b);
  const std::size_t rank = a.rank() > b.rank() ? a.rank() : b.rank();
  std::array<std::int64_t, 4> out{};
  for (std::size_t k = 4 - rank; k < 4; ++k) {
    const std::int64_t ea = pa.extents[k], eb = pb.extents[k];
    if (ea != eb && ea != 1 && eb != 1)
      throw std::invalid_argument(op_error(op) + " of a tensor of shape " + a.to_string() + " and one of shape " +
                                  b.to_string() + ": they do not broadcast (axis " + std::to_string(k + rank - 4) +
                                  " from the left of the result has extents " + std::to_string(ea) + " and " +
                                  std::to_string(eb) + "; each pair, aligned at the last axis, must be equal or 1)");
    out[k] = ea == 1 ? eb : ea;
  }
  return shape::from_extents(std::span<const std::int64_t>(out.data() + 4 - rank, rank));
}

// A walk over `out` reading `in`, which broadcasts to it (stride 0 along its axes of extent 1).

// A walk over the output `out` (row-major) by rows, read through each operand's strides (`maps`,
// unsimplified, over out's padded axes): adjacent axes merge where they continue each other for every
// operand, axes of extent 1 drop, and the innermost that remains is the row.
template <std::size_t N>
struct row_walk {
  std::int64_t rows = 1, length = 1;
  kernels::row_operand operands[N];
};
template <std::size_t N>
row_walk<N> rows_of(const std::int64_t (&extents)[4], const strided_map (&maps)[N]) {
  std::int64_t e[4], st[N][4];
  int n = 0;  // axes kept, innermost first
  for (int k = 3; k >= 0; --k) {
    if (extents[k] == 1) continue;
    bool continues = n > 0;
    for (std::size_t m = 0; continues && m < N; ++m) continues = maps[m].strides[k] == st[m][n - 1] * e[n - 1];
    if (continues) {
      e[n - 1] *= extents[k];
      continue;
    }
    e[n] = extents[k];
    for (std::size_t m = 0; m < N; ++m) st[m][n] = maps[m].strides[k];
    ++n;
  }
  row_walk<N> w;
  if (n == 0) return w;  // one element
  w.length = e[0];
  for (int j = 1; j < n; ++j) w.rows *= e[j];
  for (std::size_t m = 0; m < N; ++m) {
    kernels::row_operand& op = w.operands[m];
    op.step = st[m][0];
    op.outer.axes = n - 1;
    for (int j = 1; j < n; ++j) {
      op.outer.extents[4 - j] = e[j];
      op.outer.strides[4 - j] = st[m][j];
    }
  }
  return w;
}
// The maps of operands of shapes `in` broadcast to `out`, unsimplified (for rows_of).
inline strided_map broadcast_strides(const shape& in, const shape& out) {
  const padded_shape pi = pad(in), po = pad(out);
  strided_map m;
  for (int k = 0; k < 4; ++k) {
    m.extents[k] = po.extents[k];
    m.strides[k] = pi.extents[k] == 1 ? 0 : pi.strides[k];
  }
  return m;
}

// A reduction of `in` over the axes where `kept_mask` is false: the walk over the output elements
// (segments) and the walk over the terms of one.
struct reduction_maps {
  strided_map kept, reduced;
  std::int64_t segments = 1, length = 1;
};
inline reduction_maps reduction_of(const shape& in, const std::array<bool, 4>& reduced_padded) {
  const padded_shape p = pad(in);
  reduction_maps r;
  for (int k = 0; k < 4; ++k) {
    r.kept.strides[k] = r.reduced.strides[k] = p.strides[k];
    if (reduced_padded[static_cast<std::size_t>(k)]) {
      r.reduced.extents[k] = p.extents[k];
      r.length *= p.extents[k];
    } else {
      r.kept.extents[k] = p.extents[k];
      r.segments *= p.extents[k];
    }
  }
  r.kept = simplified(r.kept);
  r.reduced = simplified(r.reduced);
  return r;
}

// The result's shape of a reduction of `s` over `mask`: the reduced axes kept as 1 or dropped.
inline shape reduced_shape(const shape& s, const std::array<bool, shape::max_rank>& mask, bool keepdim) {
  std::array<std::int64_t, shape::max_rank> out{};
  std::size_t rank = 0;
  for (std::size_t i = 0; i < s.rank(); ++i)
    if (!mask[i]) out[rank++] = s[i];
    else if (keepdim) out[rank++] = 1;
  return shape::from_extents(std::span<const std::int64_t>(out.data(), rank));
}
inline std::array<bool, 4> padded_mask(const shape& s, const std::array<bool, shape::max_rank>& mask) {
  std::array<bool, 4> p{};
  for (std::size_t i = 0; i < s.rank(); ++i) p[4 - s.rank() + i] = mask[i];
  return p;
}

}  // namespace detail
}  // namespace distribute::nn
