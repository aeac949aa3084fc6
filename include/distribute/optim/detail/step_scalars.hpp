#pragma once
// The scalars of a capturable optimiser (`adam_options::capturable`, `sgd_options::capturable`): the
// step count and the learning rate, kept with the optimiser's state instead of on the host, and
// advanced by a kernel of the step itself. A step captured into a CUDA graph (nn/graphed_step.cuh)
// then counts its replays and reads the learning rate of the moment: a host value would be frozen
// into the graph as it was at the capture.
//
// Four doubles, nn::detail::kernels' layout: {steps taken, learning rate, two values the optimiser
// derives per step}. They live where the optimiser's other state does (state_buffers.hpp): host
// memory when a host engine steps it, the replica's GPU otherwise. `set_lr` and `load` write them in
// place, so a captured graph sees the new values; reading them (`steps`, save) waits for the device.

#include <distribute/optim/detail/state_buffers.hpp>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace distribute::optim::detail {

class step_scalars {
 public:
  static constexpr std::size_t size = 4;

  // The scalars in memory that engine `e` computes on (moved there first if they are elsewhere).
  template <class E>
  double* on(E& e) {
    return s_.buffer_for(e, 0, size);
  }

  std::int64_t steps() const {
    return s_.with_host([](const auto& b) { return static_cast<std::int64_t>(b[0][0]); });
  }
  // In place where they are (the device's memory stays where a graph captured it).
  void assign(std::int64_t steps, double lr) { s_.assign_host({{static_cast<double>(steps), lr, 0.0, 0.0}}); }
  void set_lr(double lr) {
    auto host = s_.host_copy();
    host[0][1] = lr;
    s_.assign_host(std::move(host));
  }

 private:
  state_buffers<double> s_;
};

}  // namespace distribute::optim::detail
