#pragma once
// Layers applied in order; backward runs them in reverse. The layer list is a type (a tuple), so the
// calls are direct and inline, and parameters are enumerated layer by layer in a fixed order (the
// order every replica buckets its gradients in). After each layer's backward the replica is told
// that layer's gradients are final (`r.gradients_ready`), which lets an open gradient overlap start
// their all-reduce while the layers before it compute.

#include <distribute/detail/digest.hpp>
#include <distribute/nn/detail/layer_name.hpp>
#include <distribute/nn/layer.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace distribute::nn {

template <class... Layers>
  requires(sizeof...(Layers) > 0)
class sequential {
 public:
  using scalar_type = typename std::tuple_element_t<0, std::tuple<Layers...>>::scalar_type;
  using device_type = layer_device_t<std::tuple_element_t<0, std::tuple<Layers...>>>;
  using tensor_type = tensor<scalar_type, device_type>;
  static_assert((std::is_same_v<typename Layers::scalar_type, scalar_type> && ...),
                "distribute: the layers of a sequential must share one scalar type");
  static_assert((std::is_same_v<layer_device_t<Layers>, device_type> && ...),
                "distribute: the layers of a sequential must share one device type");

  explicit sequential(Layers... layers) : layers_{std::move(layers)...} {}

  template <std::size_t I>
  auto& get() noexcept { return std::get<I>(layers_); }
  static constexpr std::size_t size() noexcept { return sizeof...(Layers); }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward_from<0>(r, x);
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward_from<sizeof...(Layers) - 1>(r, dy);
  }
  // Every parameter's gradient, not the input's (no_input_gradient_t): the first layer is asked for
  // its parameters' gradients only where it can skip the rest. Returns an empty tensor.
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy, no_input_gradient_t) {
    auto& first = std::get<0>(layers_);
    const tensor_type d = [&] {
      if constexpr (sizeof...(Layers) > 1) return backward_from<sizeof...(Layers) - 1, 1>(r, dy);
      else return dy;
    }();
    naming_layer<0>([&] {
      if constexpr (requires { first.backward(r, d, no_input_gradient); }) first.backward(r, d, no_input_gradient);
      else first.backward(r, d);
    });
    detail::gradients_ready(r, first);
    return tensor_type{};
  }

  template <class F>
  void for_each_parameter(F&& f) {
    std::apply([&](auto&... l) { (l.for_each_parameter(f), ...); }, layers_);
  }
  // Non-trainable state (running statistics) of the layers that have any, in layer order.
  template <class F>
  void for_each_buffer(F&& f) {
    std::apply([&](auto&... l) { (buffers_of(l, f), ...); }, layers_);
  }
  void zero_grad() {
    std::apply([](auto&... l) { (l.zero_grad(), ...); }, layers_);
  }
  void set_training(bool on) {
    std::apply([on](auto&... l) { (l.set_training(on), ...); }, layers_);
  }
  // For strategy.verify_mirrored: the bits of the parameters and of the buffers (running statistics),
  // which mirrored copies must keep identical alike (const in effect; enumeration is non-const).
  std::uint64_t state_digest() const { return distribute::detail::digest_model(const_cast<sequential&>(*this)).state(); }

 private:
  template <class L, class F>
  static void buffers_of(L& l, F& f) {
    if constexpr (requires { l.for_each_buffer(f); }) l.for_each_buffer(f);
  }
  template <std::size_t I, class R>
  tensor_type forward_from(R& r, const tensor_type& x) {
    auto y = naming_layer<I>([&] { return std::get<I>(layers_).forward(r, x); });
    if constexpr (I + 1 < sizeof...(Layers)) return forward_from<I + 1>(r, y);
    else return y;
  }
  // Layers I down to Last, in reverse.
  template <std::size_t I, std::size_t Last = 0, class R>
  tensor_type backward_from(R& r, const tensor_type& dy) {
    auto dx = naming_layer<I>([&] { return std::get<I>(layers_).backward(r, dy); });
    detail::gradients_ready(r, std::get<I>(layers_));
    if constexpr (I > Last) return backward_from<I - 1, Last>(r, dx);
    else return dx;
  }
  // A layer's error about its input says which layer of this sequential it is.
  template <std::size_t I, class F>
  static decltype(auto) naming_layer(F&& f) {
    try {
      return f();
    } catch (const std::invalid_argument& e) {
      std::string what = e.what();
      if (what.rfind("distribute: ", 0) == 0) what.erase(0, 12);
      throw std::invalid_argument("distribute: layer " + std::to_string(I) + " (" +
                                  detail::layer_name<std::tuple_element_t<I, std::tuple<Layers...>>>() + ") of a sequential of " +
                                  std::to_string(sizeof...(Layers)) + ": " + what);
    }
  }

  std::tuple<Layers...> layers_;
};

}  // namespace distribute::nn
