#pragma once
// A CUDA GPU as a device. Like `cpu`, a `cuda` value is small: an ordinal and, optionally, the stream
// work for it is queued on (`.on(stream)` returns a copy bound to another stream). The strategies give
// each replica its own stream; a `cuda` made by hand uses the device's default stream.
//
// Every CUDA call below goes through `cuda_check`, which turns an error code into a `cuda_error`
// naming the call and the device. Asking how many GPUs there are says 0 on a machine without a GPU
// or without an NVIDIA driver, and throws when a driver is there but unusable (one too old for this
// CUDA runtime, for instance): a GPU run must not quietly test nothing.

#include <distribute/concepts/device.hpp>
#include <distribute/config.hpp>
#include <distribute/detail/digest.hpp>

#if !DISTRIBUTE_HAS_CUDA
#  error "<distribute/cuda/device/cuda.cuh> needs nvcc and the CUDA toolkit (link distribute::cuda)"
#endif

#include <cuda.h>  // the types of the one driver entry point used (looked up through the runtime)
#include <cuda_runtime.h>

#if defined(__linux__)
#  include <dlfcn.h>
#endif

#include <algorithm>
#include <chrono>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
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

// Whether the primary context of `ordinal` exists. Making a device current (cudaSetDevice, since CUDA
// 12) creates its context, about half a gigabyte of device memory: a thread that merely restores the
// device it "had" must not create one on a GPU it never used. Asked of the driver through the
// runtime's entry-point lookup, so no program needs to link the driver library; if the lookup fails
// the answer is "yes", which restores as before.
inline bool primary_context_active(int ordinal) noexcept {
  using get_state = CUresult (*)(CUdevice, unsigned int*, int*);
  static const get_state fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuDevicePrimaryCtxGetState", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return get_state{nullptr};
    }
    return reinterpret_cast<get_state>(f);
  }();
  if (fn == nullptr) return true;
  unsigned int flags = 0;
  int active = 1;
  // Runtime ordinals and driver device handles coincide (both count the visible devices).
  if (fn(static_cast<CUdevice>(ordinal), &flags, &active) != CUDA_SUCCESS) return true;
  return active != 0;
}

// Makes `ordinal` the calling thread's current device for its lifetime. Afterwards the thread gets
// back the device it had, if that device has a context; a thread that had none (a fresh thread
// reports device 0 without having used it) keeps `ordinal`, so that no context is created on GPU 0
// by a thread that never worked there.
class device_guard {
 public:
  explicit device_guard(int ordinal) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != ordinal) {
      cuda_check(cudaSetDevice(ordinal), "cudaSetDevice", ordinal);
      restore_ = primary_context_active(previous_);
    }
  }
  // For destructors and failure paths: errors are ignored.
  device_guard(int ordinal, std::nothrow_t) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      return;
    }
    if (previous_ != ordinal) {
      if (cudaSetDevice(ordinal) != cudaSuccess) (void)cudaGetLastError();
      restore_ = primary_context_active(previous_);
    }
  }
  device_guard(const device_guard&) = delete;
  device_guard& operator=(const device_guard&) = delete;
  ~device_guard() {
    if (restore_ && cudaSetDevice(previous_) != cudaSuccess) (void)cudaGetLastError();
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

// How a failed cudaGetDeviceCount is read: no device, or no NVIDIA driver installed at all (no
// libcuda, or only the toolkit's stub of it), is a machine without a GPU; any other error (a driver
// too old for this runtime, a broken installation) is a failure the caller must see.
inline bool means_no_gpu(cudaError_t rc, bool driver_installed) noexcept {
  if (rc == cudaErrorNoDevice || rc == cudaErrorStubLibrary) return true;
  if (rc == cudaErrorInsufficientDriver) return !driver_installed;
  return false;
}

// Whether the NVIDIA driver library is on this machine.
inline bool driver_library_present() noexcept {
#if defined(__linux__)
  if (void* h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL)) {
    dlclose(h);
    return true;
  }
  return false;
#else
  return true;
#endif
}

}  // namespace detail

class cuda {
 public:
  static constexpr bool host_memory = false;  // device_traits: data live in GPU memory

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

// How many CUDA devices this process can use: 0 on a machine without a GPU or without an NVIDIA
// driver. Throws a `cuda_error` when there is a driver that cannot be used, such as one older than
// this CUDA runtime needs (CUDA 13 needs r580 or later), rather than passing for a machine without
// a GPU.
inline int cuda_device_count() {
  int n = 0;
  const cudaError_t rc = cudaGetDeviceCount(&n);
  if (rc == cudaSuccess) return n;
  (void)cudaGetLastError();
  if (detail::means_no_gpu(rc, detail::driver_library_present())) return 0;
  std::string msg = std::string("distribute: cudaGetDeviceCount failed: ") + cudaGetErrorName(rc) + " (" +
                    cudaGetErrorString(rc) + ")";
  if (rc == cudaErrorInsufficientDriver)
    msg += "; the installed NVIDIA driver is older than this CUDA " + std::to_string(CUDART_VERSION / 1000) +
           " runtime needs (update the driver, or build with an older toolkit)";
  throw cuda_error(rc, msg);
}

// Every visible GPU, cuda:0 .. cuda:n-1.
inline std::vector<cuda> all_cuda_devices() {
  const int n = cuda_device_count();
  if (n == 0)
    throw std::runtime_error(
        "distribute: no CUDA device is visible (check the driver, nvidia-smi and CUDA_VISIBLE_DEVICES)");
  std::vector<cuda> devices;
  for (int i = 0; i < n; ++i) devices.emplace_back(i);
  return devices;
}

// `n` logical replicas sharing GPU `ordinal`: for testing data-parallel code on one GPU, and for
// running several small replicas where one would not fill the device.
inline std::vector<cuda> cuda_replicas(int n, int ordinal = 0) {
  if (n < 1)
    throw std::invalid_argument("distribute::cuda_replicas: need at least one replica, got " + std::to_string(n));
  return std::vector<cuda>(static_cast<std::size_t>(n), cuda{ordinal});
}

namespace detail {

// The streams of this process, by device, kept for reuse instead of destroyed. A stream handle then
// stays valid for the life of the process: device memory allocated in stream order (a tensor's) is
// returned in the order of the stream it was made on, even by a tensor that outlives the strategy
// that lent it the stream. Never destroyed, so that tensors freed during static destruction still
// find it.
class stream_pool {
 public:
  static stream_pool& instance() {
    static stream_pool* pool = new stream_pool;
    return *pool;
  }
  cudaStream_t take(int ordinal) {
    {
      std::lock_guard lock(mu_);
      for (auto& [o, s] : idle_)
        if (o == ordinal && s != nullptr) return std::exchange(s, nullptr);
    }
    device_guard g(ordinal);
    cudaStream_t s = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", ordinal);
    return s;
  }
  // `s` has finished its work.
  void give_back(int ordinal, cudaStream_t s) {
    std::lock_guard lock(mu_);
    for (auto& [o, idle] : idle_)
      if (idle == nullptr) {
        o = ordinal;
        idle = s;
        return;
      }
    idle_.emplace_back(ordinal, s);
  }

 private:
  std::mutex mu_;
  std::vector<std::pair<int, cudaStream_t>> idle_;
};

// A CUDA stream of one device (non-blocking with respect to the legacy default stream), owned while
// this object lives; drained and handed back to the process's pool afterwards.
class owned_stream {
 public:
  owned_stream() = default;
  explicit owned_stream(int ordinal) : ordinal_{ordinal}, stream_{stream_pool::instance().take(ordinal)} {}
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
    {
      device_guard g(ordinal_, std::nothrow);
      if (cudaStreamSynchronize(stream_) != cudaSuccess) (void)cudaGetLastError();
    }
    try {
      stream_pool::instance().give_back(ordinal_, stream_);
    } catch (...) {
      // Out of memory for the pool's list: the stream is leaked, never destroyed while in use.
    }
    stream_ = nullptr;
  }
  int ordinal_ = 0;
  cudaStream_t stream_ = nullptr;
};

// Whether `stream`'s queued work has finished. A stream still busy leaves cudaErrorNotReady as the
// thread's last error (it is not an error): cleared here, so that a later cudaGetLastError, ours
// after a kernel launch or the program's own, does not report it. Other errors throw.
inline bool stream_idle(cudaStream_t stream, int ordinal) {
  const cudaError_t q = cudaStreamQuery(stream);
  if (q == cudaErrorNotReady) {
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    return false;
  }
  cuda_check(q, "cudaStreamQuery", ordinal);
  return true;
}

// Waits, at most until `deadline`, for `stream` to finish; returns whether it did. For failure
// paths: errors count as finished (they are sticky, and the step is failing already).
inline bool drain_until(cudaStream_t stream, int ordinal, std::chrono::steady_clock::time_point deadline) noexcept {
  device_guard g(ordinal, std::nothrow);
  for (auto pause = std::chrono::microseconds(20);; pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
    const cudaError_t q = cudaStreamQuery(stream);
    if (q != cudaErrorNotReady) {
      (void)cudaGetLastError();
      return true;
    }
    if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
  }
}

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

// A GPU model's parameters read or written through the host (digests, checkpoints, broadcasts
// between workers), or copied from one GPU to another (broadcast between replicas): unified
// addressing tells the direction. Work still queued on the GPUs involved finishes first (the
// replicas' streams do not order with cudaMemcpy's, and a stream-ordered copy may still be writing
// a parameter); between steps, which is where callers use it, there is none and this costs little.
template <>
struct device_memory<cuda> {
  template <class T>
  static void copy(const T* src, std::size_t n, T* dst) {
    if (n == 0) return;
    int done = -1;
    for (const void* p : {static_cast<const void*>(src), static_cast<const void*>(dst)}) {
      const buffer_location where = locate(p);
      if (!where.on_device || where.ordinal == done) continue;
      device_guard g(where.ordinal);
      cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before copying a model's parameters)", where.ordinal);
      done = where.ordinal;
    }
    cuda_check(cudaMemcpy(dst, src, n * sizeof(T), cudaMemcpyDefault), "cudaMemcpy (a model's parameters)");
  }
};

}  // namespace detail

// A stream of its own for a strategy that would otherwise queue on the device's legacy default
// stream, on which CUDA graphs (nn::graphed, nn::graphed_step) cannot be captured:
//
//   distribute::cuda_stream stream(0);
//   distribute::one_device_strategy<distribute::cuda> s{distribute::cuda{0}.on(stream.get())};
//
// Non-blocking with respect to the legacy default stream; declared before the strategy, it outlives
// it, and it is drained when it goes. (mirrored strategies make one per replica themselves.)
using cuda_stream = detail::owned_stream;

}  // namespace distribute
