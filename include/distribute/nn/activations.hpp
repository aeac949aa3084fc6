#pragma once
// Element-wise activations: relu, leaky_relu (the PatchGAN discriminator's, slope 0.2) and tanh (the
// generator's output). Each keeps what its derivative needs: the input for the piecewise-linear ones,
// the output for tanh (1 - y^2).

#include <distribute/nn/layer.hpp>

#include <cmath>
#include <cstddef>
#include <utility>

namespace distribute::nn {

template <class T = float>
class relu : public detail::stateless {
 public:
  using scalar_type = T;

  template <class R>
  tensor<T> forward(R&, const tensor<T>& x) {
    input_ = x;
    tensor<T> y{x.shape()};
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] > T(0) ? x[i] : T(0);
    return y;
  }
  template <class R>
  tensor<T> backward(R&, const tensor<T>& dy) {
    check_shape(dy);
    tensor<T> dx{dy.shape()};
    for (std::size_t i = 0; i < dy.size(); ++i) dx[i] = input_[i] > T(0) ? dy[i] : T(0);
    return dx;
  }

 private:
  void check_shape(const tensor<T>& dy) const {
    if (dy.shape() != input_.shape()) throw std::invalid_argument("distribute: relu backward got dy of shape " + dy.shape().to_string() + ", expected " + input_.shape().to_string());
  }
  tensor<T> input_;
};

template <class T = float>
class leaky_relu : public detail::stateless {
 public:
  using scalar_type = T;

  explicit leaky_relu(T negative_slope = T(0.2)) : slope_{negative_slope} {}

  template <class R>
  tensor<T> forward(R&, const tensor<T>& x) {
    input_ = x;
    tensor<T> y{x.shape()};
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] > T(0) ? x[i] : slope_ * x[i];
    return y;
  }
  template <class R>
  tensor<T> backward(R&, const tensor<T>& dy) {
    if (dy.shape() != input_.shape()) throw std::invalid_argument("distribute: leaky_relu backward got dy of shape " + dy.shape().to_string() + ", expected " + input_.shape().to_string());
    tensor<T> dx{dy.shape()};
    for (std::size_t i = 0; i < dy.size(); ++i) dx[i] = input_[i] > T(0) ? dy[i] : slope_ * dy[i];
    return dx;
  }

 private:
  T slope_;
  tensor<T> input_;
};

template <class T = float>
class tanh : public detail::stateless {
 public:
  using scalar_type = T;

  template <class R>
  tensor<T> forward(R&, const tensor<T>& x) {
    output_ = tensor<T>{x.shape()};
    for (std::size_t i = 0; i < x.size(); ++i) output_[i] = std::tanh(x[i]);
    return output_;
  }
  template <class R>
  tensor<T> backward(R&, const tensor<T>& dy) {
    if (dy.shape() != output_.shape()) throw std::invalid_argument("distribute: tanh backward got dy of shape " + dy.shape().to_string() + ", expected " + output_.shape().to_string());
    tensor<T> dx{dy.shape()};
    for (std::size_t i = 0; i < dy.size(); ++i) dx[i] = dy[i] * (T(1) - output_[i] * output_[i]);
    return dx;
  }

 private:
  tensor<T> output_;
};

}  // namespace distribute::nn
