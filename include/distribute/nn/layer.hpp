#pragma once
// What a layer is: forward and backward through a replica (so that layers that communicate, such as
// sync_batch_norm, can; the others ignore it), gradients that accumulate until `zero_grad`, and the
// enumeration of parameters. `forward` keeps what `backward` needs; `backward` takes dL/dy and returns
// dL/dx, adding dL/dparameter to the parameters' gradients.
//
// Layers compute single-threaded on the replica's thread: the replicas are the parallelism, and a
// fixed order of every sum makes runs bit-identical.

#include <distribute/comm/local.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/nn/parameter.hpp>
#include <distribute/replica_context.hpp>
#include <distribute/tensor/tensor.hpp>

#include <concepts>
#include <stdexcept>
#include <string>

namespace distribute::nn {

// The replica of a program without a strategy (tests, single-device tools): collectives are no-ops.
using local_replica = replica_context<cpu, comm::local>;
inline local_replica local() { return local_replica{cpu{}, comm::local{}}; }

template <class L, class R = local_replica>
concept layer = parameterized<L> && requires(L& l, R& r, const tensor<typename L::scalar_type>& x) {
  { l.forward(r, x) } -> std::same_as<tensor<typename L::scalar_type>>;
  { l.backward(r, x) } -> std::same_as<tensor<typename L::scalar_type>>;
  l.zero_grad();
  l.set_training(true);
};

namespace detail {
// Layers without parameters or modes share these members.
struct stateless {
  template <class F>
  void for_each_parameter(F&&) {}
  void zero_grad() {}
  void set_training(bool) {}
};

[[noreturn]] inline void backward_before_forward(const char* layer) {
  throw std::logic_error(std::string("distribute: ") + layer + "::backward called without a forward pass");
}
}  // namespace detail

}  // namespace distribute::nn
