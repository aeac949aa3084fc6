#pragma once
// What a layer is: forward and backward through a replica (so that layers that communicate, such as
// sync_batch_norm, can; the others ignore it), gradients that accumulate until `zero_grad`, and the
// enumeration of parameters. `forward` keeps what `backward` needs; `backward` takes dL/dy and returns
// dL/dx, adding dL/dparameter to the parameters' gradients.
//
// What forward keeps is a value, the layer's `state_type` (nn/detail/forward_state.hpp):
// `forward(r, x, state)` fills one and `backward(r, state, dy)` uses it, so a layer can be applied
// several times before the backwards. `forward(r, x)` / `backward(r, dy)` keep one state in the
// layer; each state serves one backward, and misuse is an error naming the layer.
//
// Layers are generic over the device D of their replica (`tensor<T, D>`, `parameter<T, D>`) and do
// their arithmetic through the replica's engine (`r.engine()`, engine/engine.hpp): the same layer
// runs wherever an engine exists. A replica's engine uses that replica's share of the cores.

#include <distribute/comm/local.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/nn/detail/forward_state.hpp>
#include <distribute/nn/parameter.hpp>
#include <distribute/replica_context.hpp>
#include <distribute/engine/cpu.hpp>
#include <distribute/tensor/tensor.hpp>

#include <concepts>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace distribute::nn {

// The replica of a program without a strategy (tests, single-device tools): collectives are no-ops.
using local_replica = replica_context<cpu, comm::local>;
inline local_replica local() { return local_replica{cpu{}, comm::local{}}; }

// The device a layer computes on: its `device_type`, or the CPU for layers that name none.
template <class L>
struct layer_device {
  using type = cpu;
};
template <class L>
  requires requires { typename L::device_type; }
struct layer_device<L> {
  using type = typename L::device_type;
};
template <class L>
using layer_device_t = typename layer_device<L>::type;

// The tensor a layer takes and returns.
template <class L>
using layer_tensor_t = tensor<typename L::scalar_type, layer_device_t<L>>;

template <class L, class R = local_replica>
concept layer = parameterized<L> && requires(L& l, R& r, const layer_tensor_t<L>& x) {
  { l.forward(r, x) } -> std::same_as<layer_tensor_t<L>>;
  { l.backward(r, x) } -> std::same_as<layer_tensor_t<L>>;
  l.zero_grad();
  l.set_training(true);
};

// A layer whose forward's state is a value the caller holds: what nn::tape needs to record a layer
// applied several times in one step.
template <class L, class R = local_replica>
concept layer_with_state = layer<L, R> && requires(L& l, R& r, const layer_tensor_t<L>& x, typename L::state_type& s) {
  { l.forward(r, x, s) } -> std::same_as<layer_tensor_t<L>>;
  { l.backward(r, s, x) } -> std::same_as<layer_tensor_t<L>>;
};

// Asks `backward` for the parameters' gradients only: the input's gradient is not computed and an
// empty tensor is returned. For the first layer of a network whose input is data (a real image, a
// detached sample), where dL/dx would be thrown away; `sequential` passes it to its first layer.
// Layers that take it: conv2d, conv_transpose2d, sequential (the others ignore the question).
struct no_input_gradient_t {
  explicit constexpr no_input_gradient_t() = default;
};
inline constexpr no_input_gradient_t no_input_gradient{};

namespace detail {
// Layers without parameters or modes share these members.
struct stateless {
  template <class F>
  void for_each_parameter(F&&) {}
  void zero_grad() {}
  void set_training(bool) {}
};

// Tells replica `r` that `layer`'s gradients are final for this step, where the replica can hear it
// (replica_context::gradients_ready); other replica types are not told.
template <class R, class L>
void gradients_ready(R& r, L& layer) {
  if constexpr (requires { r.gradients_ready(layer); }) r.gradients_ready(layer);
}

// The engine of replica `r`, which must compute on the layer's device.
template <class D, class R>
decltype(auto) engine_of(R& r) {
  static_assert(std::is_same_v<typename R::device_type, D>,
                "distribute: a layer on one device was called from a replica of another");
  return r.engine();
}

// The public backward passes of a layer with weights: with the input's gradient and without it
// (no_input_gradient_t; an empty tensor is returned), from the layer's own state (the stateful pair)
// or from one the caller holds. The layer computes all four in one private
// `backward_pass(r, state, dy, bool input_gradient)`, names itself in `layer_name`, keeps its states
// in `kept_` (detail::kept_state), and befriends this base.
template <class Derived>
class optional_input_gradient {
 public:
  template <class R, class Tensor>
  Tensor backward(R& r, const Tensor& dy) {
    auto& self = static_cast<Derived&>(*this);
    return self.backward_pass(r, self.kept_.last(r, &self, Derived::layer_name), dy, true);
  }
  template <class R, class Tensor>
  Tensor backward(R& r, const Tensor& dy, no_input_gradient_t) {
    auto& self = static_cast<Derived&>(*this);
    return self.backward_pass(r, self.kept_.last(r, &self, Derived::layer_name), dy, false);
  }
  // `Self` defers the look-up of state_type to the call: Derived is incomplete where this base is
  // instantiated, and nvcc checks a constraint that names it there.
  template <class R, class S, class Tensor, class Self = Derived>
    requires std::same_as<S, typename Self::state_type>
  Tensor backward(R& r, S& state, const Tensor& dy) {
    return static_cast<Derived&>(*this).backward_pass(r, state, dy, true);
  }
  template <class R, class S, class Tensor, class Self = Derived>
    requires std::same_as<S, typename Self::state_type>
  Tensor backward(R& r, S& state, const Tensor& dy, no_input_gradient_t) {
    return static_cast<Derived&>(*this).backward_pass(r, state, dy, false);
  }
};

}  // namespace detail

}  // namespace distribute::nn
