#pragma once
// The NCCL communicators of one process's GPU replicas, one per device: `nccl_group`, part of
// cuda/comm/nccl.cuh (which defines `nccl_group::endpoint`: include that header, not this one). The
// group makes its communicators in one NCCL group call and waits for them against a deadline of at
// least `init_timeout`, so that a process that never joins is a collective_timeout instead of a hang.
// After a failure the communicators are aborted; a group of one process makes new ones in
// `rebuild()`, one spanning processes cannot, and says so.
//
// A replica whose collective fails in any way after NCCL took it (an NCCL error, a timeout, a CUDA
// error while waiting, a failed launch of what follows it) aborts its communicator before it throws,
// so that no NCCL kernel of it is left waiting for partners. Processes learn of a failure in another
// process through `watch_outside` (the multi-worker strategy's out-of-band notice over MPI), polled
// while a replica waits for NCCL.

#include <distribute/collective_options.hpp>
#include <distribute/cuda/comm/detail/cuda_kernels.cuh>
#include <distribute/cuda/comm/detail/gpu_meeting.hpp>
#include <distribute/cuda/comm/detail/nccl_calls.cuh>
#include <distribute/cuda/comm/detail/nccl_graphs.cuh>
#include <distribute/cuda/comm/detail/nccl_p2p.cuh>
#include <distribute/cuda/comm/detail/nccl_split_phase.cuh>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/memory.cuh>
#include <distribute/errors.hpp>

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace distribute::comm {

namespace detail {

// Communicators whose calls return at once (ncclInProgress) and complete in the background, so that
// their callers can poll them against a deadline.
inline ncclConfig_t nonblocking_config() {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  return config;
}

}  // namespace detail

class nccl;

// The NCCL communicators of this process's GPU replicas, one per device (devices must be distinct).
class nccl_group {
 public:
  // One process: ranks 0 .. devices.size()-1, bootstrapped here.
  explicit nccl_group(std::vector<cuda> devices, collective_options options = {})
      : nccl_group(std::move(devices), new_unique_id(), 0, -1, options, /*owns_bootstrap=*/true) {}

  // Several processes: this process's devices are ranks first_rank .. first_rank+devices.size()-1 of
  // `world`, and every process passes the same `id` (made by one of them with `new_unique_id()`).
  nccl_group(std::vector<cuda> devices, const ncclUniqueId& id, int first_rank, int world,
             collective_options options = {})
      : nccl_group(std::move(devices), id, first_rank, world, options, /*owns_bootstrap=*/false) {}

  nccl_group(const nccl_group&) = delete;
  nccl_group& operator=(const nccl_group&) = delete;
  ~nccl_group() { destroy(/*graceful=*/!broken_); }

  // The least time communicator creation is given, whatever the collective timeout.
  static constexpr std::chrono::milliseconds init_timeout = std::chrono::minutes(2);

  static ncclUniqueId new_unique_id() {
    ncclUniqueId id;
    detail::nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
    return id;
  }

  int local_size() const noexcept { return static_cast<int>(devices_.size()); }
  int world_size() const noexcept { return world_; }
  int first_rank() const noexcept { return first_; }
  const cuda& device(int local) const { return devices_[static_cast<std::size_t>(local)]; }
  ncclComm_t native_handle(int local) const { return comms_[static_cast<std::size_t>(local)]; }
  inline nccl endpoint(int local);

  detail::gpu_meeting& meeting() noexcept { return meeting_; }
  const collective_options& options() const noexcept { return meeting_.options(); }
  void set_options(collective_options o) noexcept { meeting_.set_options(o); }

  // Aborts every local communicator after a failure elsewhere in the step (a worker leaving the
  // job): partners in other processes then fail at once instead of at their deadline.
  void abort_all_for_failure() noexcept {
    mark_broken();
    abort_all();
  }

  // Aborts local replica `local`'s communicator (from that replica's thread): an NCCL kernel of it
  // still waiting for partners after a failure then ends.
  void abort_replica(int local) noexcept {
    mark_broken();
    destroy_graphs(local);
    auto& c = comms_[static_cast<std::size_t>(local)];
    if (c != nullptr) (void)ncclCommAbort(c);
    c = nullptr;
  }

  // CUDA graphs that captured operations of local replica `local`'s communicator, destroyed before
  // it goes (detail/nccl_graphs.cuh says why).
  void hold_graph(int local, std::weak_ptr<std::function<void()>> destroy) { graphs_.hold(local, std::move(destroy)); }

  // A failure outside this process: `watch()` returns what failed (a worker, and why), or nothing
  // while all is well. Replicas waiting for NCCL call it (at most once a millisecond, from any of
  // their threads: it must be thread-safe); once it reports, this process's replicas give up their
  // collectives with collective_aborted naming that failure, at once instead of at their deadline.
  void set_outside_watch(std::function<std::optional<std::string>()> watch) { outside_ = std::move(watch); }
  void watch_outside() {
    if (!outside_ || meeting_.aborted()) return;
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    if (now < next_outside_poll_.load(std::memory_order_relaxed)) return;
    next_outside_poll_.store(
        now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::milliseconds(1)).count(),
        std::memory_order_relaxed);
    if (auto why = outside_()) {
      const collective_aborted error("distribute: " + *why);
      meeting_.abort(std::make_exception_ptr(error), *why);
    }
  }

  // Counts the communicators made (rebuild makes new ones): a CUDA graph that captured NCCL
  // operations holds those of the communicators of its capture, and must not be replayed after.
  std::uint64_t generation() const noexcept { return generation_.load(std::memory_order_acquire); }

  // Whether a failure aborted the communicators; collectives then fail until `rebuild()`.
  bool broken() const noexcept { return broken_.load(std::memory_order_acquire); }
  // Replaces aborted communicators with new ones (this process's group only; between steps).
  void rebuild() {
    if (!broken()) return;
    // A group spanning processes needs every process to agree on a new id; one process alone (a
    // single worker) makes its own.
    if (!owns_bootstrap_ && world_ != local_size())
      throw collective_aborted(
          "distribute: the NCCL communicators spanning processes were aborted after a failure and "
          "cannot be rebuilt by one process; create the strategy again on every worker");
    destroy(/*graceful=*/false);
    // Messages of the failed step do not go out on the new communicators.
    for (auto& p : pending_) p.clear();
    for (auto& i : issued_) i.clear();
    captured_.assign(devices_.size(), 0);
    init(new_unique_id());
  }

 private:
  friend class nccl;

  nccl_group(std::vector<cuda> devices, const ncclUniqueId& id, int first_rank, int world, collective_options options,
             bool owns_bootstrap)
      : devices_{check(std::move(devices))},
        first_{first_rank},
        world_{world < 0 ? static_cast<int>(devices_.size()) : world},
        owns_bootstrap_{owns_bootstrap},
        meeting_{static_cast<int>(devices_.size()), options, first_rank} {
    if (first_ < 0 || first_ + local_size() > world_)
      throw std::invalid_argument("distribute: NCCL ranks " + std::to_string(first_) + ".." +
                                  std::to_string(first_ + local_size() - 1) + " do not fit a world of " +
                                  std::to_string(world_));
    for (const auto& d : devices_) {
      staging_.emplace_back(d.index());
      flags_.emplace_back(d.index(), sizeof(int));
      headers_.emplace_back(d.index(), sizeof(detail::nccl_p2p_header));
    }
    pending_.resize(devices_.size());
    issued_.resize(devices_.size());
    sides_.resize(devices_.size());
    captured_.assign(devices_.size(), 0);
    graphs_.resize(devices_.size());
    init(id);
  }

  static std::vector<cuda> check(std::vector<cuda> devices) {
    if (devices.empty()) throw std::invalid_argument("distribute: an NCCL group needs at least one device");
    std::set<int> seen;
    for (const auto& d : devices)
      if (!seen.insert(d.index()).second)
        throw std::invalid_argument("distribute: NCCL takes one rank per GPU, and " + d.name() +
                                    " appears twice (use cuda_peer for several replicas on one GPU)");
    return devices;
  }

  // Creates every local communicator in one group call and waits, against the deadline, until all
  // are ready: a process that never joins makes this a collective_timeout, not a hang.
  void init(const ncclUniqueId& id) {
    comms_.assign(devices_.size(), nullptr);
    ncclConfig_t config = detail::nonblocking_config();
    detail::nccl_check(ncclGroupStart(), "ncclGroupStart");
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      distribute::detail::device_guard g(devices_[i].index());
      const ncclResult_t rc = ncclCommInitRankConfig(&comms_[i], world_, id, first_ + static_cast<int>(i), &config);
      if (rc != ncclSuccess && rc != ncclInProgress) {
        (void)ncclGroupEnd();
        abort_all();
        detail::nccl_check(rc, "ncclCommInitRankConfig");
      }
    }
    const ncclResult_t rc = ncclGroupEnd();
    if (rc != ncclSuccess && rc != ncclInProgress) {
      abort_all();
      detail::nccl_check(rc, "ncclGroupEnd (communicator creation)");
    }
    // Setting up takes NCCL up to seconds (more across nodes): a short collective timeout, chosen for
    // a step's collectives, must not fail it.
    const auto limit = std::max<std::chrono::milliseconds>(meeting_.options().timeout, init_timeout);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    for (std::size_t i = 0; i < comms_.size(); ++i) {
      for (auto pause = std::chrono::microseconds(50);; pause = std::min(pause * 2, std::chrono::microseconds(10000))) {
        ncclResult_t state = ncclSuccess;
        const ncclResult_t q = ncclCommGetAsyncError(comms_[i], &state);
        if (q != ncclSuccess) state = q;
        if (state == ncclSuccess) break;
        if (state != ncclInProgress) {
          const std::string msg = detail::nccl_message(state, "creating the NCCL communicator", comms_[i]);
          abort_all();
          throw nccl_error(state, msg + " on " + devices_[i].name());
        }
        if (std::chrono::steady_clock::now() >= deadline) {
          abort_all();
          throw collective_timeout("distribute: creating the NCCL communicators of ranks " + std::to_string(first_) +
                                   ".." + std::to_string(first_ + local_size() - 1) + " of " + std::to_string(world_) +
                                   " timed out after " + std::to_string(limit.count()) +
                                   " ms (did every worker start and reach the strategy's construction?)");
        }
        std::this_thread::sleep_for(pause);
      }
    }
    broken_.store(false, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }

  void mark_broken() noexcept { broken_.store(true, std::memory_order_release); }

  // Destroys the graphs holding operations of local replica `local`'s communicator (hold_graph).
  void destroy_graphs(int local) noexcept { graphs_.destroy(local); }
  void destroy_all_graphs() noexcept { graphs_.destroy_all(); }

  void abort_all() noexcept {
    destroy_all_graphs();
    for (auto& c : comms_) {
      if (c != nullptr) (void)ncclCommAbort(c);
      c = nullptr;
    }
  }

  // Flushes and destroys the communicators; gives up on flushing after a while (then aborts).
  void destroy(bool graceful) noexcept {
    destroy_all_graphs();  // before finalising: NCCL waits for them
    if (graceful) {
      // One thread finalising several communicators of one clique: in one group, so that their
      // flushes progress together.
      std::vector<bool> finalizing(comms_.size(), false);
      (void)ncclGroupStart();
      for (std::size_t i = 0; i < comms_.size(); ++i) {
        if (comms_[i] == nullptr) continue;
        const ncclResult_t rc = ncclCommFinalize(comms_[i]);
        finalizing[i] = rc == ncclSuccess || rc == ncclInProgress;
      }
      (void)ncclGroupEnd();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      for (std::size_t i = 0; i < comms_.size(); ++i) {
        if (!finalizing[i]) continue;
        ncclResult_t state = ncclInProgress;
        while (ncclCommGetAsyncError(comms_[i], &state) == ncclSuccess && state == ncclInProgress &&
               std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        if (state == ncclSuccess && ncclCommDestroy(comms_[i]) == ncclSuccess) comms_[i] = nullptr;
      }
    }
    abort_all();
  }

  std::vector<cuda> devices_;
  int first_;
  int world_;
  bool owns_bootstrap_;
  detail::gpu_meeting meeting_;
  std::vector<detail::host_staging> staging_;
  std::vector<distribute::detail::device_allocation> flags_;    // the buffer of `barrier`
  std::vector<distribute::detail::device_allocation> headers_;  // where `recv` takes a message's header
  // Per local rank: sends not yet issued, and those issued by the group call in progress.
  std::vector<std::vector<detail::nccl_pending_send>> pending_;
  std::vector<std::vector<detail::nccl_pending_send>> issued_;
  // Per local rank: where its split-phase all-reduces run (made at the first one; detail/nccl_split_phase.cuh).
  std::vector<detail::nccl_side_stream> sides_;
  // Per local rank: collectives queued into a CUDA graph being captured, since take_captured.
  std::vector<std::size_t> captured_;
  std::vector<ncclComm_t> comms_;
  // Per local rank: the graphs that captured its communicator's operations (hold_graph).
  detail::nccl_graph_holds graphs_;
  std::atomic<bool> broken_{false};
  std::atomic<std::uint64_t> generation_{0};
  std::function<std::optional<std::string>()> outside_;
  std::atomic<std::chrono::steady_clock::rep> next_outside_poll_{0};
};

}  // namespace distribute::comm
