#pragma once
// Gradient aggregation by fused buckets: the gradients of a model are packed, in reverse enumeration
// order, into buckets of about `bucket_bytes`, and each bucket is one all-reduce. The buckets are
// lists of spans over the gradients themselves: the shared-memory communicator reduces them in place
// (zero-copy fusion), so a bucket costs one meeting of the replicas instead of one per tensor.
//
// It lives with the collectives and knows models only through `gradient_enumerable`
// (concepts/gradient_enumerable.hpp), so that `replica_context::all_reduce_gradients` stays a thin
// forwarding member and the strategies layer does not depend on the nn layer above it.

#include <distribute/bfloat16.hpp>
#include <distribute/collective_origin.hpp>
#include <distribute/comm/local.hpp>
#include <distribute/concepts/gradient_enumerable.hpp>
#include <distribute/dtype.hpp>
#include <distribute/reduce_op.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace distribute {

// What gradients travel as in `all_reduce_gradients` (Horovod's `compression`, DDP's
// `bf16_compress_hook`).
//
// `bfloat16`: each bucket is rounded to bfloat16 (nearest, ties to even), all-reduced as bfloat16
// (every partial sum rounded to bfloat16, as NCCL's bfloat16 reductions are) and widened back into
// the float gradients: half the bytes between replicas and workers, at bfloat16's precision (a
// relative error of about 2^-9 per rounding, so about 0.4% on a sum of 2 and more with more
// replicas). Every replica still receives the same bits, so mirrored copies stay identical, and the
// overlapped all-reduce still equals the blocking one bit for bit. For float gradients (the master
// weights' precision); pays where bytes between workers cost more than the two conversions: MPI
// between machines, NCCL across nodes, not shared memory within a process.
enum class gradient_compression : std::uint8_t { none, bfloat16 };

constexpr std::string_view to_string(gradient_compression c) noexcept {
  switch (c) {
    case gradient_compression::none: return "none";
    case gradient_compression::bfloat16: return "bfloat16";
  }
  return "unknown";
}

// How `all_reduce_gradients` combines the replicas' gradients.
//
// `sum` is the default because losses follow the tf.distribute rule: each replica divides its
// per-example losses by the GLOBAL batch size (`nn::compute_average_loss`), so its gradient is its
// share of the gradient of the global mean and the sum of the shares is that gradient, whatever the
// split (uneven splits and empty replicas included). `mean` is for losses averaged over each
// replica's own examples; it is right only when every replica holds the same number of examples.
struct gradient_reduction {
  reduce_op op = reduce_op::sum;
  // The cap of one fused bucket (PyTorch DDP's default is 25 MiB). A gradient larger than the cap is
  // a bucket of its own; 0 makes every gradient its own collective (for comparison only).
  std::size_t bucket_bytes = std::size_t{25} << 20;
  // The cap of the first bucket (the last layers' gradients, the first to be final in backward), as
  // DDP's 1 MiB: small, so that an overlapped all-reduce (`replica_context::overlap_gradients`) starts
  // early. Never more than `bucket_bytes`.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  // What the gradients travel as (see gradient_compression).
  gradient_compression compression = gradient_compression::none;
};

namespace comm {

// The buckets of `model`'s gradients, in the order they are all-reduced: the gradients in reverse
// enumeration order (the order backward makes them final: the last layer's first), packed into
// buckets of at most `first_bucket_bytes` for the first and `bucket_bytes` for the others (a larger
// gradient alone); empty gradients are skipped. `sink(std::vector<std::span<T>>)` gets each bucket.
// The blocking and the overlapped all-reduce use this one plan, so they run the same collectives
// over the same buffers and their results have the same bits on every communicator.
template <gradient_enumerable M, class Sink>
void for_each_gradient_bucket(M& model, const gradient_reduction& options, Sink&& sink) {
  using T = typename M::scalar_type;
  std::vector<std::span<T>> gradients;
  model.for_each_parameter([&](std::span<T>, std::span<T> gradient) {
    if (!gradient.empty()) gradients.push_back(gradient);
  });
  std::vector<std::span<T>> bucket;
  std::size_t bytes = 0, cap = options.first_bucket_bytes < options.bucket_bytes ? options.first_bucket_bytes
                                                                                 : options.bucket_bytes;
  for (auto g = gradients.rbegin(); g != gradients.rend(); ++g) {
    if (!bucket.empty() && bytes + g->size_bytes() > cap) {
      sink(std::move(bucket));
      bucket = {};
      bytes = 0;
      cap = options.bucket_bytes;
    }
    bucket.push_back(*g);
    bytes += g->size_bytes();
  }
  if (!bucket.empty()) sink(std::move(bucket));
}

// A communicator whose buffers may be device memory all-reduces float buffers through bfloat16
// itself (cuda/comm/nccl.cuh, cuda/comm/cuda_peer.cuh); the others' buffers are host memory, narrowed here.
template <class C>
concept bfloat16_compressing_communicator =
    requires(C& c, std::span<const std::span<float>> buffers) { c.all_reduce_as_bfloat16(reduce_op::sum, buffers); };

// Refuses a compression the gradients cannot take, before any collective (every replica refuses
// alike: the options and the model are the same on every replica).
template <class T>
void check_compression(const gradient_reduction& options) {
  if (options.compression == gradient_compression::none) return;
  if (options.compression != gradient_compression::bfloat16)
    throw std::invalid_argument("distribute: gradient_reduction::compression " +
                                std::to_string(static_cast<int>(options.compression)) +
                                " is not a gradient_compression");
  if (dtype_of<T> != dtype::float32)
    throw std::invalid_argument(
        "distribute: gradient_reduction::compression = bfloat16 is for float32 gradients; this "
        "model's are " +
        std::string(to_string(dtype_of<T>)));
  if (options.op != reduce_op::sum && options.op != reduce_op::mean)
    throw std::invalid_argument(
        "distribute: gradient_reduction::compression = bfloat16 combines gradients by sum or "
        "mean, not " +
        std::string(to_string(options.op)));
}

// The calling thread's buffer for narrowing gradients into W (all_reduce_narrowed_on_host): grown to
// the largest bucket up to the cap it is kept for, never beyond. For tests.
template <class W>
std::vector<W>& kept_narrowing_buffer() {
  thread_local std::vector<W> buffer;
  return buffer;
}

// Host buffers all-reduced through a 16-bit type W (ours; CUDA's for a GPU communicator's staging):
// narrowed into one buffer, all-reduced, widened back. A bucket of at most `keep` elements (the
// bucket cap) uses the calling thread's buffer, kept for the next step (steps repeat their sizes: no
// allocation and no page faults on fresh memory per step; measured 10 ms a step on 108 MiB of
// gradients). A bigger one (a gradient larger than the cap is a bucket of its own) gets a buffer of
// its own, freed at the end, so that one huge tensor does not pin its size on every thread.
template <class W, class C>
void all_reduce_narrowed_on_host(C& comm, reduce_op op, std::span<const std::span<float>> bucket,
                                 std::size_t keep = gradient_reduction{}.bucket_bytes / sizeof(float)) {
  std::size_t n = 0;
  for (const auto g : bucket) n += g.size();
  std::vector<W> own;
  std::vector<W>& buffer = n <= keep ? kept_narrowing_buffer<W>() : own;
  if (buffer.size() < n) buffer.resize(n);
  const std::span<W> wire(buffer.data(), n);
  std::size_t at = 0;
  for (const auto g : bucket)
    for (const float v : g) wire[at++] = W(v);
  comm.all_reduce(op, wire);
  at = 0;
  for (const auto g : bucket)
    for (float& v : g) v = static_cast<float>(wire[at++]);
}

// One bucket's collective.
template <class C, class T>
void all_reduce_bucket(C& comm, const gradient_reduction& options, const std::vector<std::span<T>>& bucket) {
  const collective_label label("all_reduce_gradients");
  const std::span<const std::span<T>> buffers(bucket);
  if constexpr (std::is_same_v<T, float>) {
    // A group of one sends nothing, so nothing is rounded (as under one_device_strategy).
    if (options.compression == gradient_compression::bfloat16 && comm.size() > 1) {
      if constexpr (bfloat16_compressing_communicator<C>) {
        comm.all_reduce_as_bfloat16(options.op, buffers);
      } else {
        // The thread's buffer is kept up to the largest cap, bucket_bytes (the first bucket's is never more).
        all_reduce_narrowed_on_host<bfloat16>(comm, options.op, buffers, options.bucket_bytes / sizeof(float));
      }
      return;
    }
  }
  if (bucket.size() == 1) comm.all_reduce(options.op, bucket.front());
  else comm.all_reduce(options.op, buffers);
}

// All-reduces every gradient of `model`, one collective per bucket; returns the number of collectives.
// Under the `local` communicator there is nothing to combine, and nothing is enumerated or allocated.
template <class C, gradient_enumerable M>
std::size_t all_reduce_gradients(C& comm, M& model, const gradient_reduction& options) {
  check_compression<typename M::scalar_type>(options);
  if constexpr (std::is_same_v<C, comm::local>) {
    return 0;
  } else {
    std::size_t collectives = 0;
    for_each_gradient_bucket(model, options, [&](const auto& bucket) {
      all_reduce_bucket(comm, options, bucket);
      ++collectives;
    });
    return collectives;
  }
}

}  // namespace comm
}  // namespace distribute
