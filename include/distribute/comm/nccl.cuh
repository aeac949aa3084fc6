#pragma once
// Collectives over NCCL: one rank per GPU, in one process (the replica threads of
// mirrored_strategy<cuda>) or across processes (multi_worker_mirrored_strategy<cuda, nccl>, the
// unique id broadcast over MPI).
//
// NCCL waits on the GPU for its partners, so a partner that never comes would hang the caller. It
// cannot here: the communicators are non-blocking, and the caller polls `ncclCommGetAsyncError` and
// its stream against the group's deadline. A collective that does not complete in time, or whose
// group failed elsewhere, aborts the communicator (`ncclCommAbort`) and throws `collective_timeout`
// or `collective_aborted`; an NCCL error throws `nccl_error`. Within one process the replicas also
// meet on the host first (detail/gpu_meeting.cuh), so that replicas calling different collectives
// get `collective_mismatch` before anything is queued on a GPU. An aborted group of one process is
// rebuilt by `rebuild()`; one spanning processes cannot be, and says so.
//
// Buffers are spans of device memory on the replica's GPU, used in place, or of host memory, staged
// through the device. Every collective has completed when it returns. `mean` has the bits of a sum
// followed by one division, as in every other engine of this library (NCCL's ncclAvg where that is
// exact, see detail::nccl_average_is_exact).
//
// A replica whose collective fails in any way after NCCL took it (an NCCL error, a timeout, a CUDA
// error while waiting, a failed launch of what follows it) aborts its communicator before it throws,
// so that no NCCL kernel of it is left waiting for partners. Processes learn of a failure in another
// process through `watch_outside` (the multi-worker strategy's out-of-band notice over MPI), polled
// while a replica waits for NCCL.
//
// Split phase, for the gradient all-reduce overlapped with backward (comm/detail/gradient_overlap.hpp):
// `start_all_reduce(op, bufs)` queues an all-reduce of device buffers on the replica's communication
// stream (one per replica, made at its first use), behind an event recorded on its compute stream, and
// returns once NCCL has queued it: the compute stream goes on with backward while NCCL runs beside it.
// `finish_started()` waits, polling errors and the deadline as every collective does, until everything
// started has completed. In between, the buffers belong to NCCL. Started all-reduces and the other
// collectives of the communicator run in the order they were called (NCCL needs one order on every
// rank): any other collective, point-to-point call or flush first finishes what was started.
// `abandon_started()` (a replica leaving its step by an exception) aborts the communicator if what was
// started has not completed, so that no NCCL kernel is left waiting for partners.
//
// Inside CUDA graphs (nn::graphed_step): while the replica's stream is being captured, a collective of
// device buffers is queued into the graph instead of being run. The replicas of this process still
// meet and compare it (at the capture); nothing waits for the GPU; `take_captured()` says how many
// were captured. A split-phase all-reduce goes into the graph in order, like any other. Host buffers,
// point-to-point calls and pending sends refuse with graph_capture_error. `replay_captured(n, launch)`
// launches such a graph as a collective: the replicas of this process meet first (a replica replaying
// a graph of another number of collectives, or calling something else, is a collective_mismatch; one
// that never comes, a timeout), then the replica waits for its stream with the deadline and the
// error polling of every collective, and a replay that does not finish in time aborts the
// communicator, so that no NCCL kernel of the graph waits forever.
//
// Point-to-point: `send(buf, dst, tag)` and `recv(buf, src, tag)` between two ranks, with ncclSend /
// ncclRecv on the replica's stream, time-bounded as the collectives are. NCCL's own send waits on
// the GPU until its receiver is there, so a send here is deferred instead, to keep the contract of
// the other engines that `send` never waits for its receiver:
// - `send` copies `buf` (the copy is taken before it returns) and returns without issuing anything.
//   This replica's pending sends are issued, in one NCCL group together with it, by its next `recv`,
//   collective, barrier or `flush()`, which then also waits until they are received (NCCL completes
//   a group as a whole). So two ranks that each send one message to the other and then receive one
//   do not deadlock (each one's send goes out with its receive), nor does a pipeline stage that
//   sends several messages forward before it receives one back. But:
//   * a rank that sends and then waits for something outside this communicator must call `flush()`
//     first, or its receiver waits for the message until the timeout; so must a rank that sends and
//     then calls a collective while its receiver is still in a receive for that message (the send
//     would go out only with the collective, which needs the receiver's collective first: within a
//     process the replicas meet before issuing, and NCCL runs a group's collective before its sends);
//   * a receive returns only once the receivers of this replica's pending sends have received them:
//     two ranks that each send the other two messages and then receive two wait for each other
//     (each one's first receive waits for its second message to be received) until the timeout.
//     MPI and shared memory have neither restriction.
// - NCCL has no tags: the messages between two ranks are received in the order they were sent. The
//   tag (0 <= tag < tag_limit), element type and count travel ahead of the data and are checked on
//   arrival: a receive that meets a message with another tag or element type throws
//   `collective_mismatch` naming both ends. A different count can leave NCCL waiting for data that
//   never comes: it is then reported as a timeout. Either failure, or a receive that times out,
//   aborts the communicator, as a failed collective does.

#include <distribute/collective_options.hpp>
#include <distribute/comm/detail/bfloat16_wire.cuh>
#include <distribute/comm/detail/check.hpp>
#include <distribute/comm/detail/cuda_kernels.cuh>
#include <distribute/comm/detail/gpu_meeting.cuh>
#include <distribute/comm/detail/nccl_p2p.cuh>
#include <distribute/config.hpp>
#include <distribute/device/cuda.cuh>
#include <distribute/device/cuda_graph.cuh>
#include <distribute/dtype.hpp>
#include <distribute/errors.hpp>
#include <distribute/reduce_op.hpp>

#if !DISTRIBUTE_HAS_NCCL
#  error "<distribute/comm/nccl.cuh> needs <nccl.h> (NCCL; link distribute::cuda, which links NCCL::NCCL when found)"
#endif

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace distribute {

// An NCCL call failed (other than by the time-outs and aborts every engine reports).
struct nccl_error : collective_error {
  nccl_error(ncclResult_t code, const std::string& what) : collective_error(what), code_{code} {}
  ncclResult_t code() const noexcept { return code_; }

 private:
  ncclResult_t code_;
};

namespace comm {

namespace detail {

inline std::string nccl_message(ncclResult_t rc, const char* call, ncclComm_t comm) {
  std::string msg = std::string("distribute: ") + call + " failed: " + ncclGetErrorString(rc);
  if (comm != nullptr) {
    if (const char* last = ncclGetLastError(comm); last != nullptr && *last != '\0') msg += std::string(" (") + last + ")";
  }
  return msg;
}

// ncclInProgress is not an error: a non-blocking communicator finishes the call in the background.
inline ncclResult_t nccl_check(ncclResult_t rc, const char* call, ncclComm_t comm = nullptr) {
  if (rc != ncclSuccess && rc != ncclInProgress) throw nccl_error(rc, nccl_message(rc, call, comm));
  return rc;
}

template <class T>
constexpr ncclDataType_t nccl_type() noexcept {
  switch (dtype_of<T>) {
    case dtype::float32: return ncclFloat32;
    case dtype::float64: return ncclFloat64;
    case dtype::int32: return ncclInt32;
    case dtype::int64: return ncclInt64;
    case dtype::float16: return ncclFloat16;
    case dtype::bfloat16: return ncclBfloat16;
  }
  return ncclFloat32;
}

// `mean`: NCCL's ncclAvg where it gives the same bits as a sum followed by one division (what every
// other engine of this library computes), else NCCL's sum and our division. ncclAvg multiplies every
// input by 1/n before summing (floating point): with n a power of two that scaling is exact and
// commutes with each rounding of the sum, so the result is the sum divided by n, bit for bit, unless
// scaled values fall below the normal range (float16's starts at 6e-5, too near gradients' values:
// float16 keeps the division). Integers are always summed and divided (NCCL's average is for
// unsigned integers only).
template <class T>
constexpr bool nccl_average_is_exact(int ranks) noexcept {
  const bool power_of_two = ranks > 0 && (ranks & (ranks - 1)) == 0;
  const dtype t = dtype_of<T>;
  return power_of_two && (t == dtype::float32 || t == dtype::float64 || t == dtype::bfloat16);
}

template <class T>
constexpr ncclRedOp_t nccl_op(reduce_op op, int ranks) noexcept {
  switch (op) {
    case reduce_op::sum: return ncclSum;
    case reduce_op::mean: return nccl_average_is_exact<T>(ranks) ? ncclAvg : ncclSum;
    case reduce_op::prod: return ncclProd;
    case reduce_op::min: return ncclMin;
    case reduce_op::max: return ncclMax;
  }
  return ncclSum;
}

// Whether a mean still needs our division after NCCL.
template <class T>
constexpr bool divide_after_nccl(reduce_op op, int ranks) noexcept {
  return op == reduce_op::mean && ranks > 1 && !nccl_average_is_exact<T>(ranks);
}

// A replica's communication stream for split-phase all-reduces, the event that orders each of them
// after the compute stream's work, and how many were started and not yet finished.
struct nccl_side_stream {
  distribute::detail::owned_stream stream;
  cudaEvent_t ready = nullptr;
  std::size_t started = 0;

  nccl_side_stream() = default;
  nccl_side_stream(nccl_side_stream&& o) noexcept
      : stream{std::move(o.stream)}, ready{std::exchange(o.ready, nullptr)}, started{o.started} {}
  nccl_side_stream& operator=(nccl_side_stream&&) = delete;
  ~nccl_side_stream() {
    if (ready != nullptr) (void)cudaEventDestroy(ready);
  }
  void open(int ordinal) {
    if (ready != nullptr) return;
    distribute::detail::device_guard g(ordinal);
    distribute::detail::owned_stream s(ordinal);
    distribute::detail::cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreateWithFlags", ordinal);
    stream = std::move(s);
  }
};

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
  nccl_group(std::vector<cuda> devices, const ncclUniqueId& id, int first_rank, int world, collective_options options = {})
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

  // CUDA graphs that captured operations of local replica `local`'s communicator. NCCL does not let
  // a communicator go (ncclCommAbort, ncclCommDestroy) while a graph that captured its operations
  // exists: it waits for those graphs to be destroyed, which would be forever for a graph its owner
  // keeps. So they are destroyed first, by `destroy()`, held here as a weak reference (the owner
  // dropping its graph, or going away, ends it).
  void hold_graph(int local, std::weak_ptr<std::function<void()>> destroy) {
    const std::lock_guard lock{graphs_m_};
    auto& held = graphs_[static_cast<std::size_t>(local)];
    std::erase_if(held, [](const auto& w) { return w.expired(); });
    held.push_back(std::move(destroy));
  }

  // A failure outside this process: `watch()` returns what failed (a worker, and why), or nothing
  // while all is well. Replicas waiting for NCCL call it (at most once a millisecond, from any of
  // their threads: it must be thread-safe); once it reports, this process's replicas give up their
  // collectives with collective_aborted naming that failure, at once instead of at their deadline.
  void set_outside_watch(std::function<std::optional<std::string>()> watch) { outside_ = std::move(watch); }
  void watch_outside() {
    if (!outside_ || meeting_.aborted()) return;
    const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
    if (now < next_outside_poll_.load(std::memory_order_relaxed)) return;
    next_outside_poll_.store(now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::milliseconds(1)).count(),
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
      throw collective_aborted("distribute: the NCCL communicators spanning processes were aborted after a failure and "
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
                                  std::to_string(first_ + local_size() - 1) + " do not fit a world of " + std::to_string(world_));
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
          throw collective_timeout("distribute: creating the NCCL communicators of ranks " + std::to_string(first_) + ".." +
                                   std::to_string(first_ + local_size() - 1) + " of " + std::to_string(world_) +
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
  void destroy_graphs(int local) noexcept {
    std::vector<std::weak_ptr<std::function<void()>>> held;
    {
      const std::lock_guard lock{graphs_m_};
      held.swap(graphs_[static_cast<std::size_t>(local)]);
    }
    for (const auto& w : held) {
      if (const auto destroy = w.lock()) {
        try {
          (*destroy)();
        } catch (...) {
          // Destroying a graph does not throw; nothing to add to the failure being handled.
        }
      }
    }
  }

  void destroy_all_graphs() noexcept {
    for (std::size_t i = 0; i < comms_.size(); ++i) destroy_graphs(static_cast<int>(i));
  }

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
  std::vector<distribute::detail::device_allocation> flags_;  // the buffer of `barrier`
  std::vector<distribute::detail::device_allocation> headers_;  // where `recv` takes a message's header
  // Per local rank: sends not yet issued, and those issued by the group call in progress.
  std::vector<std::vector<detail::nccl_pending_send>> pending_;
  std::vector<std::vector<detail::nccl_pending_send>> issued_;
  // Per local rank: where its split-phase all-reduces run (made at the first one; see the top).
  std::vector<detail::nccl_side_stream> sides_;
  // Per local rank: collectives queued into a CUDA graph being captured, since take_captured.
  std::vector<std::size_t> captured_;
  std::vector<ncclComm_t> comms_;
  // Per local rank: the graphs that captured its communicator's operations (hold_graph).
  std::mutex graphs_m_;
  std::vector<std::vector<std::weak_ptr<std::function<void()>>>> graphs_;
  std::atomic<bool> broken_{false};
  std::atomic<std::uint64_t> generation_{0};
  std::function<std::optional<std::string>()> outside_;
  std::atomic<std::chrono::steady_clock::rep> next_outside_poll_{0};
};

// One GPU replica's endpoint of an `nccl_group`: rank() and size() count every replica in sync (of
// every process). Cheap to copy; the group must outlive it.
class nccl {
 public:
  // NCCL takes at most 2048 operations between ncclGroupStart and ncclGroupEnd.
  static constexpr std::size_t max_fused_buffers = 2048;

  nccl(nccl_group& group, int local) : g_{&group}, local_{local} {
    if (local < 0 || local >= group.local_size())
      throw std::invalid_argument("distribute: local rank " + std::to_string(local) + " is not in an NCCL group of " +
                                  std::to_string(group.local_size()) + " devices");
  }

  int rank() const noexcept { return g_->first_ + local_; }
  int size() const noexcept { return g_->world_; }
  const cuda& device() const { return g_->device(local_); }
  ncclComm_t native_handle() const { return g_->native_handle(local_); }

  template <element T>
  void all_reduce(reduce_op op, std::span<T> buf) {
    const std::span<T> one[1] = {buf};
    all_reduce(op, std::span<const std::span<T>>(one));
  }

  // Several buffers in one NCCL group call: NCCL fuses them.
  template <element T>
  void all_reduce(reduce_op op, std::span<const std::span<T>> bufs) {
    if (bufs.size() > max_fused_buffers)
      throw std::invalid_argument("distribute: an NCCL all_reduce fuses at most " + std::to_string(max_fused_buffers) +
                                  " buffers in one group call, got " + std::to_string(bufs.size()) +
                                  " (use smaller gradient buckets)");
    std::size_t total = 0;
    for (auto b : bufs) total += b.size();
    const auto guard = current();
    auto& st = staging();
    std::vector<detail::host_staging::buffer> where;
    where.reserve(bufs.size());
    for (auto b : bufs) where.push_back({b.data(), b.size_bytes()});
    st.begin(where, stream(), "all_reduce");
    std::vector<detail::segment> segs;
    segs.reserve(bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) segs.push_back({st.stage(i, true, true, stream()), bufs[i].size()});
    detail::descriptor d{.kind = detail::collective_kind::all_reduce, .type = dtype_of<T>, .op = op, .count = total,
                         .segs = segs.data(), .n_segs = segs.size()};
    collective(
        d,
        [&] {
          for (const auto& s : segs)
            if (s.size != 0)
              detail::nccl_check(ncclAllReduce(s.data, s.data, s.size, detail::nccl_type<T>(), detail::nccl_op<T>(op, size()), comm(),
                                               stream()),
                                 "ncclAllReduce", comm());
        },
        [&] {
          if (detail::divide_after_nccl<T>(op, size()))
            for (const auto& s : segs) detail::launch_divide(static_cast<T*>(s.data), s.size, size(), device().index(), stream());
        });
  }

  // --- split phase (see the top of this file) ---

  // Starts the all-reduce of `bufs` on this replica's communication stream, after the work queued on
  // its compute stream so far, and returns once NCCL has queued it. Buffers in host memory cannot wait
  // on a stream: such a call finishes what was started and all-reduces them at once.
  template <element T>
  void start_all_reduce(reduce_op op, std::span<const std::span<T>> bufs) {
    if (!can_start(bufs)) {
      finish_started();
      all_reduce(op, bufs);
      return;
    }
    const auto guard = current();
    const cudaStream_t s = side_after_compute();
    std::vector<detail::segment> segs;
    segs.reserve(bufs.size());
    for (auto b : bufs) segs.push_back({static_cast<void*>(b.data()), b.size()});
    start_on_side<T>(op, segs, s);
  }

  // Float buffers all-reduced as bfloat16 (gradient_reduction::compression): narrowed on the
  // replica's stream into one buffer of the stream's memory pool, all-reduced by NCCL in bfloat16
  // (NCCL rounds each partial sum to bfloat16), widened back. Host buffers go through the host.
  void all_reduce_as_bfloat16(reduce_op op, std::span<const std::span<float>> bufs) {
    detail::all_reduce_as_bfloat16(*this, op, bufs, device().index(), stream());
  }
  // The same, started on the communication stream (narrowing, all-reduce and widening all there).
  void start_all_reduce_as_bfloat16(reduce_op op, std::span<const std::span<float>> bufs) {
    if (!can_start(bufs)) {
      finish_started();
      all_reduce_as_bfloat16(op, bufs);
      return;
    }
    const auto guard = current();
    const cudaStream_t s = side_after_compute();
    const detail::bfloat16_wire wire(bufs, device().index(), s);
    const auto w = wire.span();
    const detail::segment seg{static_cast<void*>(w.data()), w.size()};
    start_on_side<__nv_bfloat16>(op, std::span<const detail::segment>(&seg, 1), s);
    wire.widen(bufs);
  }

  // Waits until every all-reduce this replica started has completed; a failure, another replica's
  // failure, or the deadline (the group's timeout from this call) throws, as a collective does.
  void finish_started() {
    auto& side = g_->sides_[static_cast<std::size_t>(local_)];
    if (side.started == 0) return;
    const std::size_t started = std::exchange(side.started, 0);
    const auto guard = current();
    auto& meeting = g_->meeting_;
    const auto deadline = std::chrono::steady_clock::now() + meeting.options().timeout;
    const std::string what = std::to_string(started) + " all-reduce" + (started == 1 ? "" : "s") + " started on replica " +
                             std::to_string(rank()) + "'s communication stream (all_reduce_gradients, overlapped)";
    auto give_up = [&](bool timed_out) {
      abort_own();
      if (!timed_out)
        throw collective_aborted("distribute: " + what + " abandoned because " + meeting.abort_reason());
      meeting.fail_waiting(what, timeout_reason());
    };
    after_issue([&] {
      detail::wait_for_gpu(
          [&] {
            nccl_state([&] { return what; });
            return distribute::detail::stream_idle(side.stream.get(), device().index());
          },
          &meeting, deadline, give_up);
    });
  }

  // For a replica leaving its step by an exception: whatever it started and is not complete aborts
  // the communicator (the strategy rebuilds it, or says it cannot), so no NCCL kernel waits forever.
  void abandon_started() noexcept {
    auto& side = g_->sides_[static_cast<std::size_t>(local_)];
    if (std::exchange(side.started, 0) == 0) return;
    const distribute::detail::device_guard guard(device().index(), std::nothrow);
    const cudaError_t q = cudaStreamQuery(side.stream.get());
    (void)cudaGetLastError();
    if (q != cudaSuccess) abort_own();
  }

  // --- inside CUDA graphs (see the top of this file) ---

  // How many collectives were queued into a graph being captured since the last call.
  std::size_t take_captured() noexcept { return std::exchange(g_->captured_[static_cast<std::size_t>(local_)], 0); }
  // Which communicators a graph captured now would hold (nccl_group::generation).
  std::uint64_t generation() const noexcept { return g_->generation(); }
  // Registers a graph that holds this replica's captured collectives: `destroy` (kept as a weak
  // reference) is called before the communicator is aborted or destroyed (nccl_group::hold_graph).
  void hold_graph(std::weak_ptr<std::function<void()>> destroy) { g_->hold_graph(local_, std::move(destroy)); }

  // Launches, by `launch()` (queuing it on this replica's stream), a graph that holds `collectives`
  // captured collectives of this replica, and waits for it as for a collective.
  template <class Launch>
  void replay_captured(std::size_t collectives, Launch&& launch) {
    flush();
    finish_started();
    refuse_if_broken();
    const auto guard = current();
    const detail::descriptor d{.kind = detail::collective_kind::graph_replay, .count = collectives};
    const auto place = meet(d);
    auto give_up = [&](bool timed_out) { fail_collective(d, place.seq, timed_out); };
    auto what = [&] { return detail::describe(d); };
    after_issue([&] {
      launch();
      detail::wait_for_gpu([&] { return queued_work_done(what); }, &g_->meeting_, place.deadline, give_up);
    });
  }

  template <element T>
  void reduce_scatter(reduce_op op, std::span<const T> in, std::span<T> out) {
    detail::check_block_sizes("reduce_scatter", in.size(), out.size(), size());
    const auto guard = current();
    auto& st = staging();
    st.begin({{in.data(), in.size_bytes()}, {out.data(), out.size_bytes()}}, stream(), "reduce_scatter");
    const void* din = st.stage(0, true, false, stream());
    void* dout = st.stage(1, false, true, stream());
    detail::descriptor d{.kind = detail::collective_kind::reduce_scatter, .type = dtype_of<T>, .op = op,
                         .count = in.size(), .out_count = out.size(), .in = din, .out = dout};
    collective(
        d,
        [&] {
          if (!out.empty())
            detail::nccl_check(ncclReduceScatter(din, dout, out.size(), detail::nccl_type<T>(), detail::nccl_op<T>(op, size()), comm(),
                                                 stream()),
                               "ncclReduceScatter", comm());
        },
        [&] {
          if (detail::divide_after_nccl<T>(op, size()))
            detail::launch_divide(static_cast<T*>(dout), out.size(), size(), device().index(), stream());
        });
  }

  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    detail::check_block_sizes("all_gather", out.size(), in.size(), size());
    const auto guard = current();
    auto& st = staging();
    st.begin({{in.data(), in.size_bytes()}, {out.data(), out.size_bytes()}}, stream(), "all_gather");
    const void* din = st.stage(0, true, false, stream());
    void* dout = st.stage(1, false, true, stream());
    detail::descriptor d{.kind = detail::collective_kind::all_gather, .type = dtype_of<T>, .count = in.size(),
                         .out_count = out.size(), .in = din, .out = dout};
    collective(
        d,
        [&] {
          if (!in.empty())
            detail::nccl_check(ncclAllGather(din, dout, in.size(), detail::nccl_type<T>(), comm(), stream()), "ncclAllGather", comm());
        },
        [] {});
  }

  template <element T>
  void broadcast(std::span<T> buf, int root) {
    detail::check_root(root, size());
    const auto guard = current();
    auto& st = staging();
    st.begin({{buf.data(), buf.size_bytes()}}, stream(), "broadcast");
    detail::segment seg{st.stage(0, rank() == root, rank() != root, stream()), buf.size()};
    detail::descriptor d{.kind = detail::collective_kind::broadcast, .type = dtype_of<T>, .root = root,
                         .count = buf.size(), .segs = &seg, .n_segs = 1};
    collective(
        d,
        [&] {
          if (!buf.empty())
            detail::nccl_check(ncclBroadcast(seg.data, seg.data, buf.size(), detail::nccl_type<T>(), root, comm(), stream()),
                               "ncclBroadcast", comm());
        },
        [] {});
  }

  // A one-element all-reduce: every replica's queued work has finished before any leaves.
  void barrier() {
    const auto guard = current();
    int* flag = static_cast<int*>(g_->flags_[static_cast<std::size_t>(local_)].get());
    collective(
        detail::descriptor{.kind = detail::collective_kind::barrier},
        [&] { detail::nccl_check(ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, comm(), stream()), "ncclAllReduce (barrier)", comm()); },
        [] {});
  }

  // --- point-to-point (see the top of this file) ---

  static constexpr int tag_limit = 1 << 16;

  // Copies `buf` for rank `dst`, matched by `tag`; issued with this replica's next recv, collective,
  // barrier or flush.
  template <element T>
  void send(std::span<const T> buf, int dst, int tag) {
    check_p2p("send", dst, tag);
    refuse_in_capture("send (NCCL)");
    refuse_if_broken();
    const auto guard = current();
    auto& pending = g_->pending_[static_cast<std::size_t>(local_)];
    // Two operations each in one group call, with room for the operation that issues them.
    if (2 * (pending.size() + 1) + 2 > max_fused_buffers) flush();
    const auto header = detail::nccl_p2p_header::of<T>(tag, buf.size(), distribute::detail::current_origin);
    detail::nccl_pending_send m{dst, detail::nccl_type<T>(), buf.size(),
                                distribute::detail::device_allocation(device().index(),
                                                                      detail::nccl_p2p_data_offset + buf.size_bytes(), stream())};
    auto* base = static_cast<char*>(m.memory.get());
    // From pageable memory the copy has been taken when the call returns.
    distribute::detail::cuda_check(cudaMemcpyAsync(base, &header, sizeof header, cudaMemcpyHostToDevice, stream()),
                                   "cudaMemcpyAsync (send header)", device().index());
    if (!buf.empty()) {
      const auto where = distribute::detail::locate(buf.data());
      if (where.on_device && where.ordinal != device().index())
        throw std::invalid_argument("distribute: send on cuda:" + std::to_string(device().index()) +
                                    " got a buffer in the memory of cuda:" + std::to_string(where.ordinal));
      distribute::detail::cuda_check(cudaMemcpyAsync(base + detail::nccl_p2p_data_offset, buf.data(), buf.size_bytes(),
                                                     cudaMemcpyDefault, stream()),
                                     "cudaMemcpyAsync (send data)", device().index());
      // Host memory may be page-locked, and then copied later: the caller may reuse `buf` at once.
      if (!where.on_device)
        distribute::detail::cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize", device().index());
    }
    pending.push_back(std::move(m));
  }
  template <element T>
  void send(std::span<T> buf, int dst, int tag) {
    send(std::span<const T>(buf), dst, tag);
  }

  // Receives into `buf` the next message rank `src` sent to this rank, which must have `tag`, `buf`'s
  // element type and count; issues this replica's pending sends with it.
  template <element T>
  void recv(std::span<T> buf, int src, int tag) {
    check_p2p("recv", src, tag);
    refuse_in_capture("recv (NCCL)");
    refuse_if_broken();
    const auto guard = current();
    const auto mine = detail::nccl_p2p_header::of<T>(tag, buf.size(), distribute::detail::current_origin);
    const std::string me = "replica " + std::to_string(rank()), from = "replica " + std::to_string(src);
    auto& st = staging();
    st.begin({{buf.data(), buf.size_bytes()}}, stream(), "recv");
    void* data = st.stage(0, false, true, stream());
    void* header = g_->headers_[static_cast<std::size_t>(local_)].get();
    p2p(
        [&] {
          detail::nccl_check(ncclRecv(header, sizeof(detail::nccl_p2p_header), ncclInt8, src, comm(), stream()), "ncclRecv",
                             comm());
          if (!buf.empty())
            detail::nccl_check(ncclRecv(data, buf.size(), detail::nccl_type<T>(), src, comm(), stream()), "ncclRecv", comm());
        },
        [&] {
          return "distribute: " + me + " waited " + std::to_string(g_->meeting_.options().timeout.count()) +
                 " ms for a message from " + from + " (recv of " + mine.payload() + ", tag " + std::to_string(tag) +
                 mine.origin() + ") that was never sent, or was sent with another count; the NCCL communicator was aborted";
        });
    detail::nccl_p2p_header theirs;
    distribute::detail::cuda_check(cudaMemcpy(&theirs, header, sizeof theirs, cudaMemcpyDeviceToHost), "cudaMemcpy (recv header)",
                                   device().index());
    if (theirs.tag != mine.tag || theirs.type != mine.type || theirs.count != mine.count)
      p2p_failure(collective_mismatch("distribute: " + me + "'s recv of " + mine.payload() + " from " + from + " (tag " +
                                      std::to_string(tag) + ")" + mine.origin() + " met " + from + "'s send of " +
                                      theirs.payload() + " (tag " + std::to_string(theirs.tag) + ")" + theirs.origin() +
                                      " (NCCL delivers the messages of two ranks in the order they were sent, whatever "
                                      "their tags); the NCCL communicator was aborted"));
    if (staging().finish(stream()))
      distribute::detail::cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize", device().index());
  }

  // Issues this replica's pending sends and waits, within the timeout, until they are received.
  void flush() {
    if (g_->pending_[static_cast<std::size_t>(local_)].empty()) return;
    refuse_in_capture("flush (NCCL sends)");
    refuse_if_broken();
    const auto guard = current();
    p2p([] {}, [&] {
      return "distribute: replica " + std::to_string(rank()) + "'s sends were not received within " +
             std::to_string(g_->meeting_.options().timeout.count()) + " ms; the NCCL communicator was aborted";
    });
  }

 private:
  void check_p2p(const char* what, int peer, int tag) const {
    if (tag < 0 || tag >= tag_limit)
      throw std::invalid_argument(std::string("distribute: ") + what + " on replica " + std::to_string(rank()) +
                                  " needs a tag 0 <= tag < " + std::to_string(tag_limit) + ", got " + std::to_string(tag));
    if (peer < 0 || peer >= size() || peer == rank())
      throw std::invalid_argument(std::string("distribute: ") + what + " on replica " + std::to_string(rank()) + " (tag " +
                                  std::to_string(tag) + ") names rank " + std::to_string(peer) +
                                  "; it must be another rank of this group (0.." + std::to_string(size() - 1) + ")");
  }

  // Point-to-point calls wait for their partner on the host: not inside a graph being captured.
  void refuse_in_capture(const char* what) const {
    distribute::detail::refuse_while_capturing(stream(), device().index(), what);
  }

  void refuse_if_broken() const {
    if (g_->broken())
      throw collective_aborted("distribute: the NCCL communicators were aborted by an earlier failure; " +
                               std::string(g_->owns_bootstrap_ ? "the strategy rebuilds them at its next step"
                                                               : "create the strategy again on every worker"));
  }

  // Issues this replica's pending sends inside the group call in progress.
  void issue_pending() {
    auto& pending = g_->pending_[static_cast<std::size_t>(local_)];
    auto& issued = g_->issued_[static_cast<std::size_t>(local_)];
    for (auto& m : pending) {
      auto* base = static_cast<char*>(m.memory.get());
      detail::nccl_check(ncclSend(base, sizeof(detail::nccl_p2p_header), ncclInt8, m.dst, comm(), stream()), "ncclSend", comm());
      if (m.count != 0)
        detail::nccl_check(ncclSend(base + detail::nccl_p2p_data_offset, m.count, m.type, m.dst, comm(), stream()), "ncclSend",
                           comm());
      issued.push_back(std::move(m));
    }
    pending.clear();
  }

  // A point-to-point failure aborts the communicator and fails this process's group, then this replica.
  template <class Error>
  [[noreturn]] void p2p_failure(const Error& error) {
    abort_own();
    g_->meeting_.abort(std::make_exception_ptr(error), error.what());
    throw error;
  }

  // Issues the pending sends and `issue`'s receives in one group call and waits, as `collective`
  // does but without meeting the other local replicas (a message is between two ranks only).
  template <class Issue, class TimedOut>
  void p2p(Issue&& issue, TimedOut&& timed_out) {
    finish_started();
    auto& meeting = g_->meeting_;
    const auto deadline = std::chrono::steady_clock::now() + meeting.options().timeout;
    auto give_up = [&](bool out_of_time) {
      if (out_of_time) p2p_failure(collective_timeout(timed_out()));
      abort_own();
      throw collective_aborted("distribute: point-to-point on replica " + std::to_string(rank()) + " was abandoned because " +
                               meeting.abort_reason());
    };
    issue_in_group(issue);
    after_issue([&] {
      auto what = [] { return std::string("point-to-point"); };
      detail::wait_for_gpu([&] { return nccl_state(what) == ncclSuccess; }, &meeting, deadline, give_up);
      detail::wait_for_gpu([&] { return queued_work_done(what); }, &meeting, deadline, give_up);
    });
    g_->issued_[static_cast<std::size_t>(local_)].clear();
  }

  // This replica's pending sends and `issue`'s operations in one NCCL group call. An NCCL error
  // aborts the communicator (the group is rebuilt at the next step) and fails the process's group.
  template <class Issue>
  void issue_in_group(Issue&& issue) {
    try {
      detail::nccl_check(ncclGroupStart(), "ncclGroupStart");
      try {
        issue_pending();
        issue();
      } catch (...) {
        (void)ncclGroupEnd();
        throw;
      }
      detail::nccl_check(ncclGroupEnd(), "ncclGroupEnd", comm());
    } catch (const nccl_error& e) {
      abort_own();
      g_->meeting_.abort(std::current_exception(), e.what());
      throw;
    }
  }

  // Runs what follows a successful ncclGroupEnd. Whatever fails there while this replica's
  // communicator is still alive (a CUDA error while waiting, a failed launch) may leave an NCCL kernel
  // waiting for its partners: the communicator is aborted and the group told, then the error goes on.
  template <class F>
  void after_issue(F&& f) {
    try {
      f();
    } catch (...) {
      if (comm() != nullptr) {
        abort_own();
        g_->meeting_.fail(local_, std::current_exception());
      }
      throw;
    }
  }

  void abort_own() noexcept {
    g_->mark_broken();
    g_->destroy_graphs(local_);
    if (comm() != nullptr) (void)ncclCommAbort(comm());
    g_->comms_[static_cast<std::size_t>(local_)] = nullptr;
  }

  // One poll of the wait for the stream: NCCL's state, another process's failure, then the stream.
  template <class What>
  bool queued_work_done(What&& what, cudaStream_t s) {
    nccl_state(what);
    return distribute::detail::stream_idle(s, device().index());
  }
  template <class What>
  bool queued_work_done(What&& what) {
    return queued_work_done(what, stream());
  }

  // Whether `bufs` can be started on the communication stream: device buffers of this replica's
  // GPU, nothing pending, the compute stream not being captured.
  template <element T>
  bool can_start(std::span<const std::span<T>> bufs) const {
    return bufs.size() <= max_fused_buffers && on_this_device(bufs) && g_->pending_[static_cast<std::size_t>(local_)].empty() &&
           !distribute::detail::stream_capturing(stream());
  }

  // This replica's communication stream, made to wait for the work queued on its compute stream.
  cudaStream_t side_after_compute() {
    auto& side = g_->sides_[static_cast<std::size_t>(local_)];
    side.open(device().index());
    distribute::detail::cuda_check(cudaEventRecord(side.ready, stream()), "cudaEventRecord", device().index());
    distribute::detail::cuda_check(cudaStreamWaitEvent(side.stream.get(), side.ready, 0), "cudaStreamWaitEvent", device().index());
    return side.stream.get();
  }

  // One started all-reduce of `segs` (of T, on this device) on the communication stream `s`.
  template <element T>
  void start_on_side(reduce_op op, std::span<const detail::segment> segs, cudaStream_t s) {
    std::size_t total = 0;
    for (const auto& seg : segs) total += seg.size;
    detail::descriptor d{.kind = detail::collective_kind::all_reduce, .type = dtype_of<T>, .op = op, .count = total,
                         .segs = segs.data(), .n_segs = segs.size()};
    collective(
        d, s, /*wait=*/false,
        [&] {
          for (const auto& seg : segs)
            if (seg.size != 0)
              detail::nccl_check(ncclAllReduce(seg.data, seg.data, seg.size, detail::nccl_type<T>(), detail::nccl_op<T>(op, size()),
                                               comm(), s),
                                 "ncclAllReduce", comm());
        },
        [&] {
          if (detail::divide_after_nccl<T>(op, size()))
            for (const auto& seg : segs) detail::launch_divide(static_cast<T*>(seg.data), seg.size, size(), device().index(), s);
        });
    ++g_->sides_[static_cast<std::size_t>(local_)].started;
  }

  template <element T>
  bool on_this_device(std::span<const std::span<T>> bufs) const {
    for (auto b : bufs) {
      if (b.empty()) continue;
      const auto where = distribute::detail::locate(b.data());
      if (!where.on_device || where.ordinal != device().index()) return false;
    }
    return true;
  }

  // The communicator's asynchronous state; an NCCL error aborts it and fails the group.
  // `what()` names the operation, for the message.
  template <class What>
  ncclResult_t nccl_state(What&& what) {
    g_->watch_outside();
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = ncclCommGetAsyncError(comm(), &state);
    if (q != ncclSuccess) state = q;
    if (state != ncclSuccess && state != ncclInProgress) {
      const std::string msg = detail::nccl_message(state, what().c_str(), comm());
      abort_own();
      const nccl_error error(state, msg + " on replica " + std::to_string(rank()));
      g_->meeting_.abort(std::make_exception_ptr(error), error.what());
      throw error;
    }
    return state;
  }

  // Meets the other local replicas for `d`: its number in this step, and its deadline from now.
  struct meeting_place {
    std::uint64_t seq;
    std::chrono::steady_clock::time_point deadline;
  };
  meeting_place meet(const detail::descriptor& d) {
    auto& meeting = g_->meeting_;
    const std::uint64_t seq = meeting.meet(local_, d);
    return {seq, std::chrono::steady_clock::now() + meeting.options().timeout};
  }
  // Gives up collective `d` (number `seq`): aborts this replica's communicator, then throws
  // collective_aborted (another replica failed) or collective_timeout (the deadline passed).
  [[noreturn]] void fail_collective(const detail::descriptor& d, std::uint64_t seq, bool timed_out) {
    abort_own();
    if (!timed_out) g_->meeting_.fail_aborted(local_, d, seq);
    g_->meeting_.fail_waiting(local_, d, seq, timeout_reason());
  }

  // Why work queued for NCCL is given up at the deadline (after "<what> ").
  std::string timeout_reason() const {
    return "did not complete within " + std::to_string(g_->meeting_.options().timeout.count()) +
           " ms (a replica of another process may have failed, died, or called a different collective); the NCCL "
           "communicator was aborted";
  }

  ncclComm_t comm() const { return g_->comms_[static_cast<std::size_t>(local_)]; }
  detail::host_staging& staging() const noexcept { return g_->staging_[static_cast<std::size_t>(local_)]; }
  cudaStream_t stream() const { return device().stream(); }
  distribute::detail::device_guard current() const { return distribute::detail::device_guard(device().index()); }

  // Meet (in this process), issue, wait until NCCL has queued the work, queue what follows it, wait
  // until the stream has run it all; poll for errors and give up at the deadline throughout.
  template <class Issue, class Then>
  void collective(const detail::descriptor& d, Issue&& issue, Then&& then) {
    finish_started();
    collective(d, stream(), /*wait=*/true, issue, then);
  }
  // The same on `s`; without `wait`, returns once NCCL has queued the work and `then`'s (split phase).
  template <class Issue, class Then>
  void collective(const detail::descriptor& d, cudaStream_t s, bool wait, Issue&& issue, Then&& then) {
    refuse_if_broken();
    // Inside a graph being captured: queued into the graph, and nothing waits (see the top).
    const bool captured = distribute::detail::stream_capturing(s);
    if (captured && !g_->pending_[static_cast<std::size_t>(local_)].empty())
      throw graph_capture_error("distribute: replica " + std::to_string(rank()) + " called " + detail::describe(d) +
                                " inside a CUDA graph being captured with NCCL sends still pending; flush them first");
    auto& meeting = g_->meeting_;
    const auto place = meet(d);
    auto give_up = [&](bool timed_out) { fail_collective(d, place.seq, timed_out); };
    auto what = [&] { return detail::describe(d); };
    if (captured) wait = false;
    issue_in_group(issue);  // this replica's sends go out with it (see send)
    after_issue([&] {
      detail::wait_for_gpu([&] { return nccl_state(what) == ncclSuccess; }, &meeting, place.deadline, give_up);
      then();
      if (wait) detail::wait_for_gpu([&] { return queued_work_done(what, s); }, &meeting, place.deadline, give_up);
    });
    if (captured) ++g_->captured_[static_cast<std::size_t>(local_)];
    if (!wait) return;
    g_->issued_[static_cast<std::size_t>(local_)].clear();
    // Only now: a copy into pageable host memory blocks the host until the stream reaches it, which
    // must not be behind an NCCL kernel that may never finish.
    if (staging().finish(stream()))
      distribute::detail::cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize", device().index());
  }

  nccl_group* g_;
  int local_;
};

inline nccl nccl_group::endpoint(int local) { return nccl(*this, local); }

}  // namespace comm
}  // namespace distribute
