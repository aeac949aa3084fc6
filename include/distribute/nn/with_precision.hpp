#pragma once
// A model whose convolutions and matrix products compute in a precision of its own (mixed
// precision, chosen per model as Keras's dtype policies are): the wrapped model's forward and
// backward run with the replica's engine set to that precision, and the engine's own precision
// comes back after each pass.
//
//   auto gen = strategy.mirror([](auto& device) {
//     return nn::with_precision{make_generator(device), dist::compute_precision::bfloat16};
//   });
//   ...
//   auto loss = nn::l1(r, gen.forward(r, x), target, global_batch);   // bf16 tensor cores, float tensors
//   gen.backward(r, loss.grad);
//   r.all_reduce_gradients(gen);                                       // float32 gradients
//   opt.step(r, gen);                                                  // float32 master weights and state
//
// What stays float32: every tensor between layers, the parameters (the master weights), their
// gradients and the optimiser's state, the normalisations, activations and losses; what changes: each
// convolution and matrix product reads 16-bit copies of its operands, accumulates in float32 and
// writes float32 (PyTorch's autocast runs those ops the same way). bfloat16 keeps float32's range,
// so it needs no loss scaling; float16 does: pair it with optim::loss_scaler.
//
// Where the engine cannot compute in that precision, the first pass says so: the CPU engine computes
// in float32, or in bfloat16 on a CPU with bf16 units (float16, and bfloat16 without them, are
// refused with the reason; float32 and tf32 run as float32), a GPU needs compute capability 8.0 for
// bfloat16. `precision = float32` is the model itself, bit for bit.

#include <distribute/engine/engine.hpp>
#include <distribute/nn/detail/model_wrapper.hpp>
#include <distribute/nn/layer.hpp>

#include <cstdint>
#include <utility>

namespace distribute::nn {

template <class M>
class with_precision : public detail::model_wrapper<M>, public detail::state_type_of<M> {
 public:
  using scalar_type = typename M::scalar_type;
  using device_type = layer_device_t<M>;
  using tensor_type = tensor<scalar_type, device_type>;

  with_precision(M model, compute_precision precision)
      : detail::model_wrapper<M>{std::move(model)}, precision_{precision} {}

  compute_precision precision() const noexcept { return precision_; }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    const precision_scope scope{r.engine(), precision_};
    return model_.forward(r, x);
  }
  // The model's forward state as a value, where it has one (layer.hpp).
  template <class R, class S>
    requires requires(M& m, R& r, const tensor_type& x, S& s) { m.forward(r, x, s); }
  tensor_type forward(R& r, const tensor_type& x, S& s) {
    const precision_scope scope{r.engine(), precision_};
    return model_.forward(r, x, s);
  }
  template <class R, class S>
    requires requires(M& m, R& r, const tensor_type& dy, S& s) { m.backward(r, s, dy); }
  tensor_type backward(R& r, S& s, const tensor_type& dy) {
    const precision_scope scope{r.engine(), precision_};
    return model_.backward(r, s, dy);
  }
  template <class R, class S>
    requires requires(M& m, R& r, const tensor_type& dy, S& s) { m.backward(r, s, dy, no_input_gradient); }
  tensor_type backward(R& r, S& s, const tensor_type& dy, no_input_gradient_t) {
    const precision_scope scope{r.engine(), precision_};
    return model_.backward(r, s, dy, no_input_gradient);
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    const precision_scope scope{r.engine(), precision_};
    return model_.backward(r, dy);
  }
  template <class R>
    requires requires(M& m, R& r, const tensor_type& dy) { m.backward(r, dy, no_input_gradient); }
  tensor_type backward(R& r, const tensor_type& dy, no_input_gradient_t) {
    const precision_scope scope{r.engine(), precision_};
    return model_.backward(r, dy, no_input_gradient);
  }

 private:
  using detail::model_wrapper<M>::model_;
  compute_precision precision_;
};

}  // namespace distribute::nn
