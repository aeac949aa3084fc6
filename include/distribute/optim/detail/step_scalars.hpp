#pragma once
// The scalars of a capturable optimiser (`adam_options::capturable`, `sgd_options::capturable`): the
// step count and the learning rate, kept with the optimiser's state instead of on the host, and
// advanced by a kernel of the step itself. A step captured into a CUDA graph (cuda/nn/graphed_step.cuh)
// then counts its replays and reads the learning rate of the moment: a host value would be frozen
// into the graph as it was at the capture.
//
// Four doubles, update_kernels.hpp's layout: {steps taken, learning rate, two values the optimiser
// derives per step}. They live where the optimiser's other state does (state_buffers.hpp): host
// memory when a host engine steps it, the replica's GPU otherwise. `set_lr` and `load` write them in
// place, so a captured graph sees the new values (`set_lr` in the stream's order, without waiting for
// the device); reading them (`steps`, save) waits for the device.
//
// `step_count` is what an optimiser holds: its step count in the form its options chose, the host's
// (the default) or these scalars (capturable), behind one interface.

#include <distribute/optim/detail/state_io.hpp>
#include <distribute/optim/detail/state_buffers.hpp>

#include <cstddef>
#include <cstdint>
#include <istream>
#include <stdexcept>
#include <string>
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
  // The learning rate alone, in place: on a device in the order of its stream, without a wait.
  void set_lr(double lr) {
    if (s_.set(0, 1, lr)) return;
    if (s_.count() != 0) throw std::logic_error("distribute: an optimiser's step scalars are not the four it keeps");
    assign(0, lr);  // none yet
  }

 private:
  state_buffers<double> s_;
};

// An optimiser's step count (and, capturable, its learning rate) in either form.
class step_count {
 public:
  step_count() = default;
  step_count(bool capturable, double lr) : capturable_{capturable} {
    if (capturable_) scalars_.assign(0, lr);
  }

  // Steps taken (capturable: read where the state is, counting a graph's replays).
  std::int64_t steps() const { return capturable_ ? scalars_.steps() : host_; }
  // Capturable: the learning rate written where the state is (in the device's stream order).
  void set_lr(double lr) {
    if (capturable_) scalars_.set_lr(lr);
  }
  // A loaded count (read_steps) and the optimiser's learning rate.
  void load(std::int64_t steps, double lr) {
    host_ = steps;
    if (capturable_) scalars_.assign(steps, lr);
  }
  // The default form: one more step, counted on the host; the new count.
  std::int64_t count_on_host() noexcept { return ++host_; }
  // Capturable: the scalars in memory that engine `e` computes on.
  template <class E>
  double* scalars_on(E& e) {
    return scalars_.on(e);
  }

  // A saved count, refused when negative (`who`: the optimiser, for the message).
  static std::int64_t read_steps(std::istream& is, const char* who) {
    const auto steps = read_pod<std::int64_t>(is);
    if (steps < 0) throw std::runtime_error(std::string("distribute: corrupt ") + who + " state (negative step count)");
    return steps;
  }

 private:
  bool capturable_ = false;
  std::int64_t host_ = 0;  // the default form's count
  step_scalars scalars_;   // capturable: the count, lr and what the optimiser derives per step
};

}  // namespace distribute::optim::detail
