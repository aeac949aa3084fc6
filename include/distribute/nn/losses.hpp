#pragma once
// Losses and the rule that makes them correct under any number of replicas.
//
// The rule (tf.distribute's): a replica divides the sum of its per-example losses by the GLOBAL batch
// size, the examples of this step across all replicas (`compute_average_loss`). Its loss and gradient
// are then its share of the global mean, and summing the shares across replicas (what
// `all_reduce_gradients` does by default, and what `strategy.reduce(sum, losses)` does for reporting)
// gives exactly the mean over the global batch, for even and uneven splits alike.
//
// `mse` (LSGAN) and `l1` return the loss share and its gradient with respect to the prediction. A
// per-example loss is the mean over that example's elements.

#include <distribute/tensor/tensor.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute::nn {

// sum(per_example_losses) / global_batch_size, summed in index order.
template <class T>
T compute_average_loss(std::span<const T> per_example_losses, std::int64_t global_batch_size) {
  if (global_batch_size < 1)
    throw std::invalid_argument("distribute: compute_average_loss needs a positive global batch size, got " +
                                std::to_string(global_batch_size));
  double s = 0;
  for (T l : per_example_losses) s += static_cast<double>(l);
  return static_cast<T>(s / static_cast<double>(global_batch_size));
}
template <class T>
T compute_average_loss(const std::vector<T>& per_example_losses, std::int64_t global_batch_size) {
  return compute_average_loss(std::span<const T>(per_example_losses), global_batch_size);
}

template <class T>
struct loss_result {
  T value;           // this replica's share of the mean over the global batch
  tensor<T> grad;    // d value / d prediction
};

namespace detail {
template <class T, class Elem, class Grad>
loss_result<T> per_example_loss(const tensor<T>& pred, const tensor<T>& target, std::int64_t global_batch_size,
                                const char* name, Elem elem, Grad grad) {
  if (pred.shape() != target.shape())
    throw std::invalid_argument(std::string("distribute: ") + name + " of a prediction " + pred.shape().to_string() +
                                " and a target " + target.shape().to_string());
  if (global_batch_size < 1)
    throw std::invalid_argument(std::string("distribute: ") + name + " needs a positive global batch size");
  const std::int64_t n = pred.shape().rank() ? pred.shape()[0] : 1;
  const std::int64_t per = n ? static_cast<std::int64_t>(pred.size()) / n : 0;
  std::vector<T> losses(static_cast<std::size_t>(n));
  loss_result<T> out{T(0), tensor<T>{pred.shape()}};
  const double scale = 1.0 / (static_cast<double>(per) * static_cast<double>(global_batch_size));
  for (std::int64_t e = 0; e < n; ++e) {
    double s = 0;
    for (std::int64_t i = 0; i < per; ++i) {
      const auto j = static_cast<std::size_t>(e * per + i);
      const double d = static_cast<double>(pred[j]) - static_cast<double>(target[j]);
      s += elem(d);
      out.grad[j] = static_cast<T>(grad(d) * scale);
    }
    losses[static_cast<std::size_t>(e)] = static_cast<T>(s / static_cast<double>(per));
  }
  out.value = compute_average_loss(losses, global_batch_size);
  return out;
}
}  // namespace detail

// Mean squared error per example; LSGAN's loss.
template <class T>
loss_result<T> mse(const tensor<T>& pred, const tensor<T>& target, std::int64_t global_batch_size) {
  return detail::per_example_loss(pred, target, global_batch_size, "mse", [](double d) { return d * d; },
                                  [](double d) { return 2 * d; });
}

// Mean absolute error per example; CycleGAN's cycle and identity losses. The gradient at 0 is 0.
template <class T>
loss_result<T> l1(const tensor<T>& pred, const tensor<T>& target, std::int64_t global_batch_size) {
  return detail::per_example_loss(pred, target, global_batch_size, "l1", [](double d) { return std::abs(d); },
                                  [](double d) { return d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0); });
}

}  // namespace distribute::nn
