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
//
// Uneven input across workers: with several workers, the strategy's distributed dataset makes the
// workers agree, before every step, on how many examples the step holds across the job and how many
// workers have run out (one all-reduce of two integers, on the thread that iterates). A worker never
// leaves the loop alone, so workers never pair the wrong collectives; `uneven_input` says what
// happens when some workers run out before others:
//   join          (default) the loop goes on until every worker is out; a worker that is out takes
//                 part with empty batches (DDP's Join, tf.distribute's partial batches): no example
//                 is dropped and every collective of the step still has every replica
//   end_together  the loop ends on every worker at the first step some worker has no input for; the
//                 other workers' remaining examples of that pass are dropped
// Either way, every part's `global_size` (when it was split from a global batch) is the step's count
// across the whole job, so a short step is weighted by its true count. Iterate the distributed
// dataset on one thread per worker, between steps (not from inside `run`), like the strategy's other
// collectives; it refers to the strategy, which must outlive it.

#include <distribute/data/dataset.hpp>
#include <distribute/data/detail/batching.hpp>
#include <distribute/per_replica.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
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

// What the workers do when some run out of input before others (see above).
enum class uneven_input { join, end_together };

struct distribute_options {
  shard_policy policy = shard_policy::automatic;
  uneven_input uneven = uneven_input::join;
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
        return make_replica_values<per_replica<batch_type, Extent>>(
            1, [&](std::size_t) { return split::whole(std::move(global), n); });
      if (first == 0) {
        // This worker's first replica takes the first rows: the batch's own storage, cut short, once
        // the other parts are copied out of it.
        std::vector<batch_type> rest;
        rest.reserve(replicas - 1);
        for (std::size_t r = 1; r < replicas; ++r)
          rest.push_back(split::slice(global, share_offset(n, parts, r), share_of(n, parts, r), n));
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
    throw std::invalid_argument("distribute::data: worker_index " + std::to_string(o.worker_index) +
                                " is not below num_workers " + std::to_string(o.num_workers));
  if (o.prefetch == 0) throw std::invalid_argument("distribute::data: distribute needs a prefetch of at least 1 step");
  if (o.prefetch_threads == 0)
    throw std::invalid_argument("distribute::data: distribute needs at least 1 prefetch thread");
}

}  // namespace detail

namespace detail {

// Before each step the workers exchange {examples this worker has for the step, 1 if it has none}
// and receive the sums over the job (the strategy's all-reduce).
using step_census = std::array<std::uint64_t, 2>;
using census_function = std::function<step_census(step_census)>;

template <class B>
std::size_t global_size_of(const B& b) {
  if constexpr (requires { b.global_size; }) return b.global_size;
  else if constexpr (requires { b.first; }) return global_size_of(b.first);
  else return 0;
}

template <class B>
void set_global_size(B& b, std::size_t n) {
  if constexpr (requires { b.global_size; }) {
    if (b.global_size != 0) b.global_size = n;
  } else if constexpr (requires {
                         b.first;
                         b.second;
                       }) {
    set_global_size(b.first, n);
    set_global_size(b.second, n);
  }
}

// A distributed dataset whose workers agree on every step (see "Uneven input across workers").
template <class D>
class agreed_steps_dataset : public dataset_base<agreed_steps_dataset<D>> {
  static_assert(dataset<D>);

 public:
  using element_type = element_t<D>;  // per_replica<batch, Extent>

 private:
  using batch_type = std::remove_cvref_t<decltype(std::declval<element_type&>()[0])>;
  using split = splitting<batch_type>;

 public:
  agreed_steps_dataset(D input, census_function census, uneven_input mode, std::size_t worker, std::size_t workers,
                       bool same_steps)
      : input_(std::move(input)),
        census_(std::move(census)),
        mode_{mode},
        worker_{worker},
        workers_{workers},
        same_steps_{same_steps} {}

  class cursor_type {
   public:
    cursor_type(cursor_t<D> in, const agreed_steps_dataset& owner)
        : in_(std::move(in)),
          census_{owner.census_},
          mode_{owner.mode_},
          worker_{owner.worker_},
          workers_{owner.workers_} {}

    std::optional<element_type> next() {
      if (ended_) return std::nullopt;
      std::optional<element_type> mine;
      if (!out_) {
        mine = in_.next();
        out_ = !mine.has_value();
      }
      std::uint64_t count = 0;
      if (mine)
        for (std::size_t r = 0; r < mine->size(); ++r) count += split::count((*mine)[r]);
      const step_census job = census_(step_census{count, out_ ? 1u : 0u});
      const std::uint64_t examples = job[0], workers_out = job[1];
      if (workers_out == workers_ || (workers_out > 0 && mode_ == uneven_input::end_together)) {
        ended_ = true;
        return std::nullopt;
      }
      if (!mine) {
        if (!shape_)
          throw std::runtime_error("distribute::data: worker " + std::to_string(worker_) +
                                   " has no input at all while other workers do, so it cannot join their steps with "
                                   "empty batches of the right shape; give every worker input (shard_policy::data) "
                                   "or use uneven_input::end_together");
        const auto& shape = *shape_;
        mine.emplace(make_replica_values<element_type>(
            shape.size(), [&](std::size_t r) { return split::slice(shape[r], 0, 0, global_size_of(shape[r])); }));
      } else if (!shape_) {
        shape_.emplace(make_replica_values<element_type>(
            mine->size(), [&](std::size_t r) { return split::slice((*mine)[r], 0, 0, global_size_of((*mine)[r])); }));
      }
      for (std::size_t r = 0; r < mine->size(); ++r) set_global_size((*mine)[r], static_cast<std::size_t>(examples));
      return mine;
    }

   private:
    cursor_t<D> in_;
    census_function census_;
    uneven_input mode_;
    std::size_t worker_, workers_;
    std::optional<element_type> shape_;  // empty parts of this worker's shapes, for steps it joins
    bool out_ = false, ended_ = false;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {input_.cursor(epoch), *this}; }
  // Exact when every worker reads the same number of steps (sharding by data, or off); unknown when
  // workers read their own files.
  std::int64_t cardinality() const { return same_steps_ ? input_.cardinality() : unknown_cardinality; }

 private:
  D input_;
  census_function census_;
  uneven_input mode_;
  std::size_t worker_, workers_;
  bool same_steps_;
};

}  // namespace detail

template <class D, std::size_t Extent>
struct distributor {
  static_assert(dataset<D>, "distribute::data: strategy.distribute(ds) needs a data::dataset");
  static_assert(
      detail::splittable<element_t<D>>,
      "distribute::data: strategy.distribute(ds) re-batches GLOBAL batches: call .batch(global_batch_size) on "
      "the dataset first (its elements must be data::batch, std::vector or a pair of them)");

  // `census`: the strategy's agreement between workers (detail::census_function), or nullptr for a
  // strategy of one process.
  template <class Census = std::nullptr_t>
  static auto distribute(const D& ds, std::size_t replicas, const distribute_options& o, Census census = nullptr) {
    detail::check_options(o, replicas);
    if (Extent != std::dynamic_extent && replicas != Extent)
      throw std::invalid_argument("distribute::data: replica count does not match the strategy's extent");
    const std::size_t workers = o.num_workers, w = o.worker_index;
    std::optional<D> pipeline(ds);  // optional: a D holding a lambda cannot be assigned, only re-made
    std::size_t parts = workers * replicas, first = w * replicas;  // shard_policy::data
    bool own_files = false;
    const auto by_file = [&](const auto& d) {  // generic, so that it is only instantiated for file_shardable D
      pipeline.emplace(d.shard_files(w, workers));
      parts = replicas;
      first = 0;
      own_files = true;
    };
    if (workers > 1) {
      switch (o.policy) {
        case shard_policy::off:
          parts = replicas;
          first = 0;
          break;
        case shard_policy::data: break;
        case shard_policy::file:
          if constexpr (file_shardable<D>) {
            if (ds.file_count() < workers)
              throw std::invalid_argument(
                  "distribute::data: shard_policy::file needs at least as many files as workers: "
                  "the dataset reads " +
                  std::to_string(ds.file_count()) + " file(s) for " + std::to_string(workers) +
                  " workers (use shard_policy::data or automatic)");
            by_file(ds);
          } else {
            throw std::invalid_argument(
                "distribute::data: shard_policy::file: this dataset cannot be sharded by file (its "
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
                own_files = false;
              }
            }
          }
          break;
      }
    }
    auto out = pipeline->map(detail::split_global_batch<Extent>{replicas, parts, first})
                   .prefetch(o.prefetch, o.prefetch_threads);
    if constexpr (std::is_same_v<Census, std::nullptr_t>) {
      return out;
    } else {
      return detail::agreed_steps_dataset<decltype(out)>(std::move(out), detail::census_function(std::move(census)),
                                                         o.uneven, w, workers, !own_files);
    }
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
  template <class Census = std::nullptr_t>
  static auto distribute(const F& fn, std::size_t replicas, const distribute_options& o, Census census = nullptr) {
    static_assert(std::invocable<const F&, const input_context&>,
                  "distribute::data: distribute_from_function(fn) calls fn(const data::input_context&)");
    using D = std::remove_cvref_t<std::invoke_result_t<const F&, const input_context&>>;
    static_assert(dataset<D>, "distribute::data: distribute_from_function(fn): fn must return a data::dataset");
    static_assert(detail::splittable<element_t<D>>,
                  "distribute::data: distribute_from_function(fn): fn's dataset must yield per-replica batches "
                  "(batch it with ctx.per_replica_batch_size(global_batch_size))");
    detail::check_options(o, replicas);
    const input_context ctx{o.num_workers, o.worker_index, o.num_workers * replicas};
    auto out =
        replica_group_dataset<D, Extent>(std::invoke(fn, ctx), replicas).prefetch(o.prefetch, o.prefetch_threads);
    if constexpr (std::is_same_v<Census, std::nullptr_t>) {
      return out;
    } else {
      // Each worker's function makes its own pipeline: the workers may read different numbers of steps.
      return detail::agreed_steps_dataset<decltype(out)>(std::move(out), detail::census_function(std::move(census)),
                                                         o.uneven, o.worker_index, o.num_workers, false);
    }
  }
};

}  // namespace distribute::data
