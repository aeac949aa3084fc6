#pragma once
// The gradient all-reduce overlapped with backward: each bucket (gradient_buckets.hpp) starts as soon
// as backward has made all of its gradients final, while the layers before it are still computing,
// and the step waits only at the end for what is still in flight. DDP and Horovod do the same.
//
//   auto sync = r.overlap_gradients();   // this replica's collectives now go through `sync`
//   sync.add(model);                     // just before the model's last backward of the step
//   model.backward(r, dy);               // sequential layers say when their gradients are final
//   sync.wait();                         // every added model's gradients are all-reduced
//   optimizer.step(r, model);
//
// What it computes is what `r.all_reduce_gradients(model)` for each added model, in the order they
// were added, computes: the same buckets over the same buffers in the same order (the plan is one
// function), so the results have the same bits on every communicator. Only when the collectives run
// changes.
//
// How:
// - `nn::sequential` (and every layer built on it) tells the replica after each of its layers'
//   backward that the layer's gradients are final (`r.gradients_ready(layer)`); a gradient never
//   announced is all-reduced by `wait` with the rest, so a model of other layers is still correct,
//   only not overlapped.
// - On a CPU replica the collectives run on a thread of the replica's own, in the order the replica
//   issued them. Every other collective this replica calls while the overlap is open (a
//   sync_batch_norm's inside backward, a loss reduction) joins that same queue and is waited for, so
//   every replica still issues one sequence of collectives and no communicator sees two at once from one
//   replica (MPI needs no more than MPI_THREAD_SERIALIZED).
// - On a GPU replica whose communicator has a split phase (NCCL: `start_all_reduce`,
//   `finish_started`), each bucket is queued on the replica's communication stream behind an event of
//   its compute stream, from the replica's own thread; backward goes on queueing on the compute
//   stream, and `wait` waits for the communication stream. Another collective called while the
//   overlap is open first waits for the buckets started, so the communicator still sees one order.
// - Other communicators (cuda_peer: several replicas on one GPU) all-reduce the buckets in `wait`, as
//   the blocking call would: correct, not overlapped. mirrored_strategy<cuda> chooses its collective engine when
//   it is built, and its replicas' communicator says which at run time (`splits()`).
// - Under one device there is nothing to combine: nothing is enumerated, nothing runs.
//
// Rules: add a model just before its LAST backward of the step (with gradient accumulation, or a
// model whose backward runs twice, earlier passes would otherwise send partial gradients); a weight
// shared by two layers is final only after both, so a model that shares weights is added to no
// overlap. A replica has at most one overlap open. If backward throws, the overlap's destructor
// stops its thread (the collective in flight ends, or fails when the strategy aborts the step) and
// the exception goes on to `run` as before.

#include <distribute/collective_origin.hpp>
#include <distribute/comm/gradient_buckets.hpp>
#include <distribute/comm/local.hpp>
#include <distribute/detail/activity.hpp>
#include <distribute/detail/ordered_worker.hpp>

#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace distribute {

namespace comm {
// A communicator that can start an all-reduce and finish it later (cuda/comm/nccl.cuh).
template <class C>
concept split_phase_communicator = requires(C& c, std::span<const std::span<float>> buffers) {
  c.start_all_reduce(reduce_op::sum, buffers);
  c.finish_started();
  c.abandon_started();
};

// What a replica knows of its open overlap.
class overlap_hook {
 public:
  // The gradient whose data starts at `gradient` is final.
  virtual void ready(const void* gradient) = 0;
  // The gradients named by `ready` since the last call were final together (one layer's).
  virtual void announced() = 0;
  // A collective the replica calls while the overlap is open: run in its turn, waited for.
  virtual void communicate(const std::function<void()>& collective) = 0;

 protected:
  ~overlap_hook() = default;
};
}  // namespace comm

template <class C>
class gradient_overlap final : comm::overlap_hook {
 public:
  // Made by `replica_context::overlap_gradients`. `slot`: where the replica looks for its open
  // overlap (null under one device); `threaded`: whether collectives run on a thread of their own
  // (never with a split-phase communicator, which needs none).
  gradient_overlap(C& comm, comm::overlap_hook** slot, bool threaded, const gradient_reduction& options,
                   detail::collective_meter* meter)
      : comm_{comm},
        slot_{slot},
        split_{splits(comm)},
        threaded_{threaded && !split_},
        options_{options},
        meter_{meter} {
    if (!slot_) return;
    if (*slot_)
      throw std::logic_error("distribute: replica " + std::to_string(comm.rank()) +
                             " opened a gradient overlap while another is open; wait() for the first one");
    *slot_ = this;
  }
  ~gradient_overlap() { close(); }
  gradient_overlap(const gradient_overlap&) = delete;
  gradient_overlap& operator=(const gradient_overlap&) = delete;

  // Adds `model`'s gradients: their buckets start as backward makes them final. Call it just before
  // the model's last backward of the step.
  template <gradient_enumerable M>
  gradient_overlap& add(M& model) {
    using T = typename M::scalar_type;
    comm::check_compression<T>(options_);
    if (!slot_) return *this;
    if (finished_) throw std::logic_error("distribute: gradient_overlap::add after wait()");
    comm::for_each_gradient_bucket(model, options_, [&](std::vector<std::span<T>>&& bucket) {
      const std::size_t b = buckets_.size();
      for (const auto g : bucket) {
        if (!at_.emplace(static_cast<const void*>(g.data()), b).second)
          throw std::invalid_argument("distribute: gradient_overlap::add got a model whose gradients it already holds");
      }
      if constexpr (can_split) {
        if (split_ && starts(options_.compression)) {
          buckets_.push_back({bucket.size(), [this, bucket = std::move(bucket)] {
                                const collective_label label("all_reduce_gradients");
                                const std::span<const std::span<T>> buffers(bucket);
                                if constexpr (can_split_compressed && std::is_same_v<T, float>) {
                                  if (options_.compression != gradient_compression::none && comm_.size() > 1)
                                    return comm_.start_all_reduce_as_bfloat16(options_.op, buffers);
                                }
                                comm_.start_all_reduce(options_.op, buffers);
                              }});
          return;
        }
      }
      buckets_.push_back(
          {bucket.size(), [this, bucket = std::move(bucket)] { comm::all_reduce_bucket(comm_, options_, bucket); }});
    });
    return *this;
  }

  // Waits until every added model's gradients are all-reduced (starting what has not started);
  // rethrows a collective's failure. Returns the number of bucket collectives. After it, this
  // replica's collectives run directly again.
  std::size_t wait() {
    if (!slot_ || finished_) return buckets_.size();
    const detail::collective_stopwatch timed{meter_};
    finished_ = true;
    for (auto& b : buckets_) b.pending = 0;
    start_ready();
    if constexpr (can_split) {
      if (split_) comm_.finish_started();
    }
    close_after_drain();
    return buckets_.size();
  }

  // The number of bucket collectives started so far (for tests and benchmarks).
  std::size_t started() const noexcept { return next_; }

  // The buckets whose gradients all became final while an earlier bucket of the plan still waited
  // for some of its own: each had to wait its turn. Buckets are planned in reverse enumeration
  // order, which is the order backward finishes them in every model built from `nn::sequential`
  // (and in every container that enumerates its children in forward order and announces them in
  // reverse), so there it is 0 and the plan needs no rebuilding in ready order (DDP rebuilds its
  // buckets once, after a first step, for models whose definition order is not their execution
  // order). Anything else here points at a model whose `for_each_parameter` order is not its
  // forward order, at models added in another order than their backward runs, or at gradients
  // nobody announces (they wait for `wait`, and so does every bucket after theirs).
  std::size_t held_back() const noexcept { return held_back_; }

 private:
  // Whether C has a split phase, and whether this communicator uses it (one that chooses its collective engine
  // at run time says so with `splits()`: cuda_replica, NCCL or cuda_peer).
  static constexpr bool can_split = comm::split_phase_communicator<C>;
  static constexpr bool can_split_compressed = requires(C& c, std::span<const std::span<float>> buffers) {
    c.start_all_reduce_as_bfloat16(reduce_op::sum, buffers);
  };
  // Whether a bucket of this compression is started in the split phase (else it runs in `wait`).
  static constexpr bool starts(gradient_compression c) noexcept {
    return c == gradient_compression::none || can_split_compressed;
  }
  static bool splits(C& c) {
    if constexpr (!can_split) return false;
    else if constexpr (requires { c.splits(); }) return c.splits();
    else return true;
  }

  struct bucket {
    std::size_t pending;  // gradients not yet final
    std::function<void()> run;
  };

  void ready(const void* gradient) override {
    const auto it = at_.find(gradient);
    if (it == at_.end() || finished_) return;
    auto& b = buckets_[it->second];
    if (b.pending && --b.pending == 0) finished_now_.push_back(it->second);
    at_.erase(it);  // once only
    start_ready();
  }

  // A layer's gradients are final together, whatever order it enumerates them in: a bucket waits
  // its turn only behind one that is still waiting after the whole announcement.
  void announced() override {
    while (first_waiting_ < buckets_.size() && buckets_[first_waiting_].pending == 0) ++first_waiting_;
    for (const auto b : finished_now_) held_back_ += b > first_waiting_ ? 1 : 0;
    finished_now_.clear();
  }

  void communicate(const std::function<void()>& collective) override {
    if (threaded_ && worker_) {
      worker_->post([&collective] { collective(); });
      worker_->drain();
    } else {
      if constexpr (can_split) {
        if (split_) comm_.finish_started();
      }
      collective();
    }
  }

  // Starts, in plan order, every bucket whose gradients are all final and whose predecessors have
  // started: the same sequence on every replica.
  void start_ready() {
    while (next_ < buckets_.size() && buckets_[next_].pending == 0) {
      if (threaded_) {
        if (!worker_) worker_.emplace();
        worker_->post(std::move(buckets_[next_].run));
      } else if (split_ || finished_) {
        buckets_[next_].run();
      } else {
        return;  // not threaded: everything runs in `wait`, as the blocking call would
      }
      ++next_;
    }
  }

  void close_after_drain() {
    struct closing {
      gradient_overlap& o;
      ~closing() { o.close(); }
    } guard{*this};
    if (worker_) worker_->drain();
  }

  void close() noexcept {
    if (slot_ && *slot_ == this) *slot_ = nullptr;
    worker_.reset();
    if constexpr (can_split) {
      if (split_ && slot_ && next_ != 0) comm_.abandon_started();  // nothing left after a successful wait
    }
  }

  C& comm_;
  comm::overlap_hook** slot_;
  bool split_;
  bool threaded_;
  gradient_reduction options_;
  detail::collective_meter* meter_;
  bool finished_ = false;
  std::vector<bucket> buckets_;
  std::unordered_map<const void*, std::size_t> at_;  // gradient data -> its bucket, until final
  std::size_t next_ = 0;                             // the next bucket to start
  std::size_t first_waiting_ = 0;                    // the first bucket with gradients not yet final
  std::size_t held_back_ = 0;                        // see held_back()
  std::vector<std::size_t> finished_now_;            // buckets the current announcement finished
  std::optional<detail::ordered_worker> worker_;
};

}  // namespace distribute
