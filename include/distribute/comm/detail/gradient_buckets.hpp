#pragma once
// Gradient aggregation by fused buckets: the gradients of a model are packed, in reverse enumeration
// order, into buckets of about `bucket_bytes`, and each bucket is one all-reduce. The buckets are
// lists of spans over the gradients themselves: the shared-memory engine reduces them in place
// (zero-copy fusion), so a bucket costs one meeting of the replicas instead of one per tensor.
//
// It lives with the collectives and knows models only through `gradient_enumerable`, so that
// `replica_context::all_reduce_gradients` stays a thin forwarding member and the strategies layer does
// not depend on the nn layer above it.

#include <distribute/collective_origin.hpp>
#include <distribute/comm/local.hpp>
#include <distribute/dtype.hpp>
#include <distribute/reduce_op.hpp>

#include <cstddef>
#include <span>
#include <type_traits>
#include <vector>

namespace distribute {

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
};

namespace detail {
// What `for_each_parameter` is called with: (value, gradient) of one parameter tensor.
template <class T>
struct parameter_visitor_archetype {
  void operator()(std::span<T>, std::span<T>) const {}
};
}  // namespace detail

// A model whose parameters and gradients can be enumerated, in the same order on every replica:
// `m.for_each_parameter(f)` calls `f(std::span<scalar_type> value, std::span<scalar_type> gradient)`
// once per parameter tensor.
template <class M>
concept gradient_enumerable = requires { typename M::scalar_type; } && element<typename M::scalar_type> &&
                              requires(M& m) {
                                m.for_each_parameter(detail::parameter_visitor_archetype<typename M::scalar_type>{});
                              };

namespace detail {

// The buckets of `model`'s gradients, in the order they are all-reduced: the gradients in reverse
// enumeration order (the order backward makes them final: the last layer's first), packed into
// buckets of at most `first_bucket_bytes` for the first and `bucket_bytes` for the others (a larger
// gradient alone); empty gradients are skipped. `sink(std::vector<std::span<T>>)` gets each bucket.
// The blocking and the overlapped all-reduce use this one plan, so they run the same collectives
// over the same buffers and their results have the same bits on every engine.
template <gradient_enumerable M, class Sink>
void for_each_gradient_bucket(M& model, const gradient_reduction& options, Sink&& sink) {
  using T = typename M::scalar_type;
  std::vector<std::span<T>> gradients;
  model.for_each_parameter([&](std::span<T>, std::span<T> gradient) {
    if (!gradient.empty()) gradients.push_back(gradient);
  });
  std::vector<std::span<T>> bucket;
  std::size_t bytes = 0, cap = options.first_bucket_bytes < options.bucket_bytes ? options.first_bucket_bytes : options.bucket_bytes;
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

// One bucket's collective.
template <class C, class T>
void all_reduce_bucket(C& comm, reduce_op op, const std::vector<std::span<T>>& bucket) {
  const collective_label label("all_reduce_gradients");
  if (bucket.size() == 1) comm.all_reduce(op, bucket.front());
  else comm.all_reduce(op, std::span<const std::span<T>>(bucket));
}

// All-reduces every gradient of `model`, one collective per bucket; returns the number of collectives.
// Under the `local` communicator there is nothing to combine, and nothing is enumerated or allocated.
template <class C, gradient_enumerable M>
std::size_t all_reduce_gradients(C& comm, M& model, const gradient_reduction& options) {
  if constexpr (std::is_same_v<C, comm::local>) {
    return 0;
  } else {
    std::size_t collectives = 0;
    for_each_gradient_bucket(model, options, [&](const auto& bucket) {
      all_reduce_bucket(comm, options.op, bucket);
      ++collectives;
    });
    return collectives;
  }
}

}  // namespace detail
}  // namespace distribute
