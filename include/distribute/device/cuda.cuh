#pragma once
// A CUDA GPU as a device. Like `cpu`, a `cuda` value is small: an ordinal and, optionally, the stream
// work for it is queued on (`.on(stream)` returns a copy bound to another stream). The strategies give
// each replica its own stream; a `cuda` made by hand uses the device's default stream.
//
// Every CUDA call below goes through `cuda_check`, which turns an error code into a `cuda_error`
// naming the call and the device. Asking how many GPUs there are never throws: a machine without a
// GPU or without a driver has zero.

#include <distribute/concepts/device.hpp>
#include <distribute/config.hpp>

#if !DISTRIBUTE_HAS_CUDA
#  error "<distribute/device/cuda.cuh> needs nvcc and the CUDA toolkit (link distribute::cuda)"
#endif

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace distribute {

// A CUDA runtime call failed. `code()` is the runtime's error code.
class cuda_error : public std::runtime_error {
 public:
  cuda_error(cudaError_t code, const std::string& what) : std::runtime_error(what), code_{code} {}
  cudaError_t code() const noexcept { return code_; }

 private:
  cudaError_t code_;
};

namespace detail {

inline void cuda_check(cudaError_t rc, const char* call, int ordinal = -1) {
  if (rc == cudaSuccess) return;
  // Clears the sticky "last error" of a non-sticky failure, so that later calls do not report it.
  (void)cudaGetLastError();
  std::string msg = std::string("distribute: ") + call;
  if (ordinal >= 0) msg += " on cuda:" + std::to_string(ordinal);
  msg += " failed: ";
  msg += cudaGetErrorName(rc);
  msg += " (";
  msg += cudaGetErrorString(rc);
  msg += ")";
  throw cuda_error(rc, msg);
}

// Makes `ordinal` the calling thread's current device for its lifetime, then restores the previous one:
// the strategies' replica threads, and user threads, keep the device they had.
class device_guard {
 public:
  explicit device_guard(int ordinal) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != ordinal) cuda_check(cudaSetDevice(ordinal), "cudaSetDevice", ordinal);
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() { (void)cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

}  // namespace detail

class cuda {
 public:
  static constexpr device_kind kind = device_kind::cuda;

  constexpr cuda() noexcept = default;
  constexpr explicit cuda(int ordinal, cudaStream_t stream = nullptr) noexcept : ordinal_{ordinal}, stream_{stream} {}

  // The CUDA device ordinal (as cudaSetDevice numbers it, after CUDA_VISIBLE_DEVICES).
  constexpr int index() const noexcept { return ordinal_; }
  std::string name() const { return "cuda:" + std::to_string(ordinal_); }

  // The stream that work for this device is queued on; null is the device's default stream.
  constexpr cudaStream_t stream() const noexcept { return stream_; }
  // The same device, with its work on `stream` (which must belong to this device).
  constexpr cuda on(cudaStream_t stream) const noexcept { return cuda{ordinal_, stream}; }

  // Makes this device current on the calling thread.
  void make_current() const { detail::cuda_check(cudaSetDevice(ordinal_), "cudaSetDevice", ordinal_); }
  // Waits for the work queued on this device's stream.
  void synchronize() const {
    // The null stream is per device: make this one current first.
    detail::device_guard g(ordinal_);
    detail::cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize", ordinal_);
  }

  friend constexpr bool operator==(const cuda&, const cuda&) noexcept = default;

 private:
  int ordinal_ = 0;
  cudaStream_t stream_ = nullptr;
};

static_assert(device<cuda>);

// How many CUDA devices this process can use; 0 without a GPU or without a usable driver.
inline int cuda_device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

// Every visible GPU, cuda:0 .. cuda:n-1.
inline std::vector<cuda> all_cuda_devices() {
  const int n = cuda_device_count();
  if (n == 0)
    throw std::runtime_error("distribute: no CUDA device is visible (check the driver, nvidia-smi and CUDA_VISIBLE_DEVICES)");
  std::vector<cuda> devices;
  for (int i = 0; i < n; ++i) devices.emplace_back(i);
  return devices;
}

// `n` logical replicas sharing GPU `ordinal`: for testing data-parallel code on one GPU, and for
// running several small replicas where one would not fill the device.
inline std::vector<cuda> cuda_replicas(int n, int ordinal = 0) {
  if (n < 1) throw std::invalid_argument("distribute::cuda_replicas: need at least one replica, got " + std::to_string(n));
  return std::vector<cuda>(static_cast<std::size_t>(n), cuda{ordinal});
}

namespace detail {

// An owned CUDA stream on one device (non-blocking with respect to the legacy default stream).
class owned_stream {
 public:
  owned_stream() = default;
  explicit owned_stream(int ordinal) : ordinal_{ordinal} {
    device_guard g(ordinal);
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", ordinal);
  }
  owned_stream(owned_stream&& o) noexcept : ordinal_{o.ordinal_}, stream_{o.stream_} { o.stream_ = nullptr; }
  owned_stream& operator=(owned_stream&& o) noexcept {
    if (this != &o) {
      reset();
      ordinal_ = o.ordinal_;
      stream_ = o.stream_;
      o.stream_ = nullptr;
    }
    return *this;
  }
  ~owned_stream() { reset(); }

  cudaStream_t get() const noexcept { return stream_; }

 private:
  void reset() noexcept {
    if (stream_ == nullptr) return;
    int previous = 0;
    (void)cudaGetDevice(&previous);
    (void)cudaSetDevice(ordinal_);
    (void)cudaStreamSynchronize(stream_);
    (void)cudaStreamDestroy(stream_);
    (void)cudaSetDevice(previous);
    stream_ = nullptr;
  }
  int ordinal_ = 0;
  cudaStream_t stream_ = nullptr;
};

// Where a buffer handed to a collective lives. Device (and managed) memory is used in place; anything
// else is host memory, staged through the device.
struct buffer_location {
  bool on_device = false;
  int ordinal = -1;
};

inline buffer_location locate(const void* p) {
  if (p == nullptr) return {};
  cudaPointerAttributes attr{};
  const cudaError_t rc = cudaPointerGetAttributes(&attr, p);
  if (rc != cudaSuccess) {
    // Older runtimes report plain host memory as an invalid value.
    (void)cudaGetLastError();
    return {};
  }
  if (attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged) return {true, attr.device};
  return {};
}

}  // namespace detail
}  // namespace distribute
