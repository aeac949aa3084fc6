#pragma once
// The names of a model's state in PyTorch's `state_dict` convention, so that files written from a
// model here (nn/safetensors.hpp) load into the same network written in PyTorch, and back:
//
//   sequential{conv2d, instance_norm, relu, ...}   0.weight, 0.bias, 3.weight, ...
//   batch_norm                                    weight (gamma), bias (beta), running_mean, running_var
//   residual_block                                body.0.weight, body.3.weight, ...
//
// Parameters are visited as `parameter<T, D>&` (value and shape, on the layer's device); buffers
// (running statistics, held on the host in double) as `std::span<double>`. Layers without state
// (activations, pooling, flatten) name nothing but, inside a sequential, take their position as
// PyTorch's nn.Sequential does. Dropout's buffer (a position in its random sequence) has no PyTorch
// counterpart and is not named.
//
// A layer of the user's names its state with a member `template <class S> void name_state(S& s)`:
//
//   s.child("body", body_);     // a sub-module held as an attribute: "body.<its names>"
//   s.next(conv_);              // the next position of the enclosing sequential: "<i>.<its names>"
//   s.same(v);                  // another view of this very module (a variant, a wrapper)
//   s.parameter("weight", p);   s.buffer("running_mean", span);
//
// A layer whose sub-layers sit directly in the enclosing sequential in PyTorch (a run-time count of
// blocks, a conv-norm-activation stage written as one type) declares
// `static constexpr bool unpacks_into_sequential = true;` and calls `s.next` for each of them.
//
// A layer with parameters or buffers that names none of them is an error naming the layer: a name
// guessed from a position would load weights into the wrong tensors without a word.

#include <distribute/nn/batch_norm.hpp>
#include <distribute/nn/detail/layer_name.hpp>
#include <distribute/nn/detail/model_wrapper.hpp>
#include <distribute/nn/detail/weight_and_bias.hpp>
#include <distribute/nn/dropout.hpp>
#include <distribute/nn/instance_norm.hpp>
#include <distribute/nn/parameter.hpp>
#include <distribute/nn/residual_block.hpp>
#include <distribute/nn/sequential.hpp>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

namespace distribute::nn {

template <class V>
class state_scope;

namespace detail {

template <class L, class V>
void name_state_of(L& layer, state_scope<V>& s);

template <class L>
concept unpacks_into_sequential = requires { requires L::unpacks_into_sequential; };

// The library's layers, named as their PyTorch counterparts (nn.Conv2d, nn.ConvTranspose2d,
// nn.Linear: weight and bias in the same layout; nn.BatchNorm2d; nn.InstanceNorm2d).
template <class T, class D, class V>
void name_library_state(weight_and_bias<T, D>& l, state_scope<V>& s) {
  s.parameter("weight", l.weight());
  s.parameter("bias", l.bias());
}
template <class T, class D, bool Sync, class V>
void name_library_state(basic_batch_norm<T, D, Sync>& l, state_scope<V>& s) {
  s.parameter("weight", l.gamma());
  s.parameter("bias", l.beta());
  // The enumeration gives the only writable view of the statistics; its order is (mean, var).
  int i = 0;
  l.for_each_buffer([&](std::span<double> b) { s.buffer(i++ == 0 ? "running_mean" : "running_var", b); });
}
template <class T, class D, class V>
void name_library_state(instance_norm<T, D>& l, state_scope<V>& s) {
  s.parameter("weight", l.gamma());  // empty, and so not named, without affine
  s.parameter("bias", l.beta());
}
template <class T, class D, class V>
void name_library_state(dropout<T, D>&, state_scope<V>&) {}
template <class... Layers, class V>
void name_library_state(sequential<Layers...>& l, state_scope<V>& s) {
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (s.next(l.template get<I>()), ...);
  }(std::index_sequence_for<Layers...>{});
}
template <class T, class D, class V>
void name_library_state(residual_block<T, D>& l, state_scope<V>& s) {
  s.child("body", l.body());
}
template <class M, class V>
void name_library_state(model_wrapper<M>& l, state_scope<V>& s) {
  s.same(l.model());
}

template <class L>
bool has_state(L& layer) {
  bool any = false;
  layer.for_each_parameter([&](auto value, auto) { any = any || !value.empty(); });
  if constexpr (requires { layer.for_each_buffer([](std::span<double>) {}); })
    layer.for_each_buffer([&](std::span<double> b) { any = any || !b.empty(); });
  return any;
}

}  // namespace detail

// Where a layer names its state: the names given here are prefixed with the path of the layer in
// the model. `V` receives `parameter(const std::string&, parameter<T, D>&)` and
// `buffer(const std::string&, std::span<double>)`.
template <class V>
class state_scope {
 public:
  state_scope(V& visitor, std::string prefix) : visitor_{&visitor}, prefix_{std::move(prefix)} {}

  template <class T, class D>
  void parameter(std::string_view name, nn::parameter<T, D>& p) {
    if (!p.value.empty()) visitor_->parameter(prefix_ + std::string(name), p);
  }
  void buffer(std::string_view name, std::span<double> b) { visitor_->buffer(prefix_ + std::string(name), b); }

  template <class L>
  void child(std::string_view name, L& layer) {
    state_scope inner{*visitor_, prefix_ + std::string(name) + "."};
    detail::name_state_of(layer, inner);
  }
  template <class L>
  void next(L& layer) {
    if constexpr (detail::unpacks_into_sequential<L>) {
      detail::name_state_of(layer, *this);
    } else {
      child(std::to_string(position_++), layer);
    }
  }
  template <class L>
  void same(L& layer) {
    detail::name_state_of(layer, *this);
  }

  const std::string& prefix() const noexcept { return prefix_; }

 private:
  V* visitor_;
  std::string prefix_;
  std::size_t position_ = 0;  // of the next layer in the sequential this scope is
};

namespace detail {

template <class L, class V>
void name_state_of(L& layer, state_scope<V>& s) {
  if constexpr (requires { layer.name_state(s); }) {
    layer.name_state(s);
  } else if constexpr (requires { name_library_state(layer, s); }) {
    name_library_state(layer, s);
  } else if (has_state(layer)) {
    throw std::invalid_argument("distribute: layer " + layer_name<L>() +
                                (s.prefix().empty() ? "" : " at '" + s.prefix() + "'") +
                                " has parameters or buffers but no names for them; give it a member "
                                "`template <class S> void name_state(S& s)` (nn/state_dict.hpp)");
  }
}

}  // namespace detail

// Visits every named tensor of `model` (see above), in the order of the model's layers.
template <class M, class V>
void for_each_named_state(M& model, V&& visitor) {
  state_scope<std::remove_reference_t<V>> s{visitor, ""};
  detail::name_state_of(model, s);
}

}  // namespace distribute::nn
