#pragma once
// What a normalisation can fuse into its output pass: a ReLU that follows it, and a residual add
// (y = norm(x) + residual, after the activation). The layer that takes it also applies the ReLU's
// mask in its backward, so the ReLU's own passes are skipped both ways; the residual's gradient is
// the caller's (it is dy itself). nn::sequential passes it where a layer that takes it is followed by
// nn::relu, and for the add of forward(r, x, plus_input).

#include <distribute/nn/layer.hpp>
#include <distribute/tensor/tensor.hpp>

namespace distribute::nn::detail {

template <class T, class D>
struct norm_epilogue {
  bool relu = false;
  const tensor<T, D>* residual = nullptr;
};

// A layer whose forward takes a norm_epilogue (instance_norm), with the caller's state or its own.
template <class L, class R>
concept takes_norm_epilogue =
    requires(L& l, R& r, const layer_tensor_t<L>& x, norm_epilogue<typename L::scalar_type, layer_device_t<L>> e) {
      { l.forward(r, x, e) } -> std::same_as<layer_tensor_t<L>>;
    };
// nn::relu, which such a layer can take in (its forward and backward both).
template <class L>
concept relu_layer = requires { requires L::is_relu; };

}  // namespace distribute::nn::detail
