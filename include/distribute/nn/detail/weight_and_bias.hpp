#pragma once
// The parameters of a layer with a weight and an optional bias (conv2d, conv_transpose2d, linear):
// the weight drawn N(0, 0.02) from the layer's seed, the bias zero (empty when the layer has none),
// and what every such layer offers about them.

#include <distribute/detail/element_kernels.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/nn/parameter.hpp>

#include <cstdint>
#include <utility>

namespace distribute::nn::detail {

template <class T, class D>
class weight_and_bias {
 public:
  parameter<T, D>& weight() noexcept { return weight_; }
  parameter<T, D>& bias() noexcept { return bias_; }

  template <class F>
  void for_each_parameter(F&& f) {
    weight_.visit(f);
    if (!bias_.value.empty()) bias_.visit(f);
  }
  void zero_grad() {
    weight_.zero_grad();
    bias_.zero_grad();
  }
  void set_training(bool) {}

 protected:
  // `bias_size` 0: no bias.
  weight_and_bias(shape weight_shape, std::int64_t bias_size, std::uint64_t seed, const D& device)
      : weight_{weight_shape, init::normal, sub_seed(seed, 0), device},
        bias_{shape{bias_size}, init::zero, 0, device} {}

  // What a recorded backward (create_graph) gives the weight gradient it records: a sink adding dW
  // into weight().grad on tape `t`'s replica. The layer must outlive the tape's backward.
  template <class Tape>
  auto weight_gradient_adder(Tape& t) {
    return [w = &weight_, &t](const tensor<T, D>& dw) {
      engine_of<D>(t.replica())
          .for_each(static_cast<std::int64_t>(dw.size()),
                    distribute::detail::kernels::add_to<T>{w->grad.data(), dw.data()});
    };
  }

  parameter<T, D> weight_, bias_;
};

}  // namespace distribute::nn::detail
