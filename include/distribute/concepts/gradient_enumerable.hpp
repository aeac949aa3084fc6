#pragma once
// A model whose parameters and gradients can be enumerated: what the gradient all-reduce, the
// broadcast of the initial state and checkpoints know of a model. The collectives know models only
// through it, so that the strategies layer does not depend on the nn layer above it.

#include <distribute/dtype.hpp>

#include <span>

namespace distribute {

namespace detail {
// What `for_each_parameter` is called with: (value, gradient) of one parameter tensor.
template <class T>
struct parameter_visitor_archetype {
  void operator()(std::span<T>, std::span<T>) const {}
};
}  // namespace detail

// A model whose parameters and gradients can be enumerated, in the same order on every replica:
// `m.for_each_parameter(f)` calls `f(std::span<scalar_type> value, std::span<scalar_type> gradient)`
// once per parameter tensor.
template <class M>
concept gradient_enumerable =
    requires { typename M::scalar_type; } && element<typename M::scalar_type> &&
    requires(M& m) { m.for_each_parameter(detail::parameter_visitor_archetype<typename M::scalar_type>{}); };

}  // namespace distribute
