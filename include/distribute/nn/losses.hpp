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
#include <distribute/engine/serial.hpp>
#include <distribute/nn/detail/loss_kernels.hpp>
#include <distribute/tensor/tensor.hpp>

#include <algorithm>

#include <cmath>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
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
  T value;            // this replica's share of the mean over the global batch
  tensor<T, D> grad;  // d value / d prediction
};

// Asks a loss to leave its value where it was computed (`nn::mse(r, y, t, batch, nn::value_on_device)`):
// on a GPU the host then does not wait for the device, and the loss can be captured into a CUDA graph
// with the rest of a step (cuda/nn/graphed_step.cuh). The same bits as the host value.
struct value_on_device_t {
  explicit value_on_device_t() = default;
};
inline constexpr value_on_device_t value_on_device{};

template <class T, device D = cpu>
struct device_loss_result {
  tensor<T, D> value;  // one element: this replica's share of the mean over the global batch
  tensor<T, D> grad;   // d value / d prediction
  // The value, read on the host (on a GPU: waits for the work queued before it).
  T host_value() const {
    if constexpr (requires { value.to_vector(); }) return value.to_vector().at(0);
    else return value.data()[0];
  }
};

namespace detail {

using distribute::serial_engine;  // a loss called without a replica: the calling thread alone

// Per example e: the mean over its elements of Kernel's value; the gradient written alongside. The
// value is left on the engine's device: the last step (per-example means, then
// compute_average_loss's sum in index order) is one call of one kernel there.
template <template <class> class Kernel, class E, class T, class D>
device_loss_result<T, D> per_example_loss_on_device(E& e, const tensor<T, D>& pred, const tensor<T, D>& target,
                                                    std::int64_t global_batch_size, const char* name) {
  if (pred.shape() != target.shape())
    throw std::invalid_argument(std::string("distribute: ") + name + " of a prediction " + pred.shape().to_string() +
                                " and a target " + target.shape().to_string());
  if (global_batch_size < 1)
    throw std::invalid_argument(std::string("distribute: ") + name + " needs a positive global batch size, got " +
                                std::to_string(global_batch_size));
  const std::int64_t n = pred.shape().rank() ? pred.shape()[0] : 1;
  const std::int64_t per = n ? static_cast<std::int64_t>(pred.size()) / n : 0;
  device_loss_result<T, D> out{tensor<T, D>{shape{1}, pred.device()}, tensor<T, D>{pred.shape(), pred.device()}};
  if (n == 0 || per == 0) return out;
  const double scale = 1.0 / (static_cast<double>(per) * static_cast<double>(global_batch_size));
  tensor<double, D> sums{shape{n}, pred.device()};
  e.segmented_sum(n, per, Kernel<T>{pred.data(), target.data(), out.grad.data(), scale, per}, sums.data());
  e.for_each(1, kernels::average_of_example_means<T>{sums.data(), out.value.data(), n, per, global_batch_size});
  return out;
}

// The same with the value read on the host (one value, after the work queued before it).
template <template <class> class Kernel, class E, class T, class D>
loss_result<T, D> per_example_loss(E& e, const tensor<T, D>& pred, const tensor<T, D>& target,
                                   std::int64_t global_batch_size, const char* name) {
  auto on_device = per_example_loss_on_device<Kernel>(e, pred, target, global_batch_size, name);
  return {on_device.host_value(), std::move(on_device.grad)};
}

}  // namespace detail

// Mean squared error per example; LSGAN's loss. With a replica, computed by its engine.
template <class R, class T, class D>
loss_result<T, D> mse(R& r, const tensor<T, D>& pred, const tensor<T, D>& target, std::int64_t global_batch_size) {
  return detail::per_example_loss<detail::kernels::squared_error>(r.engine(), pred, target, global_batch_size, "mse");
}
template <class T>
loss_result<T> mse(const tensor<T>& pred, const tensor<T>& target, std::int64_t global_batch_size) {
  serial_engine e;
  return detail::per_example_loss<detail::kernels::squared_error>(e, pred, target, global_batch_size, "mse");
}

// With the value left on the replica's device (value_on_device_t above).
template <class R, class T, class D>
device_loss_result<T, D> mse(R& r, const tensor<T, D>& pred, const tensor<T, D>& target, std::int64_t global_batch_size,
                             value_on_device_t) {
  return detail::per_example_loss_on_device<detail::kernels::squared_error>(r.engine(), pred, target, global_batch_size,
                                                                            "mse");
}

// Mean absolute error per example; CycleGAN's cycle and identity losses. The gradient at 0 is 0.
template <class R, class T, class D>
loss_result<T, D> l1(R& r, const tensor<T, D>& pred, const tensor<T, D>& target, std::int64_t global_batch_size) {
  return detail::per_example_loss<detail::kernels::absolute_error>(r.engine(), pred, target, global_batch_size, "l1");
}
template <class R, class T, class D>
device_loss_result<T, D> l1(R& r, const tensor<T, D>& pred, const tensor<T, D>& target, std::int64_t global_batch_size,
                            value_on_device_t) {
  return detail::per_example_loss_on_device<detail::kernels::absolute_error>(r.engine(), pred, target,
                                                                             global_batch_size, "l1");
}
template <class T>
loss_result<T> l1(const tensor<T>& pred, const tensor<T>& target, std::int64_t global_batch_size) {
  serial_engine e;
  return detail::per_example_loss<detail::kernels::absolute_error>(e, pred, target, global_batch_size, "l1");
}

}  // namespace distribute::nn
