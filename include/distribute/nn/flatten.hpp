#pragma once
// Every extent but the batch's folded into one (PyTorch's nn.Flatten(), Keras's Flatten): [N, C, H, W]
// becomes [N, C*H*W] with the values in NCHW order, ready for a linear layer; backward gives the
// gradient back its input's shape. No arithmetic: the values are copied under the other shape.

#include <distribute/nn/layer.hpp>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace distribute::nn {

template <class T = float, device D = cpu>
class flatten : public detail::stateless {
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = tensor<T, D>;
  struct state_type {
    detail::state_stamp stamp;
    shape in_shape{};
  };

  // [N, product of the other extents] for an input of rank 2 to 4.
  shape output_shape(const shape& in) const {
    if (in.rank() < 2)
      throw std::invalid_argument("distribute: flatten got a tensor of shape " + in.to_string() +
                                  "; it takes [N, ...] of rank 2 to 4, such as [N, C, H, W]");
    std::int64_t per = 1;
    for (std::size_t i = 1; i < in.rank(); ++i) per *= in[i];
    return shape{in[0], per};
  }

  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_.next());
  }
  template <class R>
  tensor_type forward(R&, const tensor_type& x, state_type& s) {
    static_assert(std::is_same_v<typename R::device_type, D>,
                  "distribute: a layer on one device was called from a replica of another");
    const shape out = output_shape(x.shape());
    s.in_shape = x.shape();
    kept_.stamp(s, this);
    tensor_type y = x;
    y.reshape(out);
    return y;
  }

  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_.last(r, this, "flatten"), dy);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    static_assert(std::is_same_v<typename R::device_type, D>,
                  "distribute: a layer on one device was called from a replica of another");
    detail::claim(r, s.stamp, this, "flatten");
    const shape& in_shape_ = s.in_shape;
    const shape out = output_shape(in_shape_);
    if (dy.shape() != out)
      throw std::invalid_argument("distribute: flatten backward got dy of shape " + dy.shape().to_string() +
                                  ", expected " + out.to_string() + " (the forward input was " + in_shape_.to_string() +
                                  ")");
    tensor_type dx = dy;
    dx.reshape(in_shape_);
    return dx;
  }

  // The backward recorded on a tape (nn::create_graph): dy under the input's shape.
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type& s, typename Tape::variable, typename Tape::variable,
                                            typename Tape::variable dy, bool) {
    return t.reshape(dy, s.in_shape);
  }

 private:
  detail::kept_state<state_type> kept_;
};

}  // namespace distribute::nn
