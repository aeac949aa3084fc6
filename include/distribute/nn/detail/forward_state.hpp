#pragma once
// What a forward keeps for its backward, as a value the caller can hold (libtorch's ctx): each layer
// names it `state_type`, fills one in `forward(r, x, state)` and reads it in `backward(r, state, dy)`.
// One layer can then be applied several times before the backwards (a discriminator on fake and on
// real, an encoder shared by two branches), each application with a state of its own.
//
// The stateful pair `forward(r, x)` / `backward(r, dy)` keeps one such state in the layer. Both forms
// check their pairing, because a state used twice, or another forward's state, gives gradients that
// are wrong without looking wrong:
// - a state serves one backward: a second backward without a forward between them is an error (so
//   PyTorch's order `D(fake); D(real); backward; backward` fails at the second backward instead of
//   training on gradients of the wrong input);
// - a state belongs to the layer whose forward filled it: another layer's state is an error;
// - each state carries its forward's number in the layer (a generation count), for the messages.
// While a CUDA graph is captured (nn::graphed), a replayed forward ran no host code: the state it
// stands for is taken as it is.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace distribute::nn {

// A forward's state used wrongly: for a backward it does not belong to, or for a second backward.
class forward_state_error : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {

// The bookkeeping every layer's state carries besides its tensors.
struct state_stamp {
  const void* owner = nullptr;   // the layer whose forward filled it
  std::uint64_t generation = 0;  // that forward's number in the layer, from 1
  bool pending = false;          // filled, and no backward has used it yet
};

template <class R>
bool capturing_graph(const R& r) {
  if constexpr (requires { r.graph_capture_mode(); }) return static_cast<int>(r.graph_capture_mode()) != 0;
  else return false;
}

// Checks that `s` is a state `owner` filled and no backward used yet, and marks it used.
template <class R>
void claim(const R& r, state_stamp& s, const void* owner, const char* layer) {
  if (capturing_graph(r)) {
    s.pending = false;
    return;
  }
  if (s.owner == nullptr)
    throw forward_state_error(std::string("distribute: ") + layer + "::backward got a state that no forward filled");
  if (s.owner != owner)
    throw forward_state_error(std::string("distribute: ") + layer + "::backward got the state of another " + layer +
                              "'s forward; a state belongs to the layer that filled it");
  if (!s.pending)
    throw forward_state_error(std::string("distribute: ") + layer + "::backward got the state of its forward " +
                              std::to_string(s.generation) +
                              " a second time; a forward's state serves one backward (forward again first)");
  s.pending = false;
}

// A layer's generation count and the state of its stateful pair.
template <class State>
class kept_state {
 public:
  // For `forward(r, x, s)`: stamps `s` as the next forward of `owner`.
  void stamp(State& s, const void* owner) noexcept { s.stamp = state_stamp{owner, ++generation_, true}; }
  // For the stateful `forward(r, x)`: the layer's own state, about to be overwritten.
  State& next() noexcept {
    ++unpaired_;
    return state_;
  }
  // For the stateful `backward(r, dy)`: the state of the last forward, which must be waiting for it.
  template <class R>
  State& last(const R& r, const void* owner, const char* layer) {
    if (!capturing_graph(r) && (!state_.stamp.pending || state_.stamp.owner != owner)) {
      std::string why = generation_ == 0 || state_.stamp.owner != owner ? std::string(" without a forward pass")
                                                                        : " with no forward since its last backward";
      if (overwritten_ > 0)
        why += ": the forward before that backward ran " + std::to_string(overwritten_ + 1) +
               " times in a row, and the stateful pair keeps the last forward's state only, so the earlier "
               "forwards' states were overwritten and that backward used another forward's state; apply a layer "
               "several times with one state per application (forward(r, x, state), backward(r, state, dy)) or "
               "record the calls on an nn::tape";
      else why += "; a forward's state serves one backward";
      throw forward_state_error(std::string("distribute: ") + layer + "::backward called" + why);
    }
    overwritten_ = unpaired_ > 0 ? unpaired_ - 1 : 0;
    unpaired_ = 0;
    return state_;
  }
  // Forwards so far (the generation count).
  std::uint64_t generation() const noexcept { return generation_; }

 private:
  State state_{};
  std::uint64_t generation_ = 0;
  std::uint64_t unpaired_ = 0;     // stateful forwards since the last stateful backward
  std::uint64_t overwritten_ = 0;  // states the last stateful backward's forward had overwritten
};

// A wrapper's `state_type`: the wrapped model's, where it has one.
template <class M>
struct state_type_of {};
template <class M>
  requires requires { typename M::state_type; }
struct state_type_of<M> {
  using state_type = typename M::state_type;
};

}  // namespace detail
}  // namespace distribute::nn
