#pragma once
// Stochastic gradient descent with momentum (PyTorch's form): with weight decay wd added to the
// gradient (g += wd * p), v = momentum * v + g, p -= lr * v. The velocity buffers are the state.
// They live where the model's parameters do: host memory for a model on the CPU, memory of the
// replica's GPU (and stream) for a model stepped there, moved on the first step that sees a model
// elsewhere (detail/state_buffers.hpp). Saving reads them through the host and the saved form does
// not depend on the device, so a checkpoint written on a CPU loads into a GPU run and back.
// `capturable`: the step count and learning rate live with the velocity, for steps captured into a
// CUDA graph (as adam's option of that name; the same bits either way).

#include <distribute/nn/parameter.hpp>
#include <distribute/detail/digest.hpp>
#include <distribute/optim/detail/engine_steps.hpp>
#include <distribute/optim/detail/state_buffers.hpp>
#include <distribute/optim/detail/state_io.hpp>
#include <distribute/optim/detail/step_scalars.hpp>
#include <distribute/optim/detail/update_kernels.hpp>

#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <stdexcept>
#include <vector>

namespace distribute::optim {

struct sgd_options {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
  bool capturable = false;  // the step count and learning rate on the device, for CUDA graphs
};

template <class T = float>
class sgd : public detail::engine_steps<sgd<T>, T> {
 public:
  using scalar_type = T;

  sgd() = default;
  explicit sgd(sgd_options o) : o_{o}, count_{o.capturable, o.lr} {}

  const sgd_options& options() const noexcept { return o_; }
  // Capturable: also written where the state is (in the device's stream order, without a wait; not
  // during a capture).
  void set_lr(double lr) {
    o_.lr = lr;
    count_.set_lr(lr);
  }
  std::int64_t steps() const { return count_.steps(); }

  // step(model) on the calling thread, step(r, model) on replica r's engine: detail/engine_steps.hpp.
  using detail::engine_steps<sgd<T>, T>::step;

 private:
  friend class detail::engine_steps<sgd<T>, T>;
  template <class E, class M>
  void step_on(E& e, M& model) {
    const double* scalars = nullptr;
    if (o_.capturable) {
      double* s = count_.scalars_on(e);
      e.for_each(1, detail::kernels::count_step{s});
      scalars = s;
    } else {
      detail::refuse_capture(e, "optim::sgd");
    }
    std::size_t index = 0;
    const T lr = static_cast<T>(o_.lr), mu = static_cast<T>(o_.momentum), wd = static_cast<T>(o_.weight_decay);
    model.for_each_parameter([&](std::span<T> p, std::span<T> g) {
      T* v = velocity_.buffer_for(e, index++, p.size());
      e.for_each(static_cast<std::int64_t>(p.size()),
                 detail::kernels::sgd_update<T>{p.data(), g.data(), v, lr, mu, wd, scalars});
    });
    if (!o_.capturable) count_.count_on_host();
  }

 public:
  void save(std::ostream& os) const {
    detail::write_tag(os, tag);
    detail::write_pod(os, steps());
    velocity_.with_host([&](const auto& v) { detail::write_buffers(os, v); });
  }
  void load(std::istream& is) {
    detail::read_tag(is, tag);
    const auto steps = detail::step_count::read_steps(is, "sgd");
    auto velocity = detail::read_buffers<T>(is);
    count_.load(steps, o_.lr);
    velocity_.assign_host(std::move(velocity));
  }
  // For verify_mirrored: equal on every replica while the copies stay in sync (device state is read
  // through the host).
  std::uint64_t state_digest() const {
    const std::int64_t steps = this->steps();
    std::uint64_t h = distribute::detail::fnv1a(&steps, sizeof steps);
    velocity_.with_host([&](const auto& buffers) {
      for (const auto& v : buffers) h = distribute::detail::fnv1a(v.data(), v.size() * sizeof(T), h);
    });
    return h;
  }

 private:
  static constexpr char tag[8] = {'s', 'g', 'd', '-', 'v', '1', 0, 0};
  sgd_options o_{};
  detail::step_count count_;           // on the host, or with the state (capturable: with lr)
  detail::state_buffers<T> velocity_;  // one buffer per parameter
};

}  // namespace distribute::optim
