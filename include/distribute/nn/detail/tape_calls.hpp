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

// A layer whose backward can be recorded on a tape (nn::create_graph): `recorded_backward(tape,
// state, x, y, dy, frozen)` returns dL/dx as a variable of the tape, computed from dy (and where the
// derivative needs them, x and y) by operations recorded on it, and records its parameters' part of
// the second-order gradient unless `frozen`.
template <class L, class Tape, class V>
concept records_backward =
    requires { typename L::state_type; } && requires(L& l, Tape& t, typename L::state_type& s, V v, bool frozen) {
      { l.recorded_backward(t, s, v, v, v, frozen) } -> std::same_as<V>;
    };

}  // namespace distribute::nn::detail
