#pragma once
// A compute engine: the arithmetic of one replica on its device (`engine<D>`, engine/engine.hpp).
// The element-wise passes (concepts/elementwise_engine.hpp), and:
//
//   device_type, device()                   the device it computes on
//   threads(), options()                    its thread count and compute_options
//   precision(), use_precision(p)           what convolutions and products compute in; a precision
//                                           it cannot compute in is refused with the reason
//   conv_forward(g, x, w, bias, y)          a convolution over `conv_geometry` and its two gradients:
//   conv_backward_data(g, dy, w, dx)          dx = the data gradient
//   conv_backward_weights(g, x, dy, dw, db)   dw += the weight gradient, db += dy's sum per channel
//   gemm(g, a, b, c)                        c (+)= op(a) op(b) over `gemm_geometry`
//
// Optional, probed where used: conv_backward(g, x, dy, w, dx, dw, db), both gradients from one read
// of dy (engine/engine.hpp's conv_backward falls back to the two passes), and capturing(), whether
// the engine's stream is being captured into a CUDA graph.

#include <distribute/concepts/device.hpp>
#include <distribute/concepts/elementwise_engine.hpp>
#include <distribute/engine/compute_options.hpp>
#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/gemm_geometry.hpp>

#include <concepts>

namespace distribute {

template <class E>
concept compute_engine = elementwise_engine<E> && device<typename E::device_type> &&
                         requires(E& e, const E& ce, const conv_geometry& g, const gemm_geometry& mm, const float* in,
                                  float* out, compute_precision p) {
                           { ce.device() } -> std::convertible_to<typename E::device_type>;
                           { ce.threads() } -> std::convertible_to<int>;
                           { ce.options() } -> std::convertible_to<const compute_options&>;
                           { ce.precision() } -> std::convertible_to<compute_precision>;
                           e.use_precision(p);
                           e.conv_forward(g, in, in, in, out);
                           e.conv_backward_data(g, in, in, out);
                           e.conv_backward_weights(g, in, in, out, out);
                           e.gemm(mm, in, in, out);
                         };

}  // namespace distribute
