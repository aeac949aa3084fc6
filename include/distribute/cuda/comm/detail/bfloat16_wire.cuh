#pragma once
// Float buffers all-reduced through bfloat16 by a GPU communicator (gradient_reduction::compression;
// what it computes: comm/gradient_buckets.hpp). Buffers on the communicator's device are
// narrowed on a stream into one bfloat16 buffer from the stream's memory pool, all-reduced there by
// the communicator's own bfloat16 collective, widened back and the buffer freed, all in stream
// order (so inside a CUDA graph being captured too). Host buffers are narrowed on the host and
// all-reduced through the communicator's staging, as any host buffer.

#include <distribute/comm/gradient_buckets.hpp>
#include <distribute/config.hpp>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/half_conversions.cuh>
#include <distribute/cuda/tensor/tensor.cuh>
#include <distribute/reduce_op.hpp>

#if !DISTRIBUTE_HAS_CUDA
#  error "<distribute/cuda/comm/detail/bfloat16_wire.cuh> needs nvcc and the CUDA toolkit"
#endif

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/transform.h>

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>

namespace distribute::comm::detail {

// Where a bucket's buffers are: all on `device`, all in host memory, or neither (refused).
enum class bucket_place { device, host, mixed };
inline bucket_place place_of(std::span<const std::span<float>> bufs, int device) {
  bool on = false, off = false;
  for (const auto b : bufs) {
    if (b.empty()) continue;
    const auto where = distribute::detail::locate(b.data());
    (where.on_device && where.ordinal == device ? on : off) = true;
    if (where.on_device && where.ordinal != device)
      throw std::invalid_argument("distribute: a bfloat16 gradient all-reduce on GPU " + std::to_string(device) +
                                  " got a buffer on GPU " + std::to_string(where.ordinal));
  }
  return on && off ? bucket_place::mixed : on ? bucket_place::device : bucket_place::host;
}

// `bufs` (on the device) narrowed into one bfloat16 buffer on `stream`; `widen` writes it back.
class bfloat16_wire {
 public:
  bfloat16_wire(std::span<const std::span<float>> bufs, int device, cudaStream_t stream) : stream_{stream} {
    for (const auto b : bufs) size_ += b.size();
    memory_ = distribute::detail::device_allocation(device, size_ * sizeof(__nv_bfloat16), stream);
    std::size_t at = 0;
    for (const auto b : bufs) {
      thrust::transform(thrust::cuda::par_nosync.on(stream_), b.data(), b.data() + b.size(), data() + at,
                        distribute::detail::narrow_to<__nv_bfloat16>{});
      at += b.size();
    }
    distribute::detail::cuda_check(cudaGetLastError(), "narrowing gradients to bfloat16", device);
  }
  std::span<__nv_bfloat16> span() const noexcept { return {data(), size_}; }
  void widen(std::span<const std::span<float>> bufs) const {
    std::size_t at = 0;
    for (const auto b : bufs) {
      thrust::transform(thrust::cuda::par_nosync.on(stream_), data() + at, data() + at + b.size(), b.data(),
                        distribute::detail::widen_from<__nv_bfloat16>{});
      at += b.size();
    }
    distribute::detail::cuda_check(cudaGetLastError(), "widening gradients from bfloat16", memory_.ordinal());
  }

 private:
  __nv_bfloat16* data() const noexcept { return static_cast<__nv_bfloat16*>(memory_.get()); }
  cudaStream_t stream_;
  std::size_t size_ = 0;
  distribute::detail::device_allocation memory_;  // freed on the stream, after what was queued
};

// The blocking form for a communicator whose collectives run on `stream` of `device`.
template <class C>
void all_reduce_as_bfloat16(C& comm, reduce_op op, std::span<const std::span<float>> bufs, int device,
                            cudaStream_t stream) {
  switch (place_of(bufs, device)) {
    case bucket_place::host: return distribute::comm::all_reduce_narrowed_on_host<__nv_bfloat16>(comm, op, bufs);
    case bucket_place::mixed:
      throw std::invalid_argument(
          "distribute: a bfloat16 gradient all-reduce got a bucket of both device and host buffers "
          "on GPU " +
          std::to_string(device));
    case bucket_place::device: break;
  }
  const bfloat16_wire wire(bufs, device, stream);
  comm.all_reduce(op, wire.span());
  wire.widen(bufs);
}

}  // namespace distribute::comm::detail
