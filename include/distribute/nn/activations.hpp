#pragma once
// Element-wise activations: relu, leaky_relu (the PatchGAN discriminator's, slope 0.2) and tanh (the
// generator's output). Each keeps what its derivative needs: the input for the piecewise-linear ones,
// the output for tanh (1 - y^2), in its state_type (layer.hpp). The arithmetic is the engine's
// (nn/detail/activation_kernels.hpp).

#include <distribute/nn/detail/activation_kernels.hpp>
#include <distribute/nn/layer.hpp>

#include <stdexcept>
#include <string>

namespace distribute::nn {

namespace detail {
template <class T, class D>
void check_same_shape(const char* layer, const tensor<T, D>& dy, const tensor<T, D>& kept) {
  if (dy.shape() != kept.shape())
    throw std::invalid_argument(std::string("distribute: ") + layer + " backward got dy of shape " +
                                dy.shape().to_string() + ", expected " + kept.shape().to_string());
}
}  // namespace detail

template <class T = float, device D = cpu>
class relu : public detail::stateless {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  // A norm right before it in a sequential takes it into its own passes (detail::norm_epilogue).
  static constexpr bool is_relu = true;
  struct state_type {
    detail::state_stamp stamp;
    tensor_type input;
  };

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    s.input = x;
    tensor_type y{x.shape(), x.device(), uninitialized};
    detail::engine_of<D>(r).for_each(static_cast<std::int64_t>(x.size()),
                                     detail::kernels::relu_forward<T>{x.data(), y.data()});
    kept_.stamp(s, this);
    return y;
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_.last(r, this, "relu"), dy);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    detail::claim(r, s.stamp, this, "relu");
    detail::check_same_shape("relu", dy, s.input);
    tensor_type dx{dy.shape(), dy.device(), uninitialized};
    detail::engine_of<D>(r).for_each(static_cast<std::int64_t>(dy.size()),
                                     detail::kernels::relu_backward<T>{s.input.data(), dy.data(), dx.data()});
    return dx;
  }
  // The backward recorded on a tape (nn::create_graph): dy times relu'(x), a constant (relu'' = 0).
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type& s, typename Tape::variable, typename Tape::variable,
                                            typename Tape::variable dy, bool) {
    return t.mul(dy, t.constant(slopes(t.replica(), s.input)));
  }

 private:
  template <class R>
  tensor_type slopes(R& r, const tensor_type& x) const {
    tensor_type one{x.shape(), x.device(), uninitialized}, d{x.shape(), x.device(), uninitialized};
    one.fill(T(1), 0, one.size());
    detail::engine_of<D>(r).for_each(static_cast<std::int64_t>(x.size()),
                                     detail::kernels::relu_backward<T>{x.data(), one.data(), d.data()});
    return d;
  }
  detail::kept_state<state_type> kept_;
};

template <class T = float, device D = cpu>
class leaky_relu : public detail::stateless {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;

  struct state_type {
    detail::state_stamp stamp;
    tensor_type input;
  };

  explicit leaky_relu(T negative_slope = T(0.2)) : slope_{negative_slope} {}
  T negative_slope() const noexcept { return slope_; }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    s.input = x;
    tensor_type y{x.shape(), x.device(), uninitialized};
    detail::engine_of<D>(r).for_each(static_cast<std::int64_t>(x.size()),
                                     detail::kernels::leaky_relu_forward<T>{x.data(), y.data(), slope_});
    kept_.stamp(s, this);
    return y;
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_.last(r, this, "leaky_relu"), dy);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    detail::claim(r, s.stamp, this, "leaky_relu");
    detail::check_same_shape("leaky_relu", dy, s.input);
    tensor_type dx{dy.shape(), dy.device(), uninitialized};
    detail::engine_of<D>(r).for_each(
        static_cast<std::int64_t>(dy.size()),
        detail::kernels::leaky_relu_backward<T>{s.input.data(), dy.data(), dx.data(), slope_});
    return dx;
  }
  // The backward recorded on a tape (nn::create_graph): dy times the slope at x, a constant.
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type& s, typename Tape::variable, typename Tape::variable,
                                            typename Tape::variable dy, bool) {
    const tensor_type& x = s.input;
    tensor_type one{x.shape(), x.device(), uninitialized}, d{x.shape(), x.device(), uninitialized};
    one.fill(T(1), 0, one.size());
    detail::engine_of<D>(t.replica())
        .for_each(static_cast<std::int64_t>(x.size()),
                  detail::kernels::leaky_relu_backward<T>{x.data(), one.data(), d.data(), slope_});
    return t.mul(dy, t.constant(std::move(d)));
  }

 private:
  T slope_;
  detail::kept_state<state_type> kept_;
};

template <class T = float, device D = cpu>
class tanh : public detail::stateless {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;

  struct state_type {
    detail::state_stamp stamp;
    tensor_type output;
  };

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    s.output = tensor_type{x.shape(), x.device(), uninitialized};
    detail::engine_of<D>(r).for_each(static_cast<std::int64_t>(x.size()),
                                     detail::kernels::tanh_forward<T>{x.data(), s.output.data()});
    kept_.stamp(s, this);
    return s.output;
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_.last(r, this, "tanh"), dy);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    detail::claim(r, s.stamp, this, "tanh");
    detail::check_same_shape("tanh", dy, s.output);
    tensor_type dx{dy.shape(), dy.device(), uninitialized};
    detail::engine_of<D>(r).for_each(static_cast<std::int64_t>(dy.size()),
                                     detail::kernels::tanh_backward<T>{s.output.data(), dy.data(), dx.data()});
    return dx;
  }
  // The backward recorded on a tape (nn::create_graph): dy (1 - y^2), y the call's output, through
  // which the second-order gradient reaches x.
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type&, typename Tape::variable, typename Tape::variable y,
                                            typename Tape::variable dy, bool) {
    tensor_type one{shape{1}, y.value().device(), uninitialized};
    one.fill(T(1), 0, 1);
    return t.mul(dy, t.sub(t.constant(std::move(one)), t.mul(y, y)));
  }

 private:
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
