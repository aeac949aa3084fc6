#pragma once
// Device memory as the library allocates it: tensors, workspaces and scratch buffers.
//
// Memory made for a stream (a replica's tensors, a convolution's workspace) comes from a memory pool
// of the library's own on each GPU, allocated and freed in the stream's order
// (cudaMallocFromPoolAsync / cudaFreeAsync): neither call waits for the device. The pool keeps what is
// freed for reuse. The device's default pool, which cudaMallocAsync uses, gives its unused memory
// back to the driver at every synchronisation under its default release threshold (0): a training
// step that reads its loss on the host would then have the memory of its activations mapped afresh
// on every step. The library's pool has no release threshold, as PyTorch's caching allocator has
// none; it is the library's, not the device's default pool, so that the program's own
// cudaMallocAsync keeps the settings it chose.
//
// What the pool holds and does not use stays reserved for the library's allocations:
//   - `cuda_memory_usage(ordinal)` says how much is in use and reserved, and the high-water marks
//     (`cuda_reset_memory_peaks` starts them again);
//   - `cuda_release_cached_memory(ordinal)` waits for the device and gives back what is not in use
//     (PyTorch's torch.cuda.empty_cache), for memory the program needs elsewhere;
//   - an allocation that finds the device full waits for its own stream, gives back what the pool
//     holds unused (what was cached in pieces too small for it), tries once more, and only then
//     fails, with a `cuda_error` that says how much the pool holds and the device has free. It does
//     not wait for the whole device: another thread may be capturing a CUDA graph on it, which a
//     device-wide synchronisation would break. Inside a capture it fails at once (waiting is not
//     possible there).
//
// Memory allocated while its stream is being captured into a CUDA graph belongs to the graph (the
// pool lends only its properties), as for cudaMallocAsync. Memory made without a stream, and on a GPU
// without stream-ordered allocation, is plain cudaMalloc / cudaFree and is not counted.

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/graph.cuh>

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute {

// Bytes of one GPU's memory held by the library's pool (above), now and at the high-water marks.
struct cuda_memory_stats {
  std::uint64_t in_use = 0;       // in live allocations
  std::uint64_t reserved = 0;     // taken from the driver: in use, or cached for reuse
  std::uint64_t peak_in_use = 0;  // since the pool was made or the peaks were last reset
  std::uint64_t peak_reserved = 0;
};

namespace detail {

// Whether `ordinal` allocates in stream order (memory pools); every GPU of the last decade does,
// under Linux.
inline bool stream_ordered_allocation(int ordinal) {
  constexpr int cached = 64;
  static std::atomic<signed char> known[cached]{};  // 0 unknown, 1 yes, -1 no
  if (ordinal >= 0 && ordinal < cached) {
    if (const auto k = known[ordinal].load(std::memory_order_relaxed); k != 0) return k > 0;
  }
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, ordinal) != cudaSuccess) {
    (void)cudaGetLastError();
    supported = 0;
  }
  if (ordinal >= 0 && ordinal < cached) known[ordinal].store(supported ? 1 : -1, std::memory_order_relaxed);
  return supported != 0;
}

// The library's memory pool of each GPU, made at its first use and kept for the life of the process
// (memory may be freed into it during static destruction).
class library_pools {
 public:
  static constexpr int max_devices = 64;

  // GPU `ordinal`'s pool, made now if it does not exist yet.
  static cudaMemPool_t of(int ordinal) {
    check_ordinal(ordinal);
    if (cudaMemPool_t p = slot(ordinal).load(std::memory_order_acquire)) return p;
    static std::mutex m;
    const std::lock_guard lock{m};
    if (cudaMemPool_t p = slot(ordinal).load(std::memory_order_relaxed)) return p;
    const device_guard g(ordinal);
    cudaMemPoolProps props{};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypeNone;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = ordinal;
    cudaMemPool_t p = nullptr;
    cuda_check(cudaMemPoolCreate(&p, &props), "cudaMemPoolCreate (the library's memory pool)", ordinal);
    cuuint64_t keep_all = std::numeric_limits<cuuint64_t>::max();
    cuda_check(cudaMemPoolSetAttribute(p, cudaMemPoolAttrReleaseThreshold, &keep_all),
               "cudaMemPoolSetAttribute (release threshold)", ordinal);
    slot(ordinal).store(p, std::memory_order_release);
    return p;
  }
  // GPU `ordinal`'s pool, or null where none was made (the library has not allocated there).
  static cudaMemPool_t existing(int ordinal) {
    check_ordinal(ordinal);
    return slot(ordinal).load(std::memory_order_acquire);
  }

 private:
  static void check_ordinal(int ordinal) {
    if (ordinal < 0 || ordinal >= max_devices)
      throw std::invalid_argument("distribute: no CUDA device cuda:" + std::to_string(ordinal) +
                                  " (the library's memory pools cover " + std::to_string(max_devices) + " devices)");
  }
  static std::atomic<cudaMemPool_t>& slot(int ordinal) {
    static std::array<std::atomic<cudaMemPool_t>, max_devices> pools{};
    return pools[static_cast<std::size_t>(ordinal)];
  }
};

// Waits for every stream of GPU `ordinal`, so that memory freed in their order is free, then gives
// back to the driver what the library's pool holds and does not use.
inline void release_unused(int ordinal, cudaMemPool_t pool) {
  const device_guard g(ordinal);
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before returning cached memory)", ordinal);
  cuda_check(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo", ordinal);
}

inline std::uint64_t pool_attribute(cudaMemPool_t pool, cudaMemPoolAttr what, int ordinal) {
  cuuint64_t v = 0;
  cuda_check(cudaMemPoolGetAttribute(pool, what, &v), "cudaMemPoolGetAttribute", ordinal);
  return static_cast<std::uint64_t>(v);
}

// `bytes` from GPU `ordinal`'s pool in `stream`'s order (the current device is `ordinal`). A device
// that is full gets one more try after the pool's unused memory is returned, outside a capture.
inline void* allocate_from_pool(int ordinal, std::size_t bytes, cudaStream_t stream) {
  const cudaMemPool_t pool = library_pools::of(ordinal);
  void* p = nullptr;
  cudaError_t rc = cudaMallocFromPoolAsync(&p, bytes, pool, stream);
  if (rc == cudaErrorMemoryAllocation && !stream_capturing(stream)) {
    (void)cudaGetLastError();
    cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize (before returning cached memory)", ordinal);
    cuda_check(cudaMemPoolTrimTo(pool, 0), "cudaMemPoolTrimTo", ordinal);
    rc = cudaMallocFromPoolAsync(&p, bytes, pool, stream);
  }
  if (rc == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) (void)cudaGetLastError();
    cuuint64_t in_use = 0, reserved = 0;
    (void)cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &in_use);
    (void)cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &reserved);
    (void)cudaGetLastError();
    constexpr double mib = 1024.0 * 1024.0;
    auto in_mib = [&](double b) { return std::to_string(static_cast<long long>(b / mib + 0.5)) + " MiB"; };
    throw cuda_error(rc, "distribute: out of memory on cuda:" + std::to_string(ordinal) + " allocating " +
                             in_mib(static_cast<double>(bytes)) + " (" + std::to_string(bytes) +
                             " bytes): the library's pool holds " + in_mib(static_cast<double>(reserved)) + ", " +
                             in_mib(static_cast<double>(in_use)) + " of it in use; the device has " +
                             in_mib(static_cast<double>(free)) + " free of " + in_mib(static_cast<double>(total)));
  }
  cuda_check(rc, ("cudaMallocFromPoolAsync of " + std::to_string(bytes) + " bytes").c_str(), ordinal);
  return p;
}

// Lets GPU `reader` use memory of GPU `owner`'s library pool (stream-ordered allocations, as tensors
// make): peer access between devices does not extend to pool memory. Also enables peer access.
// Returns false, changing nothing, where the two GPUs cannot access each other.
inline bool share_pool(int reader, int owner) {
  if (reader == owner) return true;
  int can = 0;
  cuda_check(cudaDeviceCanAccessPeer(&can, reader, owner), "cudaDeviceCanAccessPeer", reader);
  if (!can) return false;
  {
    device_guard g(reader);
    const cudaError_t rc = cudaDeviceEnablePeerAccess(owner, 0);
    if (rc == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
    else cuda_check(rc, "cudaDeviceEnablePeerAccess", reader);
  }
  if (stream_ordered_allocation(owner)) {
    cudaMemAccessDesc access{};
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = reader;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    cuda_check(cudaMemPoolSetAccess(library_pools::of(owner), &access, 1), "cudaMemPoolSetAccess", owner);
  }
  return true;
}

// Device memory of one GPU, freed on that GPU. Made with a stream, it is allocated and freed in that
// stream's order, from the library's pool (above): neither call waits for the device, where cudaFree
// waits for every stream of it. The stream must then live as long as the memory: the strategies'
// streams do (detail::stream_pool), as does a device's default stream. Made without one, it is plain
// cudaMalloc / cudaFree. Made while its stream is captured into a CUDA graph
// (cuda/device/graph.cuh), it is that graph's memory; memory of no graph released during a capture
// is freed when the capture ends (a graph may free only graph memory).
class device_allocation {
 public:
  device_allocation() = default;
  device_allocation(int ordinal, std::size_t bytes) : ordinal_{ordinal}, bytes_{bytes} {
    if (bytes == 0) return;
    device_guard g(ordinal);
    cuda_check(cudaMalloc(&ptr_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str(), ordinal);
  }
  device_allocation(int ordinal, std::size_t bytes, cudaStream_t stream) : ordinal_{ordinal}, bytes_{bytes} {
    if (bytes == 0) return;
    device_guard g(ordinal);
    if (!stream_ordered_allocation(ordinal)) {
      cuda_check(cudaMalloc(&ptr_, bytes), ("cudaMalloc of " + std::to_string(bytes) + " bytes").c_str(), ordinal);
      return;
    }
    ptr_ = allocate_from_pool(ordinal, bytes, stream);
    stream_ = stream;
    ordered_ = true;
    in_graph_ = stream_capturing(stream);
  }
  device_allocation(device_allocation&& o) noexcept
      : ordinal_{o.ordinal_},
        bytes_{std::exchange(o.bytes_, 0)},
        ptr_{std::exchange(o.ptr_, nullptr)},
        stream_{o.stream_},
        ordered_{o.ordered_},
        in_graph_{o.in_graph_} {}
  device_allocation& operator=(device_allocation&& o) noexcept {
    if (this != &o) {
      release();
      ordinal_ = o.ordinal_;
      bytes_ = std::exchange(o.bytes_, 0);
      ptr_ = std::exchange(o.ptr_, nullptr);
      stream_ = o.stream_;
      ordered_ = o.ordered_;
      in_graph_ = o.in_graph_;
    }
    return *this;
  }
  ~device_allocation() { release(); }

  void* get() const noexcept { return ptr_; }
  std::size_t bytes() const noexcept { return bytes_; }
  int ordinal() const noexcept { return ordinal_; }
  // The stream the memory is ordered on (null for plain cudaMalloc memory, or the default stream).
  cudaStream_t stream() const noexcept { return stream_; }

 private:
  void release() noexcept {
    if (ptr_ == nullptr) return;
    // Memory of no graph, released while its stream is captured: freed once the capture ends.
    if (ordered_ && !in_graph_ && stream_capturing(stream_)) {
      try {
        deferred_frees::instance().add(ordinal_, ptr_, stream_);
      } catch (...) {
        // No memory for the list: the allocation is leaked rather than freed inside the graph.
      }
      ptr_ = nullptr;
      bytes_ = 0;
      return;
    }
    device_guard g(ordinal_, std::nothrow);
    const cudaError_t rc = ordered_ ? cudaFreeAsync(ptr_, stream_) : cudaFree(ptr_);
    if (rc != cudaSuccess) (void)cudaGetLastError();
    ptr_ = nullptr;
    bytes_ = 0;
  }
  int ordinal_ = 0;
  std::size_t bytes_ = 0;
  void* ptr_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool ordered_ = false;
  bool in_graph_ = false;  // allocated while its stream was captured: memory of that graph
};

// A device buffer kept between calls and grown on demand, in a stream's order: a convolution's
// workspace, the 16-bit copies of a mixed-precision pass. A CUDA graph replays the addresses it
// captured, so a buffer that a capture used is not freed when a larger one replaces it (another
// model on the same engine may still be replaying graphs that read it): it is kept until the owner
// goes. One no capture used is freed in the stream's order as before. A buffer that is kept is
// replaced by one of at least twice its size, so what is kept stays below the size in use.
class scratch_buffer {
 public:
  // At least `bytes`, on GPU `ordinal` in `stream`'s order; the same memory until a call asks for
  // more.
  void* get(int ordinal, std::size_t bytes, cudaStream_t stream) {
    if (bytes > current_.bytes()) {
      const std::size_t grown = captured_ ? std::max(bytes, 2 * current_.bytes()) : bytes;
      device_allocation next(ordinal, grown, stream);
      if (captured_) retired_.push_back(std::move(current_));
      current_ = std::move(next);
      captured_ = false;
    }
    if (!captured_ && stream_capturing(stream)) captured_ = true;
    return current_.get();
  }
  // Bytes of the buffer in use, and of those kept for graphs that may still read them.
  std::size_t bytes() const noexcept { return current_.bytes(); }
  std::size_t retired_bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& r : retired_) n += r.bytes();
    return n;
  }

 private:
  device_allocation current_;
  bool captured_ = false;  // a capture used current_
  std::vector<device_allocation> retired_;
};

// Page-locked host memory: host<->device copies from it are DMA transfers that can run asynchronously.
class pinned_allocation {
 public:
  pinned_allocation() = default;
  explicit pinned_allocation(std::size_t bytes) : bytes_{bytes} {
    if (bytes != 0)
      cuda_check(cudaMallocHost(&ptr_, bytes), ("cudaMallocHost of " + std::to_string(bytes) + " bytes").c_str());
  }
  pinned_allocation(pinned_allocation&& o) noexcept
      : bytes_{std::exchange(o.bytes_, 0)}, ptr_{std::exchange(o.ptr_, nullptr)} {}
  pinned_allocation& operator=(pinned_allocation&& o) noexcept {
    if (this != &o) {
      if (ptr_) (void)cudaFreeHost(ptr_);
      bytes_ = std::exchange(o.bytes_, 0);
      ptr_ = std::exchange(o.ptr_, nullptr);
    }
    return *this;
  }
  ~pinned_allocation() {
    if (ptr_) (void)cudaFreeHost(ptr_);
  }
  void* get() const noexcept { return ptr_; }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  std::size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

}  // namespace detail

// The library's memory on GPU `ordinal` (all zero where it has allocated nothing there yet).
inline cuda_memory_stats cuda_memory_usage(int ordinal) {
  const cudaMemPool_t pool = detail::library_pools::existing(ordinal);
  if (pool == nullptr) return {};
  return cuda_memory_stats{.in_use = detail::pool_attribute(pool, cudaMemPoolAttrUsedMemCurrent, ordinal),
                           .reserved = detail::pool_attribute(pool, cudaMemPoolAttrReservedMemCurrent, ordinal),
                           .peak_in_use = detail::pool_attribute(pool, cudaMemPoolAttrUsedMemHigh, ordinal),
                           .peak_reserved = detail::pool_attribute(pool, cudaMemPoolAttrReservedMemHigh, ordinal)};
}

// Starts the high-water marks of `cuda_memory_usage(ordinal)` again: afterwards they count the
// largest use from this call on.
inline void cuda_reset_memory_peaks(int ordinal) {
  const cudaMemPool_t pool = detail::library_pools::existing(ordinal);
  if (pool == nullptr) return;
  cuuint64_t zero = 0;  // the only value these attributes can be set to
  detail::cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero),
                     "cudaMemPoolSetAttribute (peak in use)", ordinal);
  detail::cuda_check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero),
                     "cudaMemPoolSetAttribute (peak reserved)", ordinal);
}

// Waits for GPU `ordinal` and gives back to the driver the memory the library's pool holds and does
// not use. Not while one of the device's streams is being captured into a CUDA graph.
inline void cuda_release_cached_memory(int ordinal) {
  if (const cudaMemPool_t pool = detail::library_pools::existing(ordinal)) detail::release_unused(ordinal, pool);
}

}  // namespace distribute
