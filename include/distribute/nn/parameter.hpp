#pragma once
// A trainable tensor and its gradient, and the enumeration every layer offers: what optimisers and
// `replica_context::all_reduce_gradients` work through.

#include <distribute/concepts/device.hpp>
#include <distribute/concepts/gradient_enumerable.hpp>
#include <distribute/detail/digest.hpp>
#include <distribute/nn/detail/random.hpp>
#include <distribute/tensor/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace distribute::nn {

// A model or layer that enumerates (value, gradient) spans of its parameters in a fixed order; the
// same concept `all_reduce_gradients` and the optimisers accept.
template <class M>
concept parameterized = gradient_enumerable<M>;

// Weights N(0, 0.02) (the CycleGAN/DCGAN initialisation), scales N(1, 0.02), biases zero.
enum class init : std::uint8_t { normal, scale, zero };
inline constexpr double init_stddev = 0.02;

// A digest of every parameter value of `model`, in enumeration order. Models' `state_digest()` (for
// `strategy.verify_mirrored`) covers their buffers too: distribute::detail::digest_model.
template <parameterized M>
std::uint64_t parameter_digest(M& model) {
  return distribute::detail::digest_model(model).parameters;
}

// Initial values are drawn on the host from the seed and copied to the device, so a model starts from
// the same weights on every device.
template <class T, device D = cpu>
struct parameter {
  tensor<T, D> value;
  tensor<T, D> grad;

  parameter() = default;
  parameter(shape s, init how, std::uint64_t seed, const D& device = {})
      : value{initial(s, how, seed, device)}, grad{s, device} {}

  template <class F>
  void visit(F&& f) {
    f(value.values(), grad.values());
  }
  void zero_grad() { grad.fill(T(0)); }

 private:
  static tensor<T, D> initial(shape s, init how, std::uint64_t seed, const D& device) {
    std::vector<T> host(static_cast<std::size_t>(s.numel()), T(0));
    switch (how) {
      case init::normal: detail::fill_normal(std::span<T>(host), seed, 0.0, init_stddev); break;
      case init::scale: detail::fill_normal(std::span<T>(host), seed, 1.0, init_stddev); break;
      case init::zero: break;
    }
    return tensor<T, D>::from_host(s, std::span<const T>(host), device);
  }
};

}  // namespace distribute::nn
