#pragma once
// What the GPU communicators share: half-precision element types, the reduction kernel of `cuda_peer`, the
// division that finishes a mean, the staging of host buffers through device memory, and the wait for
// queued GPU work that gives up at a deadline instead of hanging.

#include <distribute/comm/detail/peer_reduction.hpp>
#include <distribute/cuda/comm/detail/gpu_meeting.hpp>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/graph.cuh>
#include <distribute/cuda/tensor/tensor.cuh>
#include <distribute/detail/backoff.hpp>
#include <distribute/dtype.hpp>
#include <distribute/reduce_op.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace distribute {

// Half precision joins the collective element types where CUDA defines it.
template <>
struct dtype_traits<__half> {
  static constexpr dtype value = dtype::float16;
};
template <>
struct dtype_traits<__nv_bfloat16> {
  static constexpr dtype value = dtype::bfloat16;
};

namespace comm::detail {

// The most replicas one `cuda_peer` kernel reduces over: their pointers travel as kernel parameters.
inline constexpr int max_peer_replicas = 32;
static_assert(max_peer_replicas <= max_tree_sources, "the reduction's tree must take every replica");

template <class T>
struct peer_pointers {
  const T* src[max_peer_replicas];
  T* dst[max_peer_replicas];
};

template <class T, reduce_op Op>
__device__ __forceinline__ T combine_on_device(T a, T b) {
  if constexpr (Op == reduce_op::sum || Op == reduce_op::mean) return a + b;
  else if constexpr (Op == reduce_op::prod) return a * b;
  else if constexpr (Op == reduce_op::min) return b < a ? b : a;
  else return a < b ? b : a;
}

template <class T, reduce_op Op>
__device__ __forceinline__ void reduce_element(const peer_pointers<T>& p, int n_src, int n_dst, std::size_t i) {
  T acc = tree_combine<T>([&](int r) { return p.src[r][i]; }, n_src,
                          [](T a, T b) { return combine_on_device<T, Op>(a, b); });
  if constexpr (Op == reduce_op::mean) acc = static_cast<T>(acc / static_cast<T>(n_src));
  for (int d = 0; d < n_dst; ++d) p.dst[d][i] = acc;
}

// Element i of the result is src[0][i], ..., src[n-1][i] combined in the shared-memory communicator's tree over rank
// order (comm/detail/peer_reduction.hpp), whichever thread computes it: the same bits on every
// replica, from run to run, and as the shared-memory communicator's. Works in 16-byte
// vectors when every pointer has the same offset from a 16-byte boundary: the first `head` elements
// (up to that boundary) and the tail are done one by one. Sources and destinations may be the same
// buffers: a thread reads all of its elements before writing them, and no other thread touches them.
template <class T, reduce_op Op>
__global__ void reduce_kernel(peer_pointers<T> p, int n_src, int n_dst, std::size_t count, std::size_t head,
                              bool vectorised) {
  constexpr int width = sizeof(T) >= 16 ? 1 : static_cast<int>(16 / sizeof(T));
  struct alignas(16) pack {
    T v[width];
  };
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (!vectorised) head = 0;
  const std::size_t packs = vectorised ? (count - head) / width : 0;
  for (std::size_t i = first; i < head; i += stride) reduce_element<T, Op>(p, n_src, n_dst, i);
  for (std::size_t i = first; i < packs; i += stride) {
    pack acc = tree_combine<pack>([&](int r) { return reinterpret_cast<const pack*>(p.src[r] + head)[i]; }, n_src,
                                  [](pack a, const pack& b) {
#pragma unroll
                                    for (int j = 0; j < width; ++j) a.v[j] = combine_on_device<T, Op>(a.v[j], b.v[j]);
                                    return a;
                                  });
    if constexpr (Op == reduce_op::mean) {
      const T n = static_cast<T>(n_src);
#pragma unroll
      for (int j = 0; j < width; ++j) acc.v[j] = static_cast<T>(acc.v[j] / n);
    }
    for (int d = 0; d < n_dst; ++d) reinterpret_cast<pack*>(p.dst[d] + head)[i] = acc;
  }
  for (std::size_t i = head + packs * width + first; i < count; i += stride) reduce_element<T, Op>(p, n_src, n_dst, i);
}

// How many leading elements the vector loop of `reduce_kernel` leaves to scalar code: the distance to
// the next 16-byte boundary, when every pointer is that far from one (and it is a whole number of
// elements); otherwise the loop cannot be used (returns count + 1, "not vectorised").
template <class T>
std::size_t vector_head(const std::uintptr_t* addresses, int n, std::size_t count) {
  const std::uintptr_t offset = addresses[0] % 16;
  for (int i = 1; i < n; ++i)
    if (addresses[i] % 16 != offset) return count + 1;
  if (offset % sizeof(T) != 0) return count + 1;
  return std::min<std::size_t>(count, (16 - offset) % 16 / sizeof(T));
}

// The final step of a mean done by a communicator that only sums (NCCL): once, on the complete sum.
template <class T>
__global__ void divide_kernel(T* data, std::size_t count, int n) {
  const T d = static_cast<T>(n);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    data[i] = static_cast<T>(data[i] / d);
}

// Enough blocks to keep every SM busy, no more than the work needs.
inline unsigned grid_for(std::size_t items, int ordinal) {
  static thread_local int cached_ordinal = -1, cached_sms = 0;
  if (cached_ordinal != ordinal) {
    int sms = 0;
    distribute::detail::cuda_check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal),
                                   "cudaDeviceGetAttribute", ordinal);
    cached_ordinal = ordinal;
    cached_sms = sms;
  }
  const std::size_t wanted = (items + 255) / 256;
  return static_cast<unsigned>(
      std::max<std::size_t>(1, std::min<std::size_t>(wanted, static_cast<std::size_t>(cached_sms) * 8)));
}

template <class T>
void launch_reduce(reduce_op op, const peer_pointers<T>& p, int n_src, int n_dst, std::size_t count, int ordinal,
                   cudaStream_t stream) {
  if (count == 0) return;
  std::uintptr_t addresses[2 * max_peer_replicas];
  int n = 0;
  for (int r = 0; r < n_src; ++r) addresses[n++] = reinterpret_cast<std::uintptr_t>(p.src[r]);
  for (int d = 0; d < n_dst; ++d) addresses[n++] = reinterpret_cast<std::uintptr_t>(p.dst[d]);
  const std::size_t head = vector_head<T>(addresses, n, count);
  const bool vectorised = head <= count;
  const unsigned grid =
      grid_for(vectorised ? head + (count - head) / std::max<std::size_t>(1, 16 / sizeof(T)) : count, ordinal);
  const std::size_t h = vectorised ? head : 0;
  switch (op) {
    case reduce_op::sum:
      reduce_kernel<T, reduce_op::sum><<<grid, 256, 0, stream>>>(p, n_src, n_dst, count, h, vectorised);
      break;
    case reduce_op::mean:
      reduce_kernel<T, reduce_op::mean><<<grid, 256, 0, stream>>>(p, n_src, n_dst, count, h, vectorised);
      break;
    case reduce_op::min:
      reduce_kernel<T, reduce_op::min><<<grid, 256, 0, stream>>>(p, n_src, n_dst, count, h, vectorised);
      break;
    case reduce_op::max:
      reduce_kernel<T, reduce_op::max><<<grid, 256, 0, stream>>>(p, n_src, n_dst, count, h, vectorised);
      break;
    case reduce_op::prod:
      reduce_kernel<T, reduce_op::prod><<<grid, 256, 0, stream>>>(p, n_src, n_dst, count, h, vectorised);
      break;
  }
  distribute::detail::cuda_check(cudaGetLastError(), "launching the cuda_peer reduction kernel", ordinal);
}

template <class T>
void launch_divide(T* data, std::size_t count, int n, int ordinal, cudaStream_t stream) {
  if (count == 0 || n == 1) return;
  divide_kernel<T><<<grid_for(count, ordinal), 256, 0, stream>>>(data, count, n);
  distribute::detail::cuda_check(cudaGetLastError(), "launching the mean division kernel", ordinal);
}

// A copy between two device buffers, possibly on different GPUs.
inline void copy_device(void* dst, int dst_ordinal, const void* src, int src_ordinal, std::size_t bytes,
                        cudaStream_t stream, int ordinal) {
  if (bytes == 0 || dst == src) return;
  if (dst_ordinal == src_ordinal)
    distribute::detail::cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream),
                                   "cudaMemcpyAsync", ordinal);
  else
    distribute::detail::cuda_check(cudaMemcpyPeerAsync(dst, dst_ordinal, src, src_ordinal, bytes, stream),
                                   "cudaMemcpyPeerAsync", ordinal);
}

// Host buffers handed to a GPU collective go through device scratch memory: copied in before, out
// after. Device buffers are used in place and must be on the replica's own GPU; they take no scratch.
// The scratch is allocated in the order of the replica's stream (no device-wide wait) and sized to
// the host bytes of the collective; up to `retained_limit` of it is kept for the next collectives,
// a larger need is met for one collective and handed back after it.
class host_staging {
 public:
  static constexpr std::size_t retained_limit = std::size_t{64} << 20;

  struct buffer {
    const void* data;
    std::size_t bytes;
  };

  explicit host_staging(int ordinal) : ordinal_{ordinal} {}

  // Before staging the buffers of one collective: finds where each lives (a device buffer on another
  // GPU is an std::invalid_argument naming `op`) and makes room, on `stream`, for those in host
  // memory (each starts on a 256-byte boundary, for the kernels' vector loads).
  void begin(std::span<const buffer> buffers, cudaStream_t stream, const char* op) {
    back_.clear();
    on_device_.clear();
    buffers_.assign(buffers.begin(), buffers.end());
    used_ = 0;
    once_ = {};
    std::size_t need = 0;
    for (const auto& b : buffers) {
      bool device = true;
      if (b.bytes != 0) {
        const auto where = distribute::detail::locate(b.data);
        device = where.on_device;
        if (device && where.ordinal != ordinal_)
          throw std::invalid_argument(std::string("distribute: ") + op + " on cuda:" + std::to_string(ordinal_) +
                                      " got a buffer in the memory of cuda:" + std::to_string(where.ordinal) +
                                      " (each replica passes buffers on its own GPU, or host memory)");
        if (!device) need += (b.bytes + 255) / 256 * 256;
      }
      on_device_.push_back(device);
    }
    if (need == 0) return;
    if (distribute::detail::stream_capturing(stream))
      throw graph_capture_error(std::string("distribute: ") + op + " on cuda:" + std::to_string(ordinal_) +
                                " was given host memory while its stream was being captured into a CUDA graph; a "
                                "collective inside a graph needs buffers in the memory of the replica's GPU");
    if (need > retained_limit) {
      once_ = distribute::detail::device_allocation(ordinal_, need, stream);
      return;
    }
    if (scratch_.bytes() < need)
      scratch_ = distribute::detail::device_allocation(
          ordinal_, std::min(retained_limit, std::max(need, scratch_.bytes() * 2)), stream);
  }
  void begin(std::initializer_list<buffer> buffers, cudaStream_t stream, const char* op) {
    begin(std::span<const buffer>(buffers.begin(), buffers.size()), stream, op);
  }

  // The device address to use for buffer `i` of `begin`: the buffer itself if it is on this GPU, else
  // a piece of scratch memory, filled from it if `in` and copied back to it by `finish` if `out`.
  void* stage(std::size_t i, bool in, bool out, cudaStream_t stream) {
    const buffer& b = buffers_[i];
    if (b.bytes == 0 || on_device_[i]) return const_cast<void*>(b.data);
    auto& area = once_.get() != nullptr ? once_ : scratch_;
    if (used_ + b.bytes > area.bytes())
      throw std::logic_error("distribute: host staging area sized too small for this collective");
    void* d = static_cast<char*>(area.get()) + used_;
    used_ += (b.bytes + 255) / 256 * 256;
    if (in)
      distribute::detail::cuda_check(cudaMemcpyAsync(d, b.data, b.bytes, cudaMemcpyHostToDevice, stream),
                                     "cudaMemcpyAsync (staging host buffer)", ordinal_);
    if (out) back_.push_back({const_cast<void*>(b.data), d, b.bytes});
    return d;
  }
  // Queues the copies back to host buffers; returns whether there were any (the caller then
  // synchronises the stream before the host reads them). Scratch beyond the retained limit is handed
  // back in stream order, after those copies.
  bool finish(cudaStream_t stream) {
    for (const auto& b : back_)
      distribute::detail::cuda_check(cudaMemcpyAsync(b.host, b.dev, b.bytes, cudaMemcpyDeviceToHost, stream),
                                     "cudaMemcpyAsync (unstaging host buffer)", ordinal_);
    const bool any = !back_.empty();
    back_.clear();
    once_ = {};
    return any;
  }

  // Device memory this staging keeps between collectives.
  std::size_t retained_bytes() const noexcept { return scratch_.bytes(); }

 private:
  struct copy_back {
    void* host;
    void* dev;
    std::size_t bytes;
  };
  int ordinal_;
  distribute::detail::device_allocation scratch_;
  distribute::detail::device_allocation once_;  // this collective's, when it needs more than the limit
  std::size_t used_ = 0;
  std::vector<buffer> buffers_;
  std::vector<bool> on_device_;
  std::vector<copy_back> back_;
};

// Waits for `done()` (which also reports errors by throwing), checking the group and the deadline:
// returns normally, or calls `give_up(timed_out)`, which must throw. It keeps the core (spinning,
// then yielding) for the first milliseconds, as cudaStreamSynchronize does, so that a collective
// returns within microseconds of finishing; only a long wait sleeps, in steps short against a
// large collective's time.
template <class Done, class GiveUp>
void wait_for_gpu(Done&& done, const gpu_meeting* meeting, std::chrono::steady_clock::time_point deadline,
                  GiveUp&& give_up) {
  if (distribute::detail::spin_then_yield(done, true, deadline)) return;
  auto check = [&] {
    if (meeting && meeting->aborted()) give_up(false);
    if (std::chrono::steady_clock::now() >= deadline) give_up(true);
  };
  const auto keep_core_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(5);
  while (std::chrono::steady_clock::now() < keep_core_until) {
    if (done()) return;
    check();
    std::this_thread::yield();
  }
  auto pause = std::chrono::microseconds(20);
  for (;;) {
    if (done()) return;
    check();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(100));
  }
}

}  // namespace comm::detail
}  // namespace distribute
