#pragma once
// Stochastic gradient descent with momentum (PyTorch's form): with weight decay wd added to the
// gradient (g += wd * p), v = momentum * v + g, p -= lr * v. The velocity buffers are the state.

#include <distribute/nn/detail/kernels.hpp>
#include <distribute/nn/parameter.hpp>
#include <distribute/detail/digest.hpp>
#include <distribute/optim/detail/engine_steps.hpp>
#include <distribute/optim/detail/state_io.hpp>

#include <cstdint>
#include <istream>
#include <ostream>
#include <span>
#include <vector>

namespace distribute::optim {

struct sgd_options {
  double lr = 0.01;
  double momentum = 0.0;
  double weight_decay = 0.0;
};

template <class T = float>
class sgd : public detail::engine_steps<sgd<T>, T> {
 public:
  using scalar_type = T;

  sgd() = default;
  explicit sgd(sgd_options o) : o_{o} {}

  const sgd_options& options() const noexcept { return o_; }
  void set_lr(double lr) noexcept { o_.lr = lr; }
  std::int64_t steps() const noexcept { return steps_; }

  // step(model) on the calling thread, step(r, model) on replica r's engine: detail/engine_steps.hpp.
  using detail::engine_steps<sgd<T>, T>::step;

 private:
  friend class detail::engine_steps<sgd<T>, T>;
  template <class E, class M>
  void step_on(E& e, M& model) {
    std::size_t index = 0;
    const T lr = static_cast<T>(o_.lr), mu = static_cast<T>(o_.momentum), wd = static_cast<T>(o_.weight_decay);
    model.for_each_parameter([&](std::span<T> p, std::span<T> g) {
      auto& v = detail::buffer_for(velocity_, index++, p.size());
      e.for_each(static_cast<std::int64_t>(p.size()),
                 nn::detail::kernels::sgd_update<T>{p.data(), g.data(), v.data(), lr, mu, wd});
    });
    ++steps_;
  }

 public:
  void save(std::ostream& os) const {
    detail::write_tag(os, tag);
    detail::write_pod(os, steps_);
    detail::write_buffers(os, velocity_);
  }
  void load(std::istream& is) {
    detail::read_tag(is, tag);
    steps_ = detail::read_pod<std::int64_t>(is);
    velocity_ = detail::read_buffers<T>(is);
  }
  // For verify_mirrored: equal on every replica while the copies stay in sync.
  std::uint64_t state_digest() const noexcept {
    std::uint64_t h = distribute::detail::fnv1a(&steps_, sizeof steps_);
    for (const auto& v : velocity_) h = distribute::detail::fnv1a(v.data(), v.size() * sizeof(T), h);
    return h;
  }

 private:
  static constexpr char tag[8] = {'s', 'g', 'd', '-', 'v', '1', 0, 0};
  sgd_options o_{};
  std::int64_t steps_ = 0;
  std::vector<std::vector<T>> velocity_;
};

}  // namespace distribute::optim
