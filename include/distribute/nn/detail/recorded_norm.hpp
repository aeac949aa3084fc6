#pragma once
// The recorded backward (nn::create_graph) of the normalisations, written with the tape's operations
// from the input x: over each group of `axes`, xhat = (x - mean) s with s = (var + eps)^(-1/2),
// g = dy * weight, and dx = s (g - mean(g) - xhat mean(g xhat)). Recording it so, the second-order
// gradient reaches x through xhat and s, and the weight through g; the shift has no second-order part.

#include <distribute/nn/tape_ops.hpp>

#include <optional>

namespace distribute::nn::detail {

template <class Tape>
typename Tape::variable recorded_norm_backward(Tape& t, typename Tape::variable x, typename Tape::variable dy,
                                               const dims& axes, std::optional<typename Tape::variable> weight,
                                               double eps) {
  using tensor_type = typename Tape::tensor_type;
  using T = typename Tape::scalar_type;
  tensor_type e{shape{1}, x.value().device(), uninitialized};
  e.fill(static_cast<T>(eps), 0, 1);
  const auto centred = sub(t, x, mean(t, x, axes, true));
  const auto variance = mean(t, square(t, centred), axes, true);
  const auto s = pow(t, add(t, variance, t.constant(std::move(e))), T(-0.5));
  const auto xhat = mul(t, centred, s);
  const auto g = weight ? mul(t, dy, *weight) : dy;
  const auto inner = sub(t, sub(t, g, mean(t, g, axes, true)), mul(t, xhat, mean(t, mul(t, g, xhat), axes, true)));
  return mul(t, inner, s);
}

// A per-channel parameter [C] as a variable of shape [C, 1, 1], to broadcast over NCHW.
template <class Tape, class P>
typename Tape::variable channel_parameter(Tape& t, P& p, bool frozen) {
  return t.reshape(t.parameter(p, frozen), shape{p.value.shape()[0], 1, 1});
}

}  // namespace distribute::nn::detail
