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

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/graph.cuh>
#include <distribute/cuda/device/memory.cuh>
#include <distribute/detail/digest.hpp>
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
  // Zero-filled, on `device`. On a stream of its own (a replica's: `r.device()`), the zeros are
  // written in that stream's order, as every other piece of the tensor's work is, and the call
  // returns without waiting for the device: a loss's value and gradient, made each step, cost no
  // wait. On the default stream (a `cuda` made by hand), which the strategies' streams do not wait
  // for, it waits until the zeros are written, so that the tensor may be used from any stream. Inside
  // a CUDA graph's capture the memset is a node of the graph, ordered before its users.
  explicit tensor(distribute::shape s, cuda device = {}) : device_{device}, shape_{s}, storage_{allocate(device, s)} {
    if (!empty()) {
      detail::device_guard g(device_.index());
      detail::cuda_check(cudaMemsetAsync(data(), 0, bytes(), device_.stream()), "cudaMemsetAsync", device_.index());
      if (device_.stream() == nullptr && !detail::stream_capturing(device_.stream())) device_.synchronize();
    }
  }
  // Values left unset, for an output that is about to be overwritten in full (no memset).
  tensor(distribute::shape s, cuda device, uninitialized_t)
      : device_{device}, shape_{s}, storage_{allocate(device, s)} {}

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

  tensor(const tensor& o)
      : device_{o.device_},
        shape_{o.shape_},
        storage_{o.empty() ? detail::device_allocation{} : allocate(o.device_, o.shape_)} {
    copy_device_values(o);
  }
  tensor& operator=(const tensor& o) {
    if (this == &o) return *this;
    if (o.empty()) {  // an empty source (default-constructed, moved from) leaves this one empty too
      storage_ = detail::device_allocation{};
      shape_ = o.shape_;
      return *this;
    }
    if (storage_.get() == nullptr) device_ = o.device_;
    if (size() != o.size()) storage_ = allocate(device_, o.shape_);
    shape_ = o.shape_;
    copy_device_values(o);
    return *this;
  }
  tensor(tensor&&) noexcept = default;
  tensor& operator=(tensor&&) noexcept = default;

  const cuda& device() const noexcept { return device_; }
  const distribute::shape& shape() const noexcept { return shape_; }
  // A default-constructed (or moved-from) tensor holds no storage and is empty, as on the CPU,
  // although its rank-0 shape counts one element: a copy of it must not read a null pointer.
  std::size_t size() const noexcept { return storage_.get() == nullptr ? 0 : static_cast<std::size_t>(shape_.numel()); }
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
    if (static_cast<std::size_t>(s.numel()) != size()) storage_ = allocate(device_, s);
    shape_ = s;
  }
  void reshape(distribute::shape s) {
    if (static_cast<std::size_t>(s.numel()) != size())
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
      throw std::invalid_argument(std::string("distribute: ") + op + " of a CUDA tensor of shape " +
                                  shape_.to_string() + " needs " + std::to_string(size()) + " elements, got " +
                                  std::to_string(n));
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
      detail::cuda_check(
          cudaMemcpyPeerAsync(data(), device_.index(), o.data(), o.device_.index(), bytes(), device_.stream()),
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
      throw std::invalid_argument("distribute: pinned upload for " + device_.name() + " into a tensor on " +
                                  dst.device().name());
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
