#pragma once
// Collectives between every replica of every worker: an in-process stage between the replica threads
// of this worker (shared memory), a cross-process stage between workers run by one thread per worker
// (local replica 0), then a fan-out of the result to the other local replicas.
//
//   all_reduce   local reduction -> cross-worker reduction of the local results -> copy to every local
//                replica. A mean is summed in both stages and divided once, by the replica count.
//                Or, with `local_reduction::first_replica`, local replica 0 does all three for the
//                worker in one pass (the cross communicator's all_reduce_each reads and writes every local
//                replica's buffers), while the others wait: better when the replicas outnumber the
//                cores, where a reduction inside the process only passes cores back and forth.
//   all_gather   local gather into this worker's blocks -> cross-worker gather of the blocks -> copy
//   broadcast    to local replica 0 of the root's worker -> across workers -> to every local replica
//   barrier      local, across, local
//
// Replicas are numbered across the job: worker w holds replicas first(w) .. first(w) + count(w) - 1,
// and workers may hold different numbers of replicas.
//
// `Cross` is the communicator between workers (comm::mpi): it provides rank/size, all_reduce(op, buffers,
// mean_over), all_gather(in, out, counts) and broadcast/barrier.
//
// Point-to-point (send, recv) and split, where `Cross` has them, work when every worker holds exactly
// one replica: replica q is then worker q, and they are the cross communicator's, with its semantics (and
// `split` returns a `Cross`). With several replicas on some worker they throw std::logic_error. A
// failure of one is a failure of the replica, as a collective's is: the strategy takes the worker
// out of the job.

#include <distribute/collective_options.hpp>
#include <distribute/comm/argument_checks.hpp>
#include <distribute/comm/detail/copy_bytes.hpp>
#include <distribute/comm/job_layout.hpp>
#include <distribute/comm/shared_memory.hpp>
#include <distribute/concepts/communicator.hpp>
#include <distribute/detail/hardware.hpp>
#include <distribute/dtype.hpp>
#include <distribute/reduce_op.hpp>

#include <algorithm>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace distribute::comm {

template <class Cross>
class hierarchical;

// How the replicas of a worker take part in an all-reduce across workers.
enum class local_reduction {
  // first_replica when the cross communicator reads other processes' memory directly (comm::mpi with
  // every worker on one machine) and the replicas outnumber the hardware threads: this worker's
  // replicas those it may run on (its affinity mask), or the job's those of the machine; otherwise
  // parallel.
  automatic,
  parallel,       // the local replicas all-reduce among themselves, then local replica 0 across workers
  first_replica,  // local replica 0 reduces every local buffer with the other workers' in one pass
};

namespace detail {
template <class Cross, class T>
concept reduces_several_lists = requires(Cross& c, std::span<const std::span<const std::span<T>>> lists) {
  c.all_reduce_each(reduce_op::sum, lists, 1);
  { c.uses_shared_memory() } -> std::convertible_to<bool>;
};
}  // namespace detail

// The shared state of one worker's replicas. Creating it is a collective of the workers (they
// exchange their replica counts).
template <class Cross>
class hierarchical_group {
 public:
  hierarchical_group(Cross cross, int local_replicas, collective_options options = {},
                     local_reduction how = local_reduction::automatic)
      : cross_{std::move(cross)},
        local_{check_count(local_replicas), cross_.size() > 1 ? local_options(options) : options},
        worker_{cross_.rank()},
        layout_{job_layout::gather(cross_, local_replicas)},
        published_(static_cast<std::size_t>(local_replicas)) {
    if constexpr (detail::reduces_several_lists<Cross, float>) {
      if (how == local_reduction::automatic) {
        // All workers are on this machine when the communicator shares memory: too few cores either for
        // this worker's replicas (its affinity mask) or for the job's (the machine's threads).
        const unsigned mine = distribute::detail::usable_hardware_threads(),
                       machine = std::thread::hardware_concurrency();
        const bool crowded = static_cast<unsigned>(local_replicas) > mine ||
                             (machine != 0 && static_cast<unsigned>(total_replicas()) > machine);
        how = cross_.uses_shared_memory() && crowded ? local_reduction::first_replica : local_reduction::parallel;
      }
    } else {
      how = local_reduction::parallel;
    }
    first_replica_reduces_ = how == local_reduction::first_replica && local_replicas > 1 && cross_.size() > 1;
  }

  // Whether local replica 0 reduces for the whole worker (local_reduction::first_replica in effect).
  bool first_replica_reduces() const noexcept { return first_replica_reduces_; }
  hierarchical_group(const hierarchical_group&) = delete;
  hierarchical_group& operator=(const hierarchical_group&) = delete;

  inline hierarchical<Cross> endpoint(int local_rank);

  int worker_index() const noexcept { return worker_; }
  int num_workers() const noexcept { return layout_.num_workers(); }
  int local_replicas() const noexcept { return local_.size(); }
  int total_replicas() const noexcept { return layout_.total_replicas(); }
  // Where the job's replicas are (comm/job_layout.hpp).
  const job_layout& layout() const noexcept { return layout_; }
  // The first replica of worker `w` and how many it holds.
  int first_replica(int w) const noexcept { return layout_.first_replica(w); }
  int replicas_of(int w) const noexcept { return layout_.replicas_of(w); }
  int worker_of(int replica) const noexcept { return layout_.worker_of(replica); }

  Cross& cross() noexcept { return cross_; }
  shared_memory_group& local_group() noexcept { return local_; }

 private:
  friend class hierarchical<Cross>;

  static int check_count(int n) {
    if (n < 1)
      throw std::invalid_argument("distribute: a worker needs at least one local replica, got " + std::to_string(n));
    return n;
  }
  // With other workers, the local replicas wait at the fan-out while local replica 0 is in the
  // cross-worker stage, which has the full timeout: their own wait is longer, so that a slow or dead
  // worker is reported by the cross-worker stage (naming that worker) rather than as local replica 0
  // being late.
  static collective_options local_options(collective_options o) {
    o.timeout += std::max<std::chrono::milliseconds>(o.timeout / 2, std::chrono::seconds(1));
    return o;
  }

  Cross cross_;
  shared_memory_group local_;
  int worker_;
  job_layout layout_;
  std::vector<const void*> published_;  // what local replica 0 publishes for the fan-out
  bool first_replica_reduces_ = false;
};

template <class Cross>
class hierarchical {
 public:
  hierarchical(hierarchical_group<Cross>& group, int local_rank)
      : g_{&group}, local_{group.local_.endpoint(local_rank)} {}

  int rank() const noexcept { return g_->first_replica(g_->worker_) + local_.rank(); }
  int size() const noexcept { return g_->total_replicas(); }
  int local_rank() const noexcept { return local_.rank(); }
  int worker_index() const noexcept { return g_->worker_; }

  template <element T>
  void all_reduce(reduce_op op, std::span<T> buf) {
    if (g_->num_workers() == 1) return local_.all_reduce(op, buf);
    if (g_->first_replica_reduces()) return reduce_by_first_replica(op, std::span<const std::span<T>>(&buf, 1));
    const reduce_op partial = op == reduce_op::mean ? reduce_op::sum : op;
    if (local_.size() > 1) local_.all_reduce(partial, buf);
    if (local_.rank() == 0) {
      g_->cross_.all_reduce(op, buf, size());
      g_->published_[0] = buf.data();
    }
    fan_out([&](const void* from) {
      if (!buf.empty()) detail::copy_bytes(buf.data(), from, buf.size_bytes());
    });
  }

  template <element T>
  void all_reduce(reduce_op op, std::span<const std::span<T>> bufs) {
    if (g_->num_workers() == 1) return local_.all_reduce(op, bufs);
    if (bufs.size() == 1) return all_reduce(op, bufs[0]);
    if (g_->first_replica_reduces()) return reduce_by_first_replica(op, bufs);
    const reduce_op partial = op == reduce_op::mean ? reduce_op::sum : op;
    if (local_.size() > 1) local_.all_reduce(partial, bufs);
    if (local_.rank() == 0) {
      g_->cross_.all_reduce(op, bufs, size());
      g_->published_[0] = &bufs;
    }
    fan_out([&](const void* from) {
      const auto& source = *static_cast<const std::span<const std::span<T>>*>(from);
      for (std::size_t i = 0; i < bufs.size(); ++i)
        if (!bufs[i].empty()) detail::copy_bytes(bufs[i].data(), source[i].data(), bufs[i].size_bytes());
    });
  }

  // in.size() == size() * out.size(); replica rank() receives the reduction of block rank().
  template <element T>
  void reduce_scatter(reduce_op op, std::span<const T> in, std::span<T> out) {
    check_block_sizes("reduce_scatter", in.size(), out.size(), size());
    std::vector<T> all(in.begin(), in.end());
    all_reduce(op, std::span<T>(all));
    std::copy_n(all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(rank()) * out.size()), out.size(),
                out.begin());
  }

  // out.size() == size() * in.size(); block q of `out` is replica q's `in`.
  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    check_block_sizes("all_gather", out.size(), in.size(), size());
    if (g_->num_workers() == 1) return local_.all_gather(in, out);
    const std::size_t m = in.size();
    const auto mine = out.subspan(static_cast<std::size_t>(g_->first_replica(g_->worker_)) * m,
                                  static_cast<std::size_t>(local_.size()) * m);
    if (local_.size() > 1) local_.all_gather(in, mine);
    else if (m != 0 && in.data() != mine.data()) std::memmove(mine.data(), in.data(), in.size_bytes());
    if (local_.rank() == 0) {
      std::vector<std::size_t> counts(static_cast<std::size_t>(g_->num_workers()));
      for (int w = 0; w < g_->num_workers(); ++w)
        counts[static_cast<std::size_t>(w)] = static_cast<std::size_t>(g_->replicas_of(w)) * m;
      g_->cross_.all_gather(std::span<const T>(mine.data(), mine.size()), out, std::span<const std::size_t>(counts));
      g_->published_[0] = out.data();
    }
    fan_out([&](const void* from) {
      if (!out.empty()) detail::copy_bytes(out.data(), from, out.size_bytes());
    });
  }

  template <element T>
  void broadcast(std::span<T> buf, int root) {
    check_root(root, size());
    if (g_->num_workers() == 1) return local_.broadcast(buf, root);
    const int root_worker = g_->worker_of(root), root_local = root - g_->first_replica(root_worker);
    // On the root's worker, local replica 0 gets the root's buffer first.
    if (root_worker == g_->worker_ && root_local != 0) local_.broadcast(buf, root_local);
    if (local_.rank() == 0) g_->cross_.broadcast(buf, root_worker);
    if (local_.size() > 1) local_.broadcast(buf, 0);
  }

  void barrier() {
    if (local_.size() > 1) local_.barrier();
    if (g_->num_workers() > 1 && local_.rank() == 0) g_->cross_.barrier();
    if (local_.size() > 1) local_.barrier();
  }

  // To replica `dst` (a worker), matched by `tag`: Cross::send. One replica per worker only.
  template <element T>
    requires requires(Cross& c, std::span<const T> b) { c.send(b, 0, 0); }
  void send(std::span<const T> buf, int dst, int tag) {
    one_replica_per_worker("send");
    g_->cross_.send(buf, dst, tag);
  }
  template <element T>
    requires requires(Cross& c, std::span<const T> b) { c.send(b, 0, 0); }
  void send(std::span<T> buf, int dst, int tag) {
    send(std::span<const T>(buf), dst, tag);
  }

  // From replica `src` (a worker): Cross::recv. One replica per worker only.
  template <element T>
    requires requires(Cross& c, std::span<T> b) { c.recv(b, 0, 0); }
  void recv(std::span<T> buf, int src, int tag) {
    one_replica_per_worker("recv");
    g_->cross_.recv(buf, src, tag);
  }

  // A collective of every replica: the cross communicator's communicator of the replicas (workers) that
  // passed the same `color`. One replica per worker only.
  template <class C = Cross>
    requires requires(C& c) { c.split(0, 0); }
  auto split(int color, int key) {
    one_replica_per_worker("split");
    return g_->cross_.split(color, key);
  }

 private:
  // Replica ranks are worker ranks only when every worker holds one replica.
  void one_replica_per_worker(const char* what) const {
    if (local_.size() != 1)
      throw std::logic_error(
          std::string("distribute: ") + what +
          ": point-to-point between replicas of a multi-worker strategy needs one replica per worker; "
          "this worker has " +
          std::to_string(local_.size()));
    for (int w = 0; w < g_->num_workers(); ++w)
      if (g_->replicas_of(w) != 1)
        throw std::logic_error(
            std::string("distribute: ") + what +
            ": point-to-point between replicas of a multi-worker strategy needs one replica per worker; "
            "worker " +
            std::to_string(w) + " has " + std::to_string(g_->replicas_of(w)));
  }

  // Local replica 0 all-reduces every local replica's buffers with the other workers in one pass,
  // writing the result into each, while the others wait.
  template <element T>
  void reduce_by_first_replica(reduce_op op, std::span<const std::span<T>> bufs) {
    local_.all_reduce_by_first(op, bufs, [&](std::span<const std::span<const std::span<T>>> lists) {
      g_->cross_.all_reduce_each(op, lists, size());
    });
  }

  // Local replica 0 has published its result; the others copy it, and nobody leaves before every copy
  // is taken (the result lives in local replica 0's buffers). If local replica 0 failed, the first
  // meeting fails at once (the strategy aborts the group).
  template <class Copy>
  void fan_out(Copy&& copy) {
    if (local_.size() == 1) return;
    local_.barrier();
    if (local_.rank() != 0) copy(g_->published_[0]);
    local_.barrier();
  }

  hierarchical_group<Cross>* g_;
  shared_memory local_;
};

template <class Cross>
inline hierarchical<Cross> hierarchical_group<Cross>::endpoint(int local_rank) {
  return hierarchical<Cross>(*this, local_rank);
}

// A communicator over any communicator of the workers (the strategy's is comm::mpi; shared memory
// stands in here, where MPI may not be included).
static_assert(distribute::point_to_point_communicator<hierarchical<shared_memory>>);

}  // namespace distribute::comm
