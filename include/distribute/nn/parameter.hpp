#pragma once
// A trainable tensor and its gradient, and the enumeration every layer offers: what optimisers and
// `replica_context::all_reduce_gradients` work through.

#include <distribute/comm/detail/gradient_buckets.hpp>
#include <distribute/detail/digest.hpp>
#include <distribute/nn/detail/random.hpp>
#include <distribute/tensor/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

namespace distribute::nn {

// A model or layer that enumerates (value, gradient) spans of its parameters in a fixed order; the
// same concept `all_reduce_gradients` and the optimisers accept.
template <class M>
concept parameterized = gradient_enumerable<M>;

// Weights N(0, 0.02) (the CycleGAN/DCGAN initialisation), scales N(1, 0.02), biases zero.
enum class init : std::uint8_t { normal, scale, zero };
inline constexpr double init_stddev = 0.02;

// A digest of every parameter value of `model`, in enumeration order: equal on every replica while
// mirrored copies stay in sync (models' `state_digest()` returns it, for `strategy.verify_mirrored`).
template <parameterized M>
std::uint64_t parameter_digest(M& model) {
  std::uint64_t h = distribute::detail::fnv1a_basis;
  model.for_each_parameter([&](auto value, auto) { h = distribute::detail::fnv1a(value.data(), value.size_bytes(), h); });
  return h;
}

template <class T>
struct parameter {
  tensor<T> value;
  tensor<T> grad;

  parameter() = default;
  parameter(shape s, init how, std::uint64_t seed) : value{s}, grad{s} {
    switch (how) {
      case init::normal: detail::fill_normal(value.values(), seed, 0.0, init_stddev); break;
      case init::scale: detail::fill_normal(value.values(), seed, 1.0, init_stddev); break;
      case init::zero: break;
    }
  }

  template <class F>
  void visit(F&& f) { f(value.values(), grad.values()); }
  void zero_grad() { grad.fill(T(0)); }
};

}  // namespace distribute::nn
