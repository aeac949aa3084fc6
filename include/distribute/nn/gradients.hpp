#pragma once
// A replica's gradients over a batch in one call, with gradient accumulation: the batch's forward,
// loss and backward in `micro_batches` parts one after the other (the layers add each part's
// gradients to what they hold), then one all-reduce across the replicas. A batch too large for one
// pass trains in parts with the gradient of the whole; DDP's `no_sync` and Horovod's
// `backward_passes_per_step` are the same idea.
//
//   strategy.run([&](auto& r, const batch& b, net_type& net, optim::adam<>& opt) {
//     net.zero_grad();
//     const double loss = nn::compute_gradients(r, net, b.x, b.y, mse_loss, b.global_size, {.micro_batches = 4});
//     opt.step(r, net);
//     return loss;
//   }, batches, nets, optimisers);
//
// `loss(r, prediction, target, global_batch_size)` returns an nn::loss_result scaled by the global
// batch (nn/losses.hpp), so the parts' gradients add up to the whole batch's. The gradients are added
// to those the model holds: zero them at the start of a step. With `all_reduce = false` each replica
// keeps its own sum (accumulate over several calls, all-reducing on the last).
//
// Under the split-independent reference engine (`compute_options{.split_independent = true,
// .reference = true}`) the convolutions', normalisations' and element-wise layers' gradients have the
// bits of one pass over the whole batch: each example's contribution is added in the batch's order
// either way. `linear`'s weight gradient is one product over each part, so it agrees to float
// rounding. Returns this replica's share of the mean loss (the parts' sum).

#include <distribute/comm/gradient_buckets.hpp>
#include <distribute/nn/layer.hpp>
#include <distribute/tensor/micro_batches.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace distribute::nn {

struct gradient_options {
  // Forward and backward passes over parts of the batch, as even as possible (8 in 3: 3, 3, 2); a
  // batch of fewer examples has one per example.
  int micro_batches = 1;
  // Sum the gradients across the replicas at the end (off: each replica keeps its own).
  bool all_reduce = true;
  // Overlap that sum with the last part's backward (replica_context::overlap_gradients): each
  // bucket starts as soon as its gradients are final. The same bits as without.
  bool overlap = false;
  gradient_reduction reduction{};
};

template <class R, class M, class Loss>
double compute_gradients(R& r, M& model, const layer_tensor_t<M>& input, const layer_tensor_t<M>& target, Loss&& loss,
                         std::int64_t global_batch_size, const gradient_options& options = {}) {
  const auto batch = [](const layer_tensor_t<M>& t) { return t.shape().rank() ? t.shape()[0] : 0; };
  if (batch(input) != batch(target))
    throw std::invalid_argument("distribute: compute_gradients got " + std::to_string(batch(input)) + " inputs and " +
                                std::to_string(batch(target)) + " targets");
  double total = 0;
  std::int64_t offset = 0;
  auto pass = [&](std::int64_t n) {
    const auto y = model.forward(r, distribute::batch_slice(input, offset, n));
    const auto l = std::invoke(loss, r, y, distribute::batch_slice(target, offset, n), global_batch_size);
    if (l.grad.shape() != y.shape())
      throw std::invalid_argument("distribute: compute_gradients' loss returned a gradient of shape " +
                                  l.grad.shape().to_string() + " for a prediction of shape " + y.shape().to_string());
    total += static_cast<double>(l.value);
    if constexpr (requires { model.backward(r, l.grad, no_input_gradient); })
      model.backward(r, l.grad, no_input_gradient);
    else model.backward(r, l.grad);
    offset += n;
  };
  const auto parts = distribute::micro_batch_sizes(batch(input), options.micro_batches);
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) pass(parts[i]);
  const std::int64_t last = parts.empty() ? 0 : parts.back();
  if constexpr (requires { r.overlap_gradients(options.reduction); }) {
    if (options.all_reduce && options.overlap) {
      auto sync = r.overlap_gradients(options.reduction);
      sync.add(model);  // before the last backward only: the earlier parts' gradients are not final
      if (!parts.empty()) pass(last);
      sync.wait();
      return total;
    }
  }
  if (!parts.empty()) pass(last);
  if (options.all_reduce) r.all_reduce_gradients(model, options.reduction);
  return total;
}

}  // namespace distribute::nn
