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

#include <distribute/concepts/device.hpp>
#include <distribute/engine/detail/serial.hpp>
#include <distribute/nn/detail/kernels.hpp>
#include <distribute/tensor/tensor.hpp>

#include <algorithm>

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

template <class T, device D = cpu>
struct loss_result {
  T value;             // this replica's share of the mean over the global batch
  tensor<T, D> grad;   // d value / d prediction
};

namespace detail {

using distribute::detail::serial_engine;  // a loss called without a replica: the calling thread alone

// Per example e: the mean over its elements of Kernel's value; the gradient written alongside.
template <template <class> class Kernel, class E, class T, class D>
loss_result<T, D> per_example_loss(E& e, const tensor<T, D>& pred, const tensor<T, D>& target,
                                   std::int64_t global_batch_size, const char* name) {
  if (pred.shape() != target.shape())
    throw std::invalid_argument(std::string("distribute: ") + name + " of a prediction " + pred.shape().to_string() +
                                " and a target " + target.shape().to_string());
  if (global_batch_size < 1)
    throw std::invalid_argument(std::string("distribute: ") + name + " needs a positive global batch size, got " +
                                std::to_string(global_batch_size));
  const std::int64_t n = pred.shape().rank() ? pred.shape()[0] : 1;
  const std::int64_t per = n ? static_cast<std::int64_t>(pred.size()) / n : 0;
  loss_result<T, D> out{T(0), tensor<T, D>{pred.shape(), pred.device()}};
  if (n == 0 || per == 0) {
    out.value = T(0);
    return out;
  }
  const double scale = 1.0 / (static_cast<double>(per) * static_cast<double>(global_batch_size));
  tensor<double, D> sums{shape{n}, pred.device()};
  e.segmented_sum(n, per, Kernel<T>{pred.data(), target.data(), out.grad.data(), scale, per}, sums.data());
  std::vector<double> host(static_cast<std::size_t>(n));
  e.to_host(sums.data(), host.size(), host.data());
  std::vector<T> losses(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < host.size(); ++i) losses[i] = static_cast<T>(host[i] / static_cast<double>(per));
  out.value = compute_average_loss(losses, global_batch_size);
  return out;
}
}  // namespace detail

// Mean squared error per example; LSGAN's loss. With a replica, computed by its engine.
template <class R, class T, class D>
loss_result<T, D> mse(R& r, const tensor<T, D>& pred, const tensor<T, D>& target, std::int64_t global_batch_size) {
  return detail::per_example_loss<detail::kernels::squared_error>(r.engine(), pred, target, global_batch_size, "mse");
}
template <class T>
loss_result<T> mse(const tensor<T>& pred, const tensor<T>& target, std::int64_t global_batch_size) {
  detail::serial_engine e;
  return detail::per_example_loss<detail::kernels::squared_error>(e, pred, target, global_batch_size, "mse");
}

// Mean absolute error per example; CycleGAN's cycle and identity losses. The gradient at 0 is 0.
template <class R, class T, class D>
loss_result<T, D> l1(R& r, const tensor<T, D>& pred, const tensor<T, D>& target, std::int64_t global_batch_size) {
  return detail::per_example_loss<detail::kernels::absolute_error>(r.engine(), pred, target, global_batch_size, "l1");
}
template <class T>
loss_result<T> l1(const tensor<T>& pred, const tensor<T>& target, std::int64_t global_batch_size) {
  detail::serial_engine e;
  return detail::per_example_loss<detail::kernels::absolute_error>(e, pred, target, global_batch_size, "l1");
}

}  // namespace distribute::nn
