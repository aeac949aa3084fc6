#pragma once
// The split phase of the NCCL communicator (cuda/comm/nccl.cuh), for the gradient all-reduce
// overlapped with backward (comm/gradient_overlap.hpp): `start_all_reduce(op, bufs)` queues an
// all-reduce of device buffers on the replica's communication stream (one per replica, made at its
// first use), behind an event recorded on its compute stream, and returns once NCCL has queued it:
// the compute stream goes on with backward while NCCL runs beside it. `finish_started()` waits,
// polling errors and the deadline as every collective does, until everything started has completed.
// In between, the buffers belong to NCCL. Started all-reduces and the other collectives of the
// communicator run in the order they were called (NCCL needs one order on every rank): any other
// collective, point-to-point call or flush first finishes what was started. `abandon_started()` (a
// replica leaving its step by an exception) aborts the communicator if what was started has not
// completed, so that no NCCL kernel is left waiting for partners.
//
// Here: the replica's communication stream, and which buffers can be started on it (the members
// above are the communicator's).

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/dtype.hpp>

#include <cuda_runtime.h>

#include <cstddef>
#include <span>
#include <utility>

namespace distribute::comm::detail {

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
    distribute::detail::cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreateWithFlags",
                                   ordinal);
    stream = std::move(s);
  }
};

// Whether every non-empty buffer of `bufs` is device memory of GPU `ordinal` (host buffers cannot
// wait on a stream, and another GPU's are not this communicator's to all-reduce in place).
template <element T>
bool all_on_device(std::span<const std::span<T>> bufs, int ordinal) {
  for (auto b : bufs) {
    if (b.empty()) continue;
    const auto where = distribute::detail::locate(b.data());
    if (!where.on_device || where.ordinal != ordinal) return false;
  }
  return true;
}

}  // namespace distribute::comm::detail
