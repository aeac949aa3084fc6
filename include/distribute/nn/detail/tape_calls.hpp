#pragma once
// What nn::tape (nn/tape.hpp) asks of the calls it records: whether a layer keeps its forward's state
// as a value, and the last type of a call's arguments (a trailing nn::frozen).

#include <concepts>
#include <type_traits>

namespace distribute::nn::detail {

template <class... A>
struct last_of {
  using type = typename decltype((std::type_identity<A>{}, ...))::type;
};
template <class... A>
using last_of_t = typename last_of<A...>::type;

// A layer a tape can call: a forward through a replica (the stateful pair at least).
template <class L, class R, class Tensor>
concept forward_through = requires(L& l, R& r, const Tensor& x) { l.forward(r, x); };

// A model written for a tape, called with the tape and the variables V.
template <class M, class Tape, class... V>
concept records_itself = requires(M& m, Tape& t, V... v) {
  { m(t, v...) } -> std::same_as<typename Tape::variable>;
};

template <class L, class R, class Tensor>
concept forward_state_value =
    requires { typename L::state_type; } && requires(L& l, R& r, const Tensor& x, typename L::state_type& s) {
      { l.forward(r, x, s) } -> std::same_as<Tensor>;
      { l.backward(r, s, x) } -> std::same_as<Tensor>;
    };

}  // namespace distribute::nn::detail
