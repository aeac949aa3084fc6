#pragma once
// Tensor operations a model needs between its layers, computed by the replica's engine (so on the
// CPU and on a GPU alike): concatenation and splitting along the channels (a U-Net's skips, a
// conditional discriminator's input; torch.cat(dim=1), tf.concat(axis=-1) in channels-last), scaling
// and `axpy` in place; sums and products broadcast (nn/broadcasting.hpp). Each refuses operands whose shapes do not fit, naming both.
// Recorded on an nn::tape, their gradients are routed too (nn/tape.hpp).
//
//   auto both = nn::concat(r, noisy, fake);               // [N, 1 + 1, H, W]
//   auto [a, b] = nn::split(r, both, 1);                  // back: [N, 1, H, W] twice
//   nn::axpy(r, 100.0f, l1.grad, d_fake);                 // d_fake += 100 * l1.grad

#include <distribute/detail/element_kernels.hpp>
#include <distribute/nn/broadcasting.hpp>
#include <distribute/nn/detail/tensor_op_kernels.hpp>
#include <distribute/nn/layer.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace distribute::nn {

namespace detail {
// [N, C, ...]: the examples and one example's elements (0 for an empty batch).
inline std::int64_t per_example(const shape& s) { return s[0] == 0 ? 0 : s.numel() / s[0]; }

// `s` with `c` channels.
inline shape with_channels(const shape& s, std::int64_t c) {
  return s.rank() == 2 ? shape{s[0], c} : (s.rank() == 3 ? shape{s[0], c, s[2]} : shape{s[0], c, s[2], s[3]});
}

inline void check_same_shapes(const char* op, const shape& a, const shape& b) {
  if (a != b)
    throw std::invalid_argument(std::string("distribute: ") + op + " of a tensor of shape " + a.to_string() +
                                " and one of shape " + b.to_string() + ": the shapes must be equal");
}
inline void check_channels_fit(const char* op, const shape& a, const shape& b) {
  bool fit = a.rank() >= 2 && a.rank() == b.rank();
  for (std::size_t i = 0; fit && i < a.rank(); ++i) fit = i == 1 || a[i] == b[i];
  if (!fit)
    throw std::invalid_argument(std::string("distribute: ") + op + " along the channels of a tensor of shape " +
                                a.to_string() + " and one of shape " + b.to_string() +
                                ": both need rank 2 to 4 and the same extents but the channels' (axis 1)");
}
}  // namespace detail

// [a | b] along the channels (axis 1): [N, Ca, ...] and [N, Cb, ...] give [N, Ca + Cb, ...].
template <class R, class T, class D>
tensor<T, D> concat(R& r, const tensor<T, D>& a, const tensor<T, D>& b) {
  detail::check_channels_fit("concat", a.shape(), b.shape());
  const shape out = detail::with_channels(a.shape(), a.shape()[1] + b.shape()[1]);
  tensor<T, D> y{out, a.device(), uninitialized};
  const std::int64_t ab = detail::per_example(a.shape()), bb = detail::per_example(b.shape());
  if (out.numel() > 0)
    detail::engine_of<D>(r).for_each_in_segments(
        out[0], ab + bb, detail::kernels::concat_blocks<T>{a.data(), b.data(), y.data(), ab, bb});
  return y;
}

// The first `channels` channels of x and the rest: the inverse of concat.
template <class R, class T, class D>
std::pair<tensor<T, D>, tensor<T, D>> split(R& r, const tensor<T, D>& x, std::int64_t channels) {
  const shape& s = x.shape();
  if (s.rank() < 2 || channels < 1 || channels >= s[1])
    throw std::invalid_argument("distribute: split of a tensor of shape " + s.to_string() + " after " +
                                std::to_string(channels) +
                                " channels: it needs rank 2 to 4 and 1 to C - 1 channels in the first part");
  const shape first = detail::with_channels(s, channels), second = detail::with_channels(s, s[1] - channels);
  std::pair<tensor<T, D>, tensor<T, D>> out{tensor<T, D>{first, x.device(), uninitialized},
                                            tensor<T, D>{second, x.device(), uninitialized}};
  const std::int64_t xb = detail::per_example(s), fb = detail::per_example(first), sb = detail::per_example(second);
  if (s.numel() > 0) {
    auto& e = detail::engine_of<D>(r);
    e.for_each_in_segments(s[0], fb, detail::kernels::slice_block<T>{x.data(), out.first.data(), xb, 0, fb});
    e.for_each_in_segments(s[0], sb, detail::kernels::slice_block<T>{x.data(), out.second.data(), xb, fb, sb});
  }
  return out;
}

// k x.
template <class R, class T, class D>
tensor<T, D> scale(R& r, const tensor<T, D>& x, T k) {
  tensor<T, D> y{x.shape(), x.device(), uninitialized};
  detail::engine_of<D>(r).for_each(static_cast<std::int64_t>(x.size()),
                                   distribute::detail::kernels::scale<T>{x.data(), y.data(), k});
  return y;
}

// y += k x in place, of equal shapes (k = 1 adds x to y with y's bits as `y += x` gives them).
template <class R, class T, class D>
void axpy(R& r, T k, const tensor<T, D>& x, tensor<T, D>& y) {
  detail::check_same_shapes("axpy", x.shape(), y.shape());
  detail::engine_of<D>(r).for_each(static_cast<std::int64_t>(x.size()),
                                   detail::kernels::axpy<T>{k, x.data(), y.data()});
}

}  // namespace distribute::nn
