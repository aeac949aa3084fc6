#pragma once
// Distributed datasets: what `strategy.distribute(dataset, options)` and
// `strategy.distribute_from_function(fn, options)` return (both are members of every strategy;
// the work is done here).
//
// distribute(dataset): the dataset yields GLOBAL batches (a step's examples across every replica of
// every worker). Each global batch of n examples is split, in order, into `parts` shares as even as
// possible (the first n % parts shares one example more); this worker keeps its replicas' shares, one
// per replica, as per_replica<Batch>. Every part carries its true count (`size()`, possibly 0 in a
// short last batch: an empty batch of the right row shape) and, for data::batch, the global batch's
// count in `global_size`, so a replica divides its summed loss by the same global count as the others
// and no replica skips a step (which would leave the others waiting in a collective).
//
// Sharding across workers (worker index and count are given explicitly in the options):
//   off        every worker reads every example; a global batch is split over this worker's replicas
//   data       every worker reads every global batch and keeps its share (1/workers of it): each
//              example is used once per epoch, and every worker runs the same number of steps
//   file       each worker reads its own files (files i with i % workers == index) and batches
//              global_batch / workers of them; an error when there are fewer files than workers.
//              Workers may run different numbers of steps when the files hold different counts.
//   automatic  file when the pipeline can be sharded by file and has enough files, else data
// Then a prefetch of `prefetch` steps on `prefetch_threads` threads is appended (as tf.distribute
// does); a map at the end of the dataset is fused with the split, so those threads run it too.

#include <distribute/data/dataset.hpp>
#include <distribute/data/detail/batching.hpp>
#include <distribute/per_replica.hpp>

#include <array>
#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::data {

enum class shard_policy { off, data, file, automatic };

struct distribute_options {
  shard_policy policy = shard_policy::automatic;
  std::size_t num_workers = 1;
  std::size_t worker_index = 0;
  std::size_t prefetch = 2;  // steps prepared ahead (at least 1)
  std::size_t prefetch_threads = 1;
};

// What `distribute_from_function` passes to the user's function: this input pipeline's place among
// the workers' pipelines, and the replica count that a global batch is divided by.
struct input_context {
  std::size_t num_input_pipelines = 1;
  std::size_t input_pipeline_id = 0;
  std::size_t num_replicas_in_sync = 1;

  std::size_t per_replica_batch_size(std::size_t global_batch_size) const {
    if (num_replicas_in_sync == 0 || global_batch_size % num_replicas_in_sync != 0)
      throw std::invalid_argument("distribute::data: the global batch size " + std::to_string(global_batch_size) +
                                  " does not divide among " + std::to_string(num_replicas_in_sync) +
                                  " replicas; choose a multiple of the replica count");
    return global_batch_size / num_replicas_in_sync;
  }
};

namespace detail {

using distribute::detail::make_replica_values;
using distribute::detail::share_of;
using distribute::detail::share_offset;

// Splits a global batch into `parts` shares and keeps shares [first, first + replicas).
template <std::size_t Extent>
struct split_global_batch {
  std::size_t replicas, parts, first;

  template <class B>
  per_replica<std::remove_cvref_t<B>, Extent> operator()(B&& global) const {
    using batch_type = std::remove_cvref_t<B>;
    using split = splitting<batch_type>;
    const std::size_t n = split::count(global);
    if constexpr (!std::is_lvalue_reference_v<B>) {
      if (parts == 1 && replicas == 1)  // one replica, no workers to share with: the batch as it is
        return make_replica_values<per_replica<batch_type, Extent>>(1, [&](std::size_t) { return split::whole(std::move(global), n); });
      if (first == 0) {
        // This worker's first replica takes the first rows: the batch's own storage, cut short, once
        // the other parts are copied out of it.
        std::vector<batch_type> rest;
        rest.reserve(replicas - 1);
        for (std::size_t r = 1; r < replicas; ++r) rest.push_back(split::slice(global, share_offset(n, parts, r), share_of(n, parts, r), n));
        return make_replica_values<per_replica<batch_type, Extent>>(replicas, [&](std::size_t r) {
          return r == 0 ? split::head(std::move(global), share_of(n, parts, 0), n) : std::move(rest[r - 1]);
        });
      }
    }
    return make_replica_values<per_replica<batch_type, Extent>>(replicas, [&](std::size_t r) {
      const std::size_t k = first + r;
      return split::slice(global, share_offset(n, parts, k), share_of(n, parts, k), n);
    });
  }
};

inline void check_options(const distribute_options& o, std::size_t replicas) {
  if (replicas == 0) throw std::invalid_argument("distribute::data: a strategy without replicas cannot distribute");
  if (o.num_workers == 0 || o.worker_index >= o.num_workers)
    throw std::invalid_argument("distribute::data: worker_index " + std::to_string(o.worker_index) + " is not below num_workers " +
                                std::to_string(o.num_workers));
  if (o.prefetch == 0) throw std::invalid_argument("distribute::data: distribute needs a prefetch of at least 1 step");
  if (o.prefetch_threads == 0) throw std::invalid_argument("distribute::data: distribute needs at least 1 prefetch thread");
}

}  // namespace detail

template <class D, std::size_t Extent>
struct distributor {
  static_assert(dataset<D>, "distribute::data: strategy.distribute(ds) needs a data::dataset");
  static_assert(detail::splittable<element_t<D>>,
                "distribute::data: strategy.distribute(ds) re-batches GLOBAL batches: call .batch(global_batch_size) on "
                "the dataset first (its elements must be data::batch, std::vector or a pair of them)");

  static auto distribute(const D& ds, std::size_t replicas, const distribute_options& o) {
    detail::check_options(o, replicas);
    if (Extent != std::dynamic_extent && replicas != Extent)
      throw std::invalid_argument("distribute::data: replica count does not match the strategy's extent");
    const std::size_t workers = o.num_workers, w = o.worker_index;
    std::optional<D> pipeline(ds);  // optional: a D holding a lambda cannot be assigned, only re-made
    std::size_t parts = workers * replicas, first = w * replicas;  // shard_policy::data
    const auto by_file = [&](const auto& d) {  // generic, so that it is only instantiated for file_shardable D
      pipeline.emplace(d.shard_files(w, workers));
      parts = replicas;
      first = 0;
    };
    if (workers > 1) {
      switch (o.policy) {
        case shard_policy::off:
          parts = replicas;
          first = 0;
          break;
        case shard_policy::data:
          break;
        case shard_policy::file:
          if constexpr (file_shardable<D>) {
            if (ds.file_count() < workers)
              throw std::invalid_argument("distribute::data: shard_policy::file needs at least as many files as workers: "
                                          "the dataset reads " + std::to_string(ds.file_count()) + " file(s) for " +
                                          std::to_string(workers) + " workers (use shard_policy::data or automatic)");
            by_file(ds);
          } else {
            throw std::invalid_argument("distribute::data: shard_policy::file: this dataset cannot be sharded by file (its "
                                        "source reads no files, or take, skip or zip stands between the files and the "
                                        "batch); use shard_policy::data or automatic");
          }
          break;
        case shard_policy::automatic:
          if constexpr (file_shardable<D>) {
            if (ds.file_count() >= workers) {
              try {
                by_file(ds);
              } catch (const std::invalid_argument&) {  // e.g. a batch that does not divide: shard by data
                pipeline.emplace(ds);
                parts = workers * replicas;
                first = w * replicas;
              }
            }
          }
          break;
      }
    }
    return pipeline->map(detail::split_global_batch<Extent>{replicas, parts, first}).prefetch(o.prefetch, o.prefetch_threads);
  }
};

// Groups consecutive per-replica batches of a dataset into steps: element k * replicas + r goes to
// replica r of step k. A short last step gives the missing replicas empty batches (of the first
// batch's row shape).
template <dataset D, std::size_t Extent>
class replica_group_dataset : public dataset_base<replica_group_dataset<D, Extent>> {
  using batch_type = element_t<D>;

 public:
  using element_type = per_replica<batch_type, Extent>;

  replica_group_dataset(D input, std::size_t replicas) : input_(std::move(input)), replicas_(replicas) {}

  class cursor_type {
   public:
    cursor_type(cursor_t<D> in, std::size_t replicas) : in_(std::move(in)), replicas_(replicas) {}
    std::optional<element_type> next() {
      std::vector<batch_type> parts;
      parts.reserve(replicas_);
      while (parts.size() < replicas_) {
        auto b = in_.next();
        if (!b) break;
        parts.push_back(std::move(*b));
      }
      if (parts.empty()) return std::nullopt;
      const batch_type& shape_of = parts.front();
      return detail::make_replica_values<per_replica<batch_type, Extent>>(replicas_, [&](std::size_t r) {
        if (r < parts.size()) return std::move(parts[r]);
        return detail::splitting<batch_type>::slice(shape_of, 0, 0, 0);
      });
    }

   private:
    cursor_t<D> in_;
    std::size_t replicas_;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {input_.cursor(epoch), replicas_}; }
  std::int64_t cardinality() const {
    const std::int64_t c = input_.cardinality();
    const auto r = static_cast<std::int64_t>(replicas_);
    return c < 0 ? c : (c + r - 1) / r;
  }

 private:
  D input_;
  std::size_t replicas_;
};

template <class F, std::size_t Extent>
struct function_distributor {
  static auto distribute(const F& fn, std::size_t replicas, const distribute_options& o) {
    static_assert(std::invocable<const F&, const input_context&>,
                  "distribute::data: distribute_from_function(fn) calls fn(const data::input_context&)");
    using D = std::remove_cvref_t<std::invoke_result_t<const F&, const input_context&>>;
    static_assert(dataset<D>, "distribute::data: distribute_from_function(fn): fn must return a data::dataset");
    static_assert(detail::splittable<element_t<D>>,
                  "distribute::data: distribute_from_function(fn): fn's dataset must yield per-replica batches "
                  "(batch it with ctx.per_replica_batch_size(global_batch_size))");
    detail::check_options(o, replicas);
    const input_context ctx{o.num_workers, o.worker_index, o.num_workers * replicas};
    return replica_group_dataset<D, Extent>(std::invoke(fn, ctx), replicas).prefetch(o.prefetch, o.prefetch_threads);
  }
};

}  // namespace distribute::data
