#pragma once
// The owning tensor of a CUDA device: the same shape vocabulary and NCHW layout as `tensor<T, cpu>`,
// with its storage in device memory. Its elements cannot be touched from the host: `data()` and
// `values()` name device memory, for kernels, cuDNN and collectives (a collective given a span of
// device memory works on it in place). Host values go in and out through explicit copies
// (`from_host`, `to_host`, `copy_from_host`, `copy_to_host`) and, for input batches, through a
// `pinned_staging` area, whose copies overlap the replica's work.
//
// Copies stay on their device: copy-constructing copies onto the source's device, and assigning
// copies the values into the target's own device (a default-constructed target takes the source's).
// That is what `broadcast` of mirrored state needs: every replica's copy keeps living on its GPU.
// A copy between two tensors of one stream is queued on that stream and returns at once (the
// stream's order makes it safe, and a layer keeping its input then costs no wait); a copy between
// streams or GPUs returns once it is done.

#include <distribute/detail/digest.hpp>
#include <distribute/device/cuda.cuh>
#include <distribute/device/cuda_graph.cuh>
#include <distribute/tensor/shape.hpp>
#include <distribute/tensor/tensor.hpp>

#include <cuda_runtime.h>
#include <thrust/fill.h>
#include <thrust/system/cuda/execution_policy.h>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute {

namespace detail {

// Whether `ordinal` allocates in stream order (cudaMallocAsync); every GPU of the last decade does,
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

// Lets GPU `reader` use memory from the default pool of GPU `owner` (stream-ordered allocations, as
// tensors make): peer access between devices does not extend to pool memory. Also enables peer
// access. Returns false, changing nothing, where the two GPUs cannot access each other.
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
    cudaMemPool_t pool = nullptr;
    cuda_check(cudaDeviceGetDefaultMemPool(&pool, owner), "cudaDeviceGetDefaultMemPool", owner);
    cudaMemAccessDesc access{};
    access.location.type = cudaMemLocationTypeDevice;
    access.location.id = reader;
    access.flags = cudaMemAccessFlagsProtReadWrite;
    cuda_check(cudaMemPoolSetAccess(pool, &access, 1), "cudaMemPoolSetAccess", owner);
  }
  return true;
}

// Device memory of one GPU, freed on that GPU. Made with a stream, it is allocated and freed in that
// stream's order (cudaMallocAsync / cudaFreeAsync, from the device's memory pool): neither call waits
// for the device, where cudaFree waits for every stream of it. The stream must then live as long as
// the memory: the strategies' streams do (detail::stream_pool), as does a device's default stream.
// Made without one, it is plain cudaMalloc / cudaFree. Made while its stream is captured into a CUDA
// graph (device/cuda_graph.cuh), it is that graph's memory; memory of no graph released during a
// capture is freed when the capture ends (a graph may free only graph memory).
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
    cuda_check(cudaMallocAsync(&ptr_, bytes, stream), ("cudaMallocAsync of " + std::to_string(bytes) + " bytes").c_str(),
               ordinal);
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

// Page-locked host memory: host<->device copies from it are DMA transfers that can run asynchronously.
class pinned_allocation {
 public:
  pinned_allocation() = default;
  explicit pinned_allocation(std::size_t bytes) : bytes_{bytes} {
    if (bytes != 0) cuda_check(cudaMallocHost(&ptr_, bytes), ("cudaMallocHost of " + std::to_string(bytes) + " bytes").c_str());
  }
  pinned_allocation(pinned_allocation&& o) noexcept : bytes_{std::exchange(o.bytes_, 0)}, ptr_{std::exchange(o.ptr_, nullptr)} {}
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

template <class T>
class pinned_staging;

// NCHW, dense, row-major, in the memory of one GPU. Work (fills, copies) is queued on the device's
// stream; the host-facing copies wait for it, so they return with the data in place.
template <class T>
class tensor<T, cuda> {
  static_assert(std::is_trivially_copyable_v<T>, "distribute: a CUDA tensor holds trivially copyable elements");

 public:
  using value_type = T;
  using device_type = cuda;
  static constexpr distribute::layout layout = distribute::layout::nchw;

  tensor() = default;
  // Zero-filled, on `device`.
  explicit tensor(distribute::shape s, cuda device = {}) : device_{device}, shape_{s}, storage_{allocate(device, s)} {
    if (!empty()) {
      detail::device_guard g(device_.index());
      detail::cuda_check(cudaMemsetAsync(data(), 0, bytes(), device_.stream()), "cudaMemsetAsync", device_.index());
      // Inside a CUDA graph's capture the memset is a node of the graph, ordered before its users.
      if (!detail::stream_capturing(device_.stream())) device_.synchronize();
    }
  }
  // Values left unset, for an output that is about to be overwritten in full (no memset).
  tensor(distribute::shape s, cuda device, uninitialized_t) : device_{device}, shape_{s}, storage_{allocate(device, s)} {}

  // The values of a host tensor, uploaded to `device`.
  static tensor from_host(const tensor<T, cpu>& host, cuda device = {}) {
    tensor t(host.shape(), device, uninitialized);
    t.copy_from_host(host.values());
    return t;
  }
  static tensor from_host(distribute::shape s, std::span<const T> values, cuda device = {}) {
    tensor t(s, device, uninitialized);
    t.copy_from_host(values);
    return t;
  }
  // The same upload through pinned memory, for input batches: the values are copied into this
  // thread's double-buffered pinned area for `device` (one per GPU and stream, kept for the thread's
  // life) and the transfer is queued on the device's stream, which orders every later use of the
  // tensor after it; returns without waiting for the transfer. `values` may be reused at once.
  static tensor staged_from_host(const tensor<T, cpu>& host, cuda device = {}) {
    tensor t(host.shape(), device, uninitialized);
    staging_for(device).upload(host.values(), t);
    return t;
  }

  tensor(const tensor& o) : device_{o.device_}, shape_{o.shape_}, storage_{allocate(o.device_, o.shape_)} {
    copy_device_values(o);
  }
  tensor& operator=(const tensor& o) {
    if (this == &o) return *this;
    if (storage_.get() == nullptr && !o.empty()) device_ = o.device_;
    if (size() != o.size() || (storage_.get() == nullptr && !o.empty())) storage_ = allocate(device_, o.shape_);
    shape_ = o.shape_;
    copy_device_values(o);
    return *this;
  }
  tensor(tensor&&) noexcept = default;
  tensor& operator=(tensor&&) noexcept = default;

  const cuda& device() const noexcept { return device_; }
  const distribute::shape& shape() const noexcept { return shape_; }
  std::size_t size() const noexcept { return static_cast<std::size_t>(shape_.numel()); }
  std::size_t bytes() const noexcept { return size() * sizeof(T); }
  bool empty() const noexcept { return size() == 0; }
  // Device memory.
  T* data() noexcept { return static_cast<T*>(storage_.get()); }
  const T* data() const noexcept { return static_cast<const T*>(storage_.get()); }
  // A span over device memory: hand it to collectives and kernels, never dereference it on the host.
  std::span<T> values() noexcept { return {data(), size()}; }
  std::span<const T> values() const noexcept { return {data(), size()}; }

  // Host -> device. `host` must hold exactly size() elements. Returns once the values are on the GPU.
  void copy_from_host(std::span<const T> host) {
    check_host_size(host.size(), "copy_from_host");
    if (empty()) return;
    detail::refuse_while_capturing(device_.stream(), device_.index(), "a tensor's copy_from_host");
    detail::device_guard g(device_.index());
    detail::cuda_check(cudaMemcpyAsync(data(), host.data(), bytes(), cudaMemcpyHostToDevice, device_.stream()),
                       "cudaMemcpyAsync (host to device)", device_.index());
    device_.synchronize();
  }
  // Device -> host. Returns once the values are in `host`.
  void copy_to_host(std::span<T> host) const {
    check_host_size(host.size(), "copy_to_host");
    if (empty()) return;
    detail::refuse_while_capturing(device_.stream(), device_.index(), "a tensor's copy_to_host");
    detail::device_guard g(device_.index());
    detail::cuda_check(cudaMemcpyAsync(host.data(), data(), bytes(), cudaMemcpyDeviceToHost, device_.stream()),
                       "cudaMemcpyAsync (device to host)", device_.index());
    device_.synchronize();
  }
  std::vector<T> to_vector() const {
    std::vector<T> v(size());
    copy_to_host(v);
    return v;
  }
  tensor<T, cpu> to_host() const { return tensor<T, cpu>(shape_, to_vector()); }

  void fill_zero() {
    if (empty()) return;
    detail::device_guard g(device_.index());
    detail::cuda_check(cudaMemsetAsync(data(), 0, bytes(), device_.stream()), "cudaMemsetAsync", device_.index());
  }
  // Every element `v`, in the order of the tensor's stream.
  void fill(T v) {
    if (empty()) return;
    if (v == T(0)) return fill_zero();
    queue_fill(v, 0, size());
  }
  // Elements [offset, offset + count) set to `v`, in the order of the tensor's stream and without a
  // wait: the value travels as a kernel argument, where a copy from pageable host memory would first
  // wait for the stream (an optimiser's learning rate changed between captured steps). Refused
  // (graph_capture_error) while the stream is being captured: a graph would replay the value.
  void fill(T v, std::size_t offset, std::size_t count) {
    detail::check_fill_range(offset, count, size());
    if (count == 0) return;
    if (detail::stream_capturing(device_.stream()))
      throw graph_capture_error("distribute: a tensor's range fill on " + device_.name() +
                                " while its stream is being captured: the graph would replay the captured value; set "
                                "such values (an optimiser's learning rate) between captured steps");
    queue_fill(v, offset, count);
  }
  // The same values under another shape of as many elements.
  tensor reshaped(distribute::shape s) const& {
    tensor out{*this};
    out.reshape(s);
    return out;
  }
  tensor reshaped(distribute::shape s) && {
    reshape(s);
    return std::move(*this);
  }

  // Keeps the storage when the element count is unchanged; otherwise reallocates (contents undefined).
  void resize(distribute::shape s) {
    if (s.numel() != shape_.numel()) storage_ = allocate(device_, s);
    shape_ = s;
  }
  void reshape(distribute::shape s) {
    if (s.numel() != shape_.numel())
      throw std::invalid_argument("distribute: cannot reshape " + shape_.to_string() + " to " + s.to_string());
    shape_ = s;
  }

  // For verify_mirrored: a digest of the values (copied to the host; a debug check, not a fast path).
  std::uint64_t state_digest() const {
    const auto v = to_vector();
    std::uint64_t h = detail::fnv1a(&shape_, 0);
    for (std::size_t i = 0; i < shape_.rank(); ++i) {
      const std::int64_t e = shape_[i];
      h = detail::fnv1a(&e, sizeof e, h);
    }
    return detail::fnv1a(v.data(), v.size() * sizeof(T), h);
  }

 private:

  // In the order of the tensor's stream: neither allocating nor freeing waits for the device.
  static detail::device_allocation allocate(const cuda& device, const distribute::shape& s) {
    return detail::device_allocation(device.index(), static_cast<std::size_t>(s.numel()) * sizeof(T), device.stream());
  }

  // Elements [offset, offset + count) set to `v` by Thrust on the tensor's stream (no wait).
  void queue_fill(T v, std::size_t offset, std::size_t count) {
    detail::device_guard g(device_.index());
    thrust::fill_n(thrust::cuda::par_nosync.on(device_.stream()), data() + offset, count, v);
    detail::cuda_check(cudaPeekAtLastError(), "thrust::fill_n", device_.index());
  }

  void check_host_size(std::size_t n, const char* op) const {
    if (n != size())
      throw std::invalid_argument(std::string("distribute: ") + op + " of a CUDA tensor of shape " + shape_.to_string() +
                                  " needs " + std::to_string(size()) + " elements, got " + std::to_string(n));
  }

  // Same device: an ordinary copy on this tensor's stream, after the source's stream has finished
  // writing it. Different devices: a peer copy (staged by the driver when there is no peer access).
  static pinned_staging<T>& staging_for(const cuda& device) {
    struct area {
      int ordinal;
      cudaStream_t stream;
      std::unique_ptr<pinned_staging<T>> staging;
    };
    thread_local std::vector<area> areas;
    for (auto& a : areas)
      if (a.ordinal == device.index() && a.stream == device.stream()) return *a.staging;
    areas.push_back({device.index(), device.stream(), std::make_unique<pinned_staging<T>>(device)});
    return *areas.back().staging;
  }

  void copy_device_values(const tensor& o) {
    if (o.empty()) return;
    detail::device_guard g(device_.index());
    if (o.device_.index() == device_.index() && o.device_.stream() == device_.stream()) {
      // One stream (a layer keeping its input, a loss's gradient scaled in a copy): its order already
      // puts the copy after the work that wrote `o` and before the work that will read this tensor,
      // and `o`'s memory is released on that stream too. No wait for the host.
      detail::cuda_check(cudaMemcpyAsync(data(), o.data(), bytes(), cudaMemcpyDeviceToDevice, device_.stream()),
                         "cudaMemcpyAsync (device to device)", device_.index());
      return;
    }
    o.device_.synchronize();
    if (o.device_.index() == device_.index()) {
      detail::cuda_check(cudaMemcpyAsync(data(), o.data(), bytes(), cudaMemcpyDeviceToDevice, device_.stream()),
                         "cudaMemcpyAsync (device to device)", device_.index());
    } else {
      detail::cuda_check(cudaMemcpyPeerAsync(data(), device_.index(), o.data(), o.device_.index(), bytes(), device_.stream()),
                         "cudaMemcpyPeerAsync", device_.index());
    }
    device_.synchronize();
  }

  cuda device_{};
  distribute::shape shape_{};
  detail::device_allocation storage_;
};

// Double-buffered pinned host memory for moving input batches to a GPU. `upload` copies the host
// batch into page-locked memory and queues the DMA transfer on the staging's stream (the device's),
// then returns: the transfer overlaps whatever the host does next (preparing the following batch).
// The transfer is ordered against the destination tensor's own stream both ways: it starts after the
// work already queued there (which may still read the previous batch), and work queued there later
// sees the data. A buffer is reused only after its previous transfer has finished.
template <class T>
class pinned_staging {
 public:
  explicit pinned_staging(cuda device) : device_{device} {
    detail::device_guard g(device.index());
    for (auto* events : {&done_, &ready_})
      for (auto& e : *events)
        detail::cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate", device.index());
  }
  pinned_staging(const pinned_staging&) = delete;
  pinned_staging& operator=(const pinned_staging&) = delete;
  ~pinned_staging() {
    for (auto e : done_) {
      if (e == nullptr) continue;
      (void)cudaEventSynchronize(e);
      (void)cudaEventDestroy(e);
    }
    for (auto e : ready_)
      if (e != nullptr) (void)cudaEventDestroy(e);
  }

  const cuda& device() const noexcept { return device_; }

  // Queues `host` -> `dst` (same element count). `dst` must be on this staging's device; it may be
  // bound to another stream.
  void upload(std::span<const T> host, tensor<T, cuda>& dst) {
    if (host.size() != dst.size())
      throw std::invalid_argument("distribute: pinned upload of " + std::to_string(host.size()) +
                                  " elements into a CUDA tensor of shape " + dst.shape().to_string());
    if (dst.device().index() != device_.index())
      throw std::invalid_argument("distribute: pinned upload for " + device_.name() + " into a tensor on " + dst.device().name());
    if (host.empty()) return;
    const std::size_t k = next_;
    next_ ^= 1;
    detail::cuda_check(cudaEventSynchronize(done_[k]), "cudaEventSynchronize", device_.index());
    const std::size_t bytes = host.size() * sizeof(T);
    if (buffers_[k].bytes() < bytes) buffers_[k] = detail::pinned_allocation(bytes);
    std::memcpy(buffers_[k].get(), host.data(), bytes);
    detail::device_guard g(device_.index());
    const cudaStream_t mine = device_.stream(), theirs = dst.device().stream();
    const bool other_stream = theirs != mine;
    if (other_stream) {
      // dst may still be read or written by work queued on its own stream.
      detail::cuda_check(cudaEventRecord(ready_[k], theirs), "cudaEventRecord", device_.index());
      detail::cuda_check(cudaStreamWaitEvent(mine, ready_[k], 0), "cudaStreamWaitEvent", device_.index());
    }
    detail::cuda_check(cudaMemcpyAsync(dst.data(), buffers_[k].get(), bytes, cudaMemcpyHostToDevice, mine),
                       "cudaMemcpyAsync (pinned to device)", device_.index());
    detail::cuda_check(cudaEventRecord(done_[k], mine), "cudaEventRecord", device_.index());
    if (other_stream)
      detail::cuda_check(cudaStreamWaitEvent(theirs, done_[k], 0), "cudaStreamWaitEvent", device_.index());
  }
  // Waits until every queued upload has landed.
  void wait() const {
    for (auto e : done_) detail::cuda_check(cudaEventSynchronize(e), "cudaEventSynchronize", device_.index());
  }

 private:
  cuda device_;
  std::array<detail::pinned_allocation, 2> buffers_;
  std::array<cudaEvent_t, 2> done_{};
  std::array<cudaEvent_t, 2> ready_{};  // the destination's stream reached the upload
  std::size_t next_ = 0;
};

}  // namespace distribute
