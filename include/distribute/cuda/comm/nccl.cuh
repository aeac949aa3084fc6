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
// meet on the host first (detail/gpu_meeting.hpp), so that replicas calling different collectives
// get `collective_mismatch` before anything is queued on a GPU. An aborted group of one process is
// rebuilt by `rebuild()`; one spanning processes cannot be, and says so.
//
// Buffers are spans of device memory on the replica's GPU, used in place, or of host memory, staged
// through the device. Every collective has completed when it returns. `mean` has the bits of a sum
// followed by one division, as in every other communicator of this library (NCCL's ncclAvg where that is
// exact, see detail/nccl_calls.cuh).
//
// The rest is told beside its code: the group of a process's communicators, how it is made,
// aborted after a failure and rebuilt (detail/nccl_group.cuh); the split phase of the gradient
// all-reduce overlapped with backward, `start_all_reduce` and `finish_started`
// (detail/nccl_split_phase.cuh); collectives captured into CUDA graphs and their replay
// (detail/nccl_graphs.cuh); and point-to-point, whose sends are deferred: a `send` goes out with the
// replica's next `recv`, collective, barrier or `flush()`, so a rank that sends and then waits for
// anything else must `flush()` first (detail/nccl_p2p.cuh).
//
// This header is over 600 lines because `nccl` is one class: its members share its private issue,
// wait and abort machinery, and what surrounds the class is in the detail headers named above.

#include <distribute/collective_options.hpp>
#include <distribute/comm/argument_checks.hpp>
#include <distribute/concepts/communicator.hpp>
#include <distribute/config.hpp>
#include <distribute/cuda/comm/detail/bfloat16_wire.cuh>
#include <distribute/cuda/comm/detail/cuda_kernels.cuh>
#include <distribute/cuda/comm/detail/gpu_meeting.hpp>
#include <distribute/cuda/comm/detail/nccl_calls.cuh>
#include <distribute/cuda/comm/detail/nccl_group.cuh>
#include <distribute/cuda/comm/detail/nccl_p2p.cuh>
#include <distribute/cuda/comm/detail/nccl_split_phase.cuh>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/graph.cuh>
#include <distribute/dtype.hpp>
#include <distribute/errors.hpp>
#include <distribute/reduce_op.hpp>

#if !DISTRIBUTE_HAS_NCCL
#  error \
      "<distribute/cuda/comm/nccl.cuh> needs <nccl.h> (NCCL; link distribute::cuda, which links NCCL::NCCL when found)"
#endif

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute {
namespace comm {

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
    detail::descriptor d{.kind = detail::collective_kind::all_reduce,
                         .type = dtype_of<T>,
                         .op = op,
                         .count = total,
                         .segs = segs.data(),
                         .n_segs = segs.size()};
    collective(
        d,
        [&] {
          for (const auto& s : segs)
            if (s.size != 0)
              detail::nccl_check(ncclAllReduce(s.data, s.data, s.size, detail::nccl_type<T>(),
                                               detail::nccl_op<T>(op, size()), comm(), stream()),
                                 "ncclAllReduce", comm());
        },
        [&] {
          if (detail::divide_after_nccl<T>(op, size()))
            for (const auto& s : segs)
              detail::launch_divide(static_cast<T*>(s.data), s.size, size(), device().index(), stream());
        });
  }

  // --- split phase (detail/nccl_split_phase.cuh) ---

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
    const std::string what = std::to_string(started) + " all-reduce" + (started == 1 ? "" : "s") +
                             " started on replica " + std::to_string(rank()) +
                             "'s communication stream (all_reduce_gradients, overlapped)";
    auto give_up = [&](bool timed_out) {
      abort_own();
      if (!timed_out) throw collective_aborted("distribute: " + what + " abandoned because " + meeting.abort_reason());
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

  // --- inside CUDA graphs (detail/nccl_graphs.cuh) ---

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
    check_block_sizes("reduce_scatter", in.size(), out.size(), size());
    const auto guard = current();
    auto& st = staging();
    st.begin({{in.data(), in.size_bytes()}, {out.data(), out.size_bytes()}}, stream(), "reduce_scatter");
    const void* din = st.stage(0, true, false, stream());
    void* dout = st.stage(1, false, true, stream());
    detail::descriptor d{.kind = detail::collective_kind::reduce_scatter,
                         .type = dtype_of<T>,
                         .op = op,
                         .count = in.size(),
                         .out_count = out.size(),
                         .in = din,
                         .out = dout};
    collective(
        d,
        [&] {
          if (!out.empty())
            detail::nccl_check(ncclReduceScatter(din, dout, out.size(), detail::nccl_type<T>(),
                                                 detail::nccl_op<T>(op, size()), comm(), stream()),
                               "ncclReduceScatter", comm());
        },
        [&] {
          if (detail::divide_after_nccl<T>(op, size()))
            detail::launch_divide(static_cast<T*>(dout), out.size(), size(), device().index(), stream());
        });
  }

  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    check_block_sizes("all_gather", out.size(), in.size(), size());
    const auto guard = current();
    auto& st = staging();
    st.begin({{in.data(), in.size_bytes()}, {out.data(), out.size_bytes()}}, stream(), "all_gather");
    const void* din = st.stage(0, true, false, stream());
    void* dout = st.stage(1, false, true, stream());
    detail::descriptor d{.kind = detail::collective_kind::all_gather,
                         .type = dtype_of<T>,
                         .count = in.size(),
                         .out_count = out.size(),
                         .in = din,
                         .out = dout};
    collective(
        d,
        [&] {
          if (!in.empty())
            detail::nccl_check(ncclAllGather(din, dout, in.size(), detail::nccl_type<T>(), comm(), stream()),
                               "ncclAllGather", comm());
        },
        [] {});
  }

  template <element T>
  void broadcast(std::span<T> buf, int root) {
    check_root(root, size());
    const auto guard = current();
    auto& st = staging();
    st.begin({{buf.data(), buf.size_bytes()}}, stream(), "broadcast");
    detail::segment seg{st.stage(0, rank() == root, rank() != root, stream()), buf.size()};
    detail::descriptor d{.kind = detail::collective_kind::broadcast,
                         .type = dtype_of<T>,
                         .root = root,
                         .count = buf.size(),
                         .segs = &seg,
                         .n_segs = 1};
    collective(
        d,
        [&] {
          if (!buf.empty())
            detail::nccl_check(
                ncclBroadcast(seg.data, seg.data, buf.size(), detail::nccl_type<T>(), root, comm(), stream()),
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
        [&] {
          detail::nccl_check(ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, comm(), stream()),
                             "ncclAllReduce (barrier)", comm());
        },
        [] {});
  }

  // --- point-to-point (detail/nccl_p2p.cuh) ---

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
    pending.push_back(detail::nccl_pending_send::copy_of(buf, dst, tag, device().index(), stream()));
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
          detail::nccl_check(ncclRecv(header, sizeof(detail::nccl_p2p_header), ncclInt8, src, comm(), stream()),
                             "ncclRecv", comm());
          if (!buf.empty())
            detail::nccl_check(ncclRecv(data, buf.size(), detail::nccl_type<T>(), src, comm(), stream()), "ncclRecv",
                               comm());
        },
        [&] {
          return "distribute: " + me + " waited " + std::to_string(g_->meeting_.options().timeout.count()) +
                 " ms for a message from " + from + " (recv of " + mine.payload() + ", tag " + std::to_string(tag) +
                 mine.origin() +
                 ") that was never sent, or was sent with another count; the NCCL communicator was aborted";
        });
    detail::nccl_p2p_header theirs;
    distribute::detail::cuda_check(cudaMemcpy(&theirs, header, sizeof theirs, cudaMemcpyDeviceToHost),
                                   "cudaMemcpy (recv header)", device().index());
    if (theirs.tag != mine.tag || theirs.type != mine.type || theirs.count != mine.count)
      p2p_failure(collective_mismatch("distribute: " + me + "'s recv of " + mine.payload() + " from " + from +
                                      " (tag " + std::to_string(tag) + ")" + mine.origin() + " met " + from +
                                      "'s send of " + theirs.payload() + " (tag " + std::to_string(theirs.tag) + ")" +
                                      theirs.origin() +
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
    p2p([] {},
        [&] {
          return "distribute: replica " + std::to_string(rank()) + "'s sends were not received within " +
                 std::to_string(g_->meeting_.options().timeout.count()) + " ms; the NCCL communicator was aborted";
        });
  }

 private:
  void check_p2p(const char* what, int peer, int tag) const {
    detail::check_p2p(what, rank(), size(), peer, tag, tag_limit);
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
    const auto local = static_cast<std::size_t>(local_);
    detail::issue_pending_sends(g_->pending_[local], g_->issued_[local], comm(), stream());
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
      throw collective_aborted("distribute: point-to-point on replica " + std::to_string(rank()) +
                               " was abandoned because " + meeting.abort_reason());
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
    return bufs.size() <= max_fused_buffers && detail::all_on_device(bufs, device().index()) &&
           g_->pending_[static_cast<std::size_t>(local_)].empty() && !distribute::detail::stream_capturing(stream());
  }

  // This replica's communication stream, made to wait for the work queued on its compute stream.
  cudaStream_t side_after_compute() {
    auto& side = g_->sides_[static_cast<std::size_t>(local_)];
    side.open(device().index());
    distribute::detail::cuda_check(cudaEventRecord(side.ready, stream()), "cudaEventRecord", device().index());
    distribute::detail::cuda_check(cudaStreamWaitEvent(side.stream.get(), side.ready, 0), "cudaStreamWaitEvent",
                                   device().index());
    return side.stream.get();
  }

  // One started all-reduce of `segs` (of T, on this device) on the communication stream `s`.
  template <element T>
  void start_on_side(reduce_op op, std::span<const detail::segment> segs, cudaStream_t s) {
    std::size_t total = 0;
    for (const auto& seg : segs) total += seg.size;
    detail::descriptor d{.kind = detail::collective_kind::all_reduce,
                         .type = dtype_of<T>,
                         .op = op,
                         .count = total,
                         .segs = segs.data(),
                         .n_segs = segs.size()};
    collective(
        d, s, /*wait=*/false,
        [&] {
          for (const auto& seg : segs)
            if (seg.size != 0)
              detail::nccl_check(ncclAllReduce(seg.data, seg.data, seg.size, detail::nccl_type<T>(),
                                               detail::nccl_op<T>(op, size()), comm(), s),
                                 "ncclAllReduce", comm());
        },
        [&] {
          if (detail::divide_after_nccl<T>(op, size()))
            for (const auto& seg : segs)
              detail::launch_divide(static_cast<T*>(seg.data), seg.size, size(), device().index(), s);
        });
    ++g_->sides_[static_cast<std::size_t>(local_)].started;
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
    // Inside a graph being captured: queued into the graph, and nothing waits (detail/nccl_graphs.cuh).
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

static_assert(distribute::communicator<nccl>);

inline nccl nccl_group::endpoint(int local) { return nccl(*this, local); }

}  // namespace comm
}  // namespace distribute
