#pragma once
// Layers applied in order; backward runs them in reverse. The layer list is a type (a tuple), so the
// calls are direct and inline, and parameters are enumerated layer by layer in a fixed order (the
// order every replica buckets its gradients in). After each layer's backward the replica is told
// that layer's gradients are final (`r.gradients_ready`), which lets an open gradient overlap start
// their all-reduce while the layers before it compute.
//
// Where every layer's forward state is a value (layer.hpp), so is the sequential's: the tuple of its
// layers' states, and a sequential can be applied several times before its backwards.
//
// Fusion: a norm followed by nn::relu (instance_norm, relu) runs as one layer, the ReLU applied in
// the norm's output pass and its mask in the norm's backward (detail::norm_epilogue), with the same
// values as the two layers one after the other; the relu's own forward and backward are skipped.
// `forward(r, x, plus_input)` returns layers(x) + x (a residual connection), the add done in the last
// layer's output pass where that layer can; `backward(r, dy, plus_input)` returns the matching
// gradient, backward(dy) + dy.

#include <distribute/detail/digest.hpp>
#include <distribute/detail/element_kernels.hpp>
#include <distribute/nn/detail/layer_name.hpp>
#include <distribute/nn/detail/norm_epilogue.hpp>
#include <distribute/nn/layer.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

namespace distribute::nn {

namespace detail {
template <class L>
concept has_forward_state = requires { typename L::state_type; };
// The state of a sequential some of whose layers keep theirs inside (only the stateful pair).
struct no_forward_state {
  state_stamp stamp;
};
template <bool Values, class... Layers>
struct sequential_state {
  using type = no_forward_state;
};
template <class... Layers>
struct sequential_state<true, Layers...> {
  struct type {
    state_stamp stamp;
    std::tuple<typename Layers::state_type...> layers;
  };
};
}  // namespace detail

// Asks a sequential for layers(x) + x (forward) and backward(dy) + dy (backward): a residual
// connection around it, in as few passes as its layers allow.
struct plus_input_t {
  explicit constexpr plus_input_t() = default;
};
inline constexpr plus_input_t plus_input{};

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

  // Whether every layer's forward state is a value, and so the sequential's (`state_type`).
  static constexpr bool keeps_states = (detail::has_forward_state<Layers> && ...);
  using state_type = typename detail::sequential_state<keeps_states, Layers...>::type;

  explicit sequential(Layers... layers) : layers_{std::move(layers)...} {}

  template <std::size_t I>
  auto& get() noexcept {
    return std::get<I>(layers_);
  }
  static constexpr std::size_t size() noexcept { return sizeof...(Layers); }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward_plus(r, x, nullptr);
  }
  template <class R>
    requires keeps_states
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    return forward_plus(r, x, s, nullptr);
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, plus_input_t) {
    return forward_plus(r, x, &x);
  }
  template <class R>
    requires keeps_states
  tensor_type forward(R& r, const tensor_type& x, state_type& s, plus_input_t) {
    return forward_plus(r, x, s, &x);
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    if constexpr (keeps_states) {
      return backward(r, kept_.last(r, this, "sequential"), dy);
    } else {
      detail::no_forward_state none;
      return backward_from<sizeof...(Layers) - 1>(r, dy, none);
    }
  }
  template <class R>
    requires keeps_states
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    detail::claim(r, s.stamp, this, "sequential");
    return backward_from<sizeof...(Layers) - 1>(r, dy, s);
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy, plus_input_t) {
    return plus(r, backward(r, dy), dy);
  }
  template <class R>
    requires keeps_states
  tensor_type backward(R& r, state_type& s, const tensor_type& dy, plus_input_t) {
    return plus(r, backward(r, s, dy), dy);
  }
  // The backward recorded on a tape (nn::create_graph): the layers called again on the tape from x (a
  // second forward, unfused) and the recorded gradient of that chain at dy, so each layer needs a
  // recorded backward of its own (the error names the first without one).
  template <class Tape>
    requires keeps_states
  typename Tape::variable recorded_backward(Tape& t, state_type&, typename Tape::variable x, typename Tape::variable,
                                            typename Tape::variable dy, bool frozen) {
    return t.recorded_through_parts(x, dy, frozen, [&](typename Tape::variable h) {
      std::apply([&](auto&... l) { ((h = t(l, h)), ...); }, layers_);
      return h;
    });
  }
  // Every parameter's gradient, not the input's (no_input_gradient_t): the first layer is asked for
  // its parameters' gradients only where it can skip the rest. Returns an empty tensor.
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy, no_input_gradient_t) {
    if constexpr (keeps_states) {
      return backward(r, kept_.last(r, this, "sequential"), dy, no_input_gradient);
    } else {
      detail::no_forward_state none;
      return parameter_gradients(r, dy, none);
    }
  }
  template <class R>
    requires keeps_states
  tensor_type backward(R& r, state_type& s, const tensor_type& dy, no_input_gradient_t) {
    detail::claim(r, s.stamp, this, "sequential");
    return parameter_gradients(r, dy, s);
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
  std::uint64_t state_digest() const {
    return distribute::detail::digest_model(const_cast<sequential&>(*this)).state();
  }

 private:
  template <class L, class F>
  static void buffers_of(L& l, F& f) {
    if constexpr (requires { l.for_each_buffer(f); }) l.for_each_buffer(f);
  }
  template <std::size_t I>
  using layer_at = std::tuple_element_t<I, std::tuple<Layers...>>;
  // Whether layer I takes the relu after it into its own passes (both ways).
  template <std::size_t I, class R>
  static constexpr bool fuses_relu_after() {
    if constexpr (I + 1 < sizeof...(Layers))
      return detail::takes_norm_epilogue<layer_at<I>, R> && detail::relu_layer<layer_at<I + 1>>;
    else return false;
  }

  template <class R>
  tensor_type forward_plus(R& r, const tensor_type& x, const tensor_type* residual) {
    if constexpr (keeps_states) {
      return forward_plus(r, x, kept_.next(), residual);
    } else {
      detail::no_forward_state none;
      return forward_from<0>(r, x, none, residual);
    }
  }
  template <class R>
  tensor_type forward_plus(R& r, const tensor_type& x, state_type& s, const tensor_type* residual) {
    auto y = forward_from<0>(r, x, s, residual);
    kept_.stamp(s, this);
    return y;
  }
  template <class R>
  static tensor_type plus(R& r, tensor_type y, const tensor_type& x) {
    if (y.shape() != x.shape())
      throw std::invalid_argument("distribute: sequential with plus_input: its output has shape " +
                                  y.shape().to_string() + ", its input " + x.shape().to_string() +
                                  "; a residual connection needs the same shape");
    detail::engine_of<device_type>(r).for_each(static_cast<std::int64_t>(y.size()),
                                               distribute::detail::kernels::add_to<scalar_type>{y.data(), x.data()});
    return y;
  }
  // `states`: the layers' states, or no_forward_state where the layers keep their own. `residual`,
  // where not null, is added to the last layer's output.
  template <std::size_t I, class R, class S>
  tensor_type forward_from(R& r, const tensor_type& x, S& states, const tensor_type* residual) {
    using L = layer_at<I>;
    constexpr bool fused = fuses_relu_after<I, R>();
    constexpr std::size_t next = fused ? I + 2 : I + 1;
    constexpr bool last = next == sizeof...(Layers);
    auto y = naming_layer<I>([&] {
      auto& l = std::get<I>(layers_);
      if constexpr (detail::takes_norm_epilogue<L, R>) {
        const detail::norm_epilogue<scalar_type, device_type> then{fused, last ? residual : nullptr};
        if constexpr (std::is_same_v<S, detail::no_forward_state>) return l.forward(r, x, then);
        else return l.forward(r, x, std::get<I>(states.layers), then);
      } else {
        if constexpr (std::is_same_v<S, detail::no_forward_state>) return l.forward(r, x);
        else return l.forward(r, x, std::get<I>(states.layers));
      }
    });
    if constexpr (!last) {
      return forward_from<next>(r, y, states, residual);
    } else {
      if constexpr (!detail::takes_norm_epilogue<L, R>)
        if (residual) return plus(r, std::move(y), *residual);
      return y;
    }
  }
  // Layers I down to Last, in reverse. A relu fused into the layer before it passes dy on untouched:
  // that layer's backward applies its mask.
  template <std::size_t I, std::size_t Last = 0, class R, class S>
  tensor_type backward_from(R& r, const tensor_type& dy, S& states) {
    if constexpr (I > 0) {
      if constexpr (fuses_relu_after<I - 1, R>()) {
        if constexpr (I > Last) return backward_from<I - 1, Last>(r, dy, states);
        else return dy;
      }
    }
    auto dx = naming_layer<I>([&] {
      if constexpr (std::is_same_v<S, detail::no_forward_state>) return std::get<I>(layers_).backward(r, dy);
      else return std::get<I>(layers_).backward(r, std::get<I>(states.layers), dy);
    });
    detail::gradients_ready(r, std::get<I>(layers_));
    if constexpr (I > Last) return backward_from<I - 1, Last>(r, dx, states);
    else return dx;
  }
  template <class R, class S>
  tensor_type parameter_gradients(R& r, const tensor_type& dy, S& states) {
    auto& first = std::get<0>(layers_);
    const tensor_type d = [&] {
      if constexpr (sizeof...(Layers) > 1) return backward_from<sizeof...(Layers) - 1, 1>(r, dy, states);
      else return dy;
    }();
    naming_layer<0>([&] {
      if constexpr (std::is_same_v<S, detail::no_forward_state>) {
        if constexpr (requires { first.backward(r, d, no_input_gradient); }) first.backward(r, d, no_input_gradient);
        else first.backward(r, d);
      } else {
        auto& s = std::get<0>(states.layers);
        if constexpr (requires { first.backward(r, s, d, no_input_gradient); })
          first.backward(r, s, d, no_input_gradient);
        else first.backward(r, s, d);
      }
    });
    detail::gradients_ready(r, first);
    return tensor_type{};
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
                                  detail::layer_name<std::tuple_element_t<I, std::tuple<Layers...>>>() +
                                  ") of a sequential of " + std::to_string(sizeof...(Layers)) + ": " + what);
    }
  }

  std::tuple<Layers...> layers_;
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
