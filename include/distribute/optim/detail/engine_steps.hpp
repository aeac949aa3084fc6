#pragma once
// The two ways an optimiser steps, shared by every optimiser: `opt.step(model)` on the calling
// thread, and `opt.step(r, model)` on replica r's engine, with the same bits. The optimiser provides
// `step_on(engine, model)` (and befriends this base).

#include <distribute/engine/serial.hpp>
#include <distribute/errors.hpp>
#include <distribute/nn/parameter.hpp>

#include <string>
#include <type_traits>

namespace distribute::optim::detail {

// An optimiser that keeps per-step values on the host (its step count, a learning rate passed to the
// kernels) cannot be captured into a CUDA graph: the replays would repeat the captured step's values.
// Engines that capture (a GPU's, `capturing()`) make it throw graph_capture_error instead.
template <class E>
void refuse_capture(const E& e, const char* who) {
  if constexpr (requires { e.capturing(); }) {
    if (e.capturing())
      throw graph_capture_error(
          std::string("distribute: ") + who +
          " was stepped while its replica's stream was being captured into a CUDA graph, but its "
          "step count and learning rate are host values that the graph would freeze; construct it "
          "with capturable = true");
  }
}

template <class Derived, class T>
class engine_steps {
 public:
  // One update of every parameter of `model`, on the calling thread.
  template <nn::parameterized M>
    requires std::is_same_v<typename M::scalar_type, T>
  void step(M& model) {
    distribute::serial_engine e;
    static_cast<Derived&>(*this).step_on(e, model);
  }
  // The same update computed by replica `r`'s engine (on its share of the cores); the same bits.
  template <class R, nn::parameterized M>
    requires std::is_same_v<typename M::scalar_type, T> && requires(R& r) { r.engine(); }
  void step(R& r, M& model) {
    static_cast<Derived&>(*this).step_on(r.engine(), model);
  }
};

}  // namespace distribute::optim::detail
