#pragma once
// The losses of classifiers and discriminators, and the accuracy count, under the global-batch rule
// of nn/losses.hpp: a replica's loss is the sum of its per-example losses divided by the GLOBAL batch
// size, and its gradient is that share's.
//
//   - `softmax_cross_entropy(r, logits [N, K], labels, global_batch_size)`: per example
//     log(sum_k exp(x_k)) - x_label (PyTorch's F.cross_entropy, Keras's
//     SparseCategoricalCrossentropy(from_logits=True)); gradient (softmax(x) - one_hot(label)) / global.
//     The row's maximum is subtracted before exponentiating and the log-sum-exp is taken in double.
//   - `bce_with_logits(r, logits, targets, global_batch_size)`: per element
//     max(x, 0) - x t + log1p(exp(-|x|)), an example's loss the mean over its elements (like mse);
//     gradient (sigmoid(x) - t) / (elements per example * global). The GAN discriminator's loss, and the
//     generator's non-saturating loss with targets 1 (DCGAN).
//   - `accuracy(r, logits [N, K], labels)`: how many rows have their largest logit at the label (the
//     first of equal largest ones, like torch.argmax): a count, so that replicas' counts add up.
//
// Each also has an overload without the replica, computed on the calling thread alone. Labels are
// class indices in [0, K), one per example, in host memory.

#include <distribute/nn/detail/loss_kernels.hpp>
#include <distribute/nn/losses.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute::nn {

namespace detail {

// Logits [N, K] and N labels, each in [0, K).
template <class T, class D>
void check_labels(const char* name, const tensor<T, D>& logits, std::span<const std::int32_t> labels) {
  const shape& s = logits.shape();
  if (s.rank() != 2)
    throw std::invalid_argument(std::string("distribute: ") + name + " takes logits [N, K]; got a tensor of shape " +
                                s.to_string());
  if (static_cast<std::int64_t>(labels.size()) != s[0])
    throw std::invalid_argument(std::string("distribute: ") + name + " of logits " + s.to_string() + " and " +
                                std::to_string(labels.size()) + " labels: one label per example");
  for (std::size_t i = 0; i < labels.size(); ++i)
    if (labels[i] < 0 || labels[i] >= s[1])
      throw std::invalid_argument(std::string("distribute: ") + name + ": the label of example " + std::to_string(i) +
                                  " is " + std::to_string(labels[i]) + ", outside [0, " + std::to_string(s[1]) +
                                  ") for " + std::to_string(s[1]) + " classes");
}

inline void check_global_batch(const char* name, std::int64_t global_batch_size) {
  if (global_batch_size < 1)
    throw std::invalid_argument(std::string("distribute: ") + name + " needs a positive global batch size, got " +
                                std::to_string(global_batch_size));
}

template <class E, class T, class D>
loss_result<T, D> softmax_cross_entropy(E& e, const tensor<T, D>& logits, std::span<const std::int32_t> labels,
                                        std::int64_t global_batch_size) {
  check_labels("softmax_cross_entropy", logits, labels);
  check_global_batch("softmax_cross_entropy", global_batch_size);
  const std::int64_t n = logits.shape()[0], k = logits.shape()[1];
  loss_result<T, D> out{T(0), tensor<T, D>{logits.shape(), logits.device()}};
  if (n == 0) return out;
  const auto device_labels = tensor<std::int32_t, D>::from_host(shape{n}, labels, logits.device());
  tensor<double, D> shift{shape{n}, logits.device()}, denominator{shape{n}, logits.device()},
      losses{shape{n}, logits.device()};
  e.for_each(n, kernels::row_max<T>{logits.data(), shift.data(), k});
  e.segmented_sum(n, k, kernels::shifted_exp<T>{logits.data(), shift.data(), k}, denominator.data());
  e.for_each(n, kernels::softmax_cross_entropy_value<T>{logits.data(), device_labels.data(), shift.data(),
                                                        denominator.data(), losses.data(), k});
  e.for_each(n * k, kernels::softmax_cross_entropy_gradient<T>{logits.data(), device_labels.data(), shift.data(),
                                                               denominator.data(), out.grad.data(),
                                                               1.0 / static_cast<double>(global_batch_size), k});
  std::vector<double> host(static_cast<std::size_t>(n));
  e.to_host(losses.data(), host.size(), host.data());
  std::vector<T> per_example(host.begin(), host.end());
  out.value = compute_average_loss(per_example, global_batch_size);
  return out;
}

template <class E, class T, class D>
std::int64_t accuracy(E& e, const tensor<T, D>& logits, std::span<const std::int32_t> labels) {
  check_labels("accuracy", logits, labels);
  const std::int64_t n = logits.shape()[0];
  if (n == 0) return 0;
  tensor<std::int32_t, D> predicted{shape{n}, logits.device()};
  e.for_each(n, kernels::row_argmax<T>{logits.data(), predicted.data(), logits.shape()[1]});
  std::vector<std::int32_t> host(static_cast<std::size_t>(n));
  e.to_host(predicted.data(), host.size(), host.data());
  std::int64_t correct = 0;
  for (std::size_t i = 0; i < host.size(); ++i) correct += host[i] == labels[i] ? 1 : 0;
  return correct;
}

}  // namespace detail

// Softmax cross-entropy of logits [N, K] and class labels; with a replica, computed by its engine.
template <class R, class T, class D>
loss_result<T, D> softmax_cross_entropy(R& r, const tensor<T, D>& logits, std::span<const std::int32_t> labels,
                                        std::int64_t global_batch_size) {
  return detail::softmax_cross_entropy(r.engine(), logits, labels, global_batch_size);
}
template <class T>
loss_result<T> softmax_cross_entropy(const tensor<T>& logits, std::span<const std::int32_t> labels,
                                     std::int64_t global_batch_size) {
  serial_engine e;
  return detail::softmax_cross_entropy(e, logits, labels, global_batch_size);
}

// Binary cross-entropy of logits and targets of the same shape (targets in [0, 1]; soft targets are
// allowed and not checked); with a replica, computed by its engine.
template <class R, class T, class D>
loss_result<T, D> bce_with_logits(R& r, const tensor<T, D>& logits, const tensor<T, D>& targets,
                                  std::int64_t global_batch_size) {
  return detail::per_example_loss<detail::kernels::sigmoid_cross_entropy>(r.engine(), logits, targets,
                                                                          global_batch_size, "bce_with_logits");
}
template <class R, class T, class D>
device_loss_result<T, D> bce_with_logits(R& r, const tensor<T, D>& logits, const tensor<T, D>& targets,
                                         std::int64_t global_batch_size, value_on_device_t) {
  return detail::per_example_loss_on_device<detail::kernels::sigmoid_cross_entropy>(
      r.engine(), logits, targets, global_batch_size, "bce_with_logits");
}
template <class T>
loss_result<T> bce_with_logits(const tensor<T>& logits, const tensor<T>& targets, std::int64_t global_batch_size) {
  serial_engine e;
  return detail::per_example_loss<detail::kernels::sigmoid_cross_entropy>(e, logits, targets, global_batch_size,
                                                                          "bce_with_logits");
}

// The number of examples whose largest logit is at their label.
template <class R, class T, class D>
std::int64_t accuracy(R& r, const tensor<T, D>& logits, std::span<const std::int32_t> labels) {
  return detail::accuracy(r.engine(), logits, labels);
}
template <class T>
std::int64_t accuracy(const tensor<T>& logits, std::span<const std::int32_t> labels) {
  serial_engine e;
  return detail::accuracy(e, logits, labels);
}

}  // namespace distribute::nn
