#pragma once
// Adam (Kingma & Ba), in PyTorch's form: with weight decay wd added to the gradient (L2, as
// torch.optim.Adam; not AdamW's decoupled decay),
//   m = b1 m + (1 - b1) g,  v = b2 v + (1 - b2) g^2,
//   p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
// The moments and the step count t are the state; `save`/`load` round-trip them bit for bit.
// The moments live where the model's parameters do: host memory for a model on the CPU, memory of
// the replica's GPU (and stream) for a model stepped there, moved on the first step that sees a model
// elsewhere (detail/state_buffers.hpp). Saving reads them through the host and the saved form does
// not depend on the device, so a checkpoint written on a CPU loads into a GPU run and back.
//
// `capturable` (PyTorch's option of that name): the step count and learning rate live with the
// moments and the bias corrections are computed there, by a one-element kernel of each step
// (detail/step_scalars.hpp), so that a step can be captured into a CUDA graph and replayed
// (cuda/nn/graphed_step.cuh); `set_lr` then writes the copy where the moments are, and `steps()` reads
// it. The same bits as the default form on the CPU. On a GPU the bias corrections come from CUDA's
// double `pow`, which may differ from the host's in the last bit of a double (rarely visible once
// rounded to float). The default form refuses to be captured (graph_capture_error): a graph would
// replay the bias corrections of the step it captured.

#include <distribute/nn/parameter.hpp>
#include <distribute/detail/digest.hpp>
#include <distribute/optim/detail/engine_steps.hpp>
#include <distribute/optim/detail/state_buffers.hpp>
#include <distribute/optim/detail/state_io.hpp>
#include <distribute/optim/detail/step_scalars.hpp>
#include <distribute/optim/detail/update_kernels.hpp>

#include <cmath>
#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <vector>

namespace distribute::optim {

struct adam_options {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool capturable = false;  // the step's scalars on the device, for CUDA graphs (above)
};

template <class T = float>
class adam : public detail::engine_steps<adam<T>, T> {
 public:
  using scalar_type = T;

  adam() = default;
  explicit adam(adam_options o) : o_{o}, count_{o.capturable, o.lr} {}

  const adam_options& options() const noexcept { return o_; }
  // For schedules such as CycleGAN's linear decay. Capturable: also written where the state is (in
  // the order of the device's stream, without waiting for it; not while a graph is being captured).
  void set_lr(double lr) {
    o_.lr = lr;
    count_.set_lr(lr);
  }
  // Steps taken (capturable: read where the state is, counting a graph's replays).
  std::int64_t steps() const { return count_.steps(); }

  // step(model) on the calling thread, step(r, model) on replica r's engine: detail/engine_steps.hpp.
  using detail::engine_steps<adam<T>, T>::step;

 private:
  friend class detail::engine_steps<adam<T>, T>;
  template <class E, class M>
  void step_on(E& e, M& model) {
    const double* scalars = nullptr;
    T step_size{}, sqrt_bc2{};
    if (o_.capturable) {
      double* s = count_.scalars_on(e);
      e.for_each(1, detail::kernels::adam_step_scalars{s, o_.beta1, o_.beta2});
      scalars = s;
    } else {
      detail::refuse_capture(e, "optim::adam");
      const double t = static_cast<double>(count_.count_on_host());
      step_size = static_cast<T>(o_.lr / (1 - std::pow(o_.beta1, t)));
      sqrt_bc2 = static_cast<T>(std::sqrt(1 - std::pow(o_.beta2, t)));
    }
    const T b1 = static_cast<T>(o_.beta1), b2 = static_cast<T>(o_.beta2), wd = static_cast<T>(o_.weight_decay);
    const T eps = static_cast<T>(o_.eps);
    std::size_t index = 0;
    model.for_each_parameter([&](std::span<T> p, std::span<T> g) {
      T* m = m_.buffer_for(e, index, p.size());
      T* v = v_.buffer_for(e, index, p.size());
      ++index;
      e.for_each(
          static_cast<std::int64_t>(p.size()),
          detail::kernels::adam_update<T>{p.data(), g.data(), m, v, b1, b2, wd, step_size, sqrt_bc2, eps, scalars});
    });
  }

 public:
  void save(std::ostream& os) const {
    detail::write_tag(os, tag);
    detail::write_pod(os, steps());
    m_.with_host([&](const auto& m) { detail::write_buffers(os, m); });
    v_.with_host([&](const auto& v) { detail::write_buffers(os, v); });
  }
  void load(std::istream& is) {
    detail::read_tag(is, tag);
    const auto steps = detail::step_count::read_steps(is, "adam");
    auto m = detail::read_buffers<T>(is);
    auto v = detail::read_buffers<T>(is);
    if (m.size() != v.size()) throw std::runtime_error("distribute: corrupt adam state (moment counts differ)");
    count_.load(steps, o_.lr);
    m_.assign_host(std::move(m));
    v_.assign_host(std::move(v));
  }
  // For verify_mirrored: equal on every replica while the copies stay in sync (device state is read
  // through the host).
  std::uint64_t state_digest() const {
    const std::int64_t steps = this->steps();
    std::uint64_t h = distribute::detail::fnv1a(&steps, sizeof steps);
    for (const auto* s : {&m_, &v_})
      s->with_host([&](const auto& buffers) {
        for (const auto& b : buffers) h = distribute::detail::fnv1a(b.data(), b.size() * sizeof(T), h);
      });
    return h;
  }

 private:
  static constexpr char tag[8] = {'a', 'd', 'a', 'm', '-', 'v', '1', 0};
  adam_options o_{};
  detail::step_count count_;        // on the host, or with the state (capturable: with lr and bias corrections)
  detail::state_buffers<T> m_, v_;  // the moments, one buffer per parameter
};

}  // namespace distribute::optim
