#pragma once
// The members a model wrapped by another (nn::with_precision, nn::graphed) passes to the model it
// holds: its parameters and buffers, zero_grad, the training mode, its digest. The wrapper adds its
// own forward and backward.

#include <cstdint>
#include <utility>

namespace distribute::nn::detail {

template <class M>
class model_wrapper {
 public:
  M& model() noexcept { return model_; }
  const M& model() const noexcept { return model_; }

  template <class F>
  void for_each_parameter(F&& f) {
    model_.for_each_parameter(f);
  }
  template <class F>
    requires requires(M& m, F& f) { m.for_each_buffer(f); }
  void for_each_buffer(F&& f) {
    model_.for_each_buffer(f);
  }
  void zero_grad() { model_.zero_grad(); }
  void set_training(bool on) { model_.set_training(on); }
  std::uint64_t state_digest() const
    requires requires(const M& m) { m.state_digest(); }
  {
    return model_.state_digest();
  }

 protected:
  explicit model_wrapper(M model) : model_{std::move(model)} {}

  M model_;
};

}  // namespace distribute::nn::detail
