#pragma once
// The compute engine of a device: what the layers call for their arithmetic. Layers, losses and
// models are written once, generic over the device of their replica; each device brings an engine
// (`engine<cpu>` in engine/cpu.hpp), and a new device is supported by writing its engine, not by
// rewriting layers.
//
// What an engine offers is the `compute_engine` concept (concepts/compute_engine.hpp): the
// element-wise passes (for_each, for_each_in_segments, segmented_sum, to_host), convolutions over
// `conv_geometry`, the matrix product `gemm` over `gemm_geometry`, its precision, device, options
// (engine/compute_options.hpp) and thread count. Each engine asserts it beside its definition.
// An engine holds per-replica state (cached primitives, one scratch arena) and is used by one
// replica thread at a time.

#include <distribute/concepts/compute_engine.hpp>
#include <distribute/concepts/device.hpp>
#include <distribute/engine/compute_options.hpp>
#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/gemm_geometry.hpp>

namespace distribute {

// While it lives, engine `e` computes in `p` (restoring the precision it had after); the engine
// refuses, with the reason, a precision it cannot compute in.
template <class E>
class precision_scope {
 public:
  precision_scope(E& e, compute_precision p) : e_{e}, saved_{e.precision()} { e_.use_precision(p); }
  ~precision_scope() {
    try {
      e_.use_precision(saved_);  // a precision the engine had: accepted again
    } catch (...) {}
  }
  precision_scope(const precision_scope&) = delete;
  precision_scope& operator=(const precision_scope&) = delete;

 private:
  E& e_;
  compute_precision saved_;
};

template <device D>
class engine;  // one specialisation per device

// Both gradients of one convolution for the same dy: dw += the weight gradient (db += dy's sum per
// channel, db may be null), then dx = the data gradient where dx is not null. The engine's own
// conv_backward where it has one (the CPU engine's reads dy once for both passes), otherwise its two
// passes in that order; the results are the same.
template <class E, class T>
void conv_backward(E& e, const conv_geometry& g, const T* x, const T* dy, const T* w, T* dx, T* dw, T* db) {
  if constexpr (requires { e.conv_backward(g, x, dy, w, dx, dw, db); }) {
    e.conv_backward(g, x, dy, w, dx, dw, db);
  } else {
    e.conv_backward_weights(g, x, dy, dw, db);
    if (dx) e.conv_backward_data(g, dy, w, dx);
  }
}

}  // namespace distribute
