#pragma once
// CUDA graphs: GPU work captured once from a stream and replayed with one launch, so that a pass of
// many small kernels pays the host's launch cost once instead of per kernel (cuda/nn/graphed.cuh uses it
// for a model's forward and backward).
//
// What a captured piece of code may do: queue work on the captured stream (kernels, cuDNN and cuBLAS
// calls, copies between device buffers, stream-ordered allocations and frees). What it may not: wait
// for the device, or read device values on the host, since nothing runs while capturing. The library's
// own host reads (`engine<cuda>::to_host`, a tensor's `copy_to_host`/`copy_from_host`) check for a
// capture and throw `graph_capture_error` naming themselves, so that a capture that cannot work ends
// with a reason instead of an invalidated stream.

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/errors.hpp>

#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute {

namespace detail {

// Whether work queued on `stream` is being captured into a graph (by this thread or another).
inline bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &status) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return status != cudaStreamCaptureStatusNone;
}

// Throws graph_capture_error if `stream` is being captured: `what` would wait for the device.
inline void refuse_while_capturing(cudaStream_t stream, int ordinal, const char* what) {
  if (stream_capturing(stream))
    throw graph_capture_error(std::string("distribute: ") + what + " on cuda:" + std::to_string(ordinal) +
                              " waits for the device, which a CUDA graph being captured cannot do");
}

// Frees of stream-ordered memory allocated outside any graph, asked for while its stream is being
// captured (a layer replacing a tensor it kept from an eager pass): a graph may free only its own
// allocations, so these wait until the capture has ended (detail::device_allocation defers them).
class deferred_frees {
 public:
  static deferred_frees& instance() {
    static deferred_frees* d = new deferred_frees;  // never destroyed: frees may come during exit
    return *d;
  }
  void add(int ordinal, void* ptr, cudaStream_t stream) {
    const std::lock_guard lock{m_};
    pending_.push_back({ordinal, ptr, stream});
  }
  // Frees, on their streams, those whose stream is no longer being captured.
  void release() noexcept {
    const std::lock_guard lock{m_};
    std::erase_if(pending_, [](const entry& e) {
      if (stream_capturing(e.stream)) return false;
      const device_guard g(e.ordinal, std::nothrow);
      if (cudaFreeAsync(e.ptr, e.stream) != cudaSuccess) (void)cudaGetLastError();
      return true;
    });
  }

 private:
  struct entry {
    int ordinal;
    void* ptr;
    cudaStream_t stream;
  };
  std::mutex m_;
  std::vector<entry> pending_;
};

// An instantiated CUDA graph of one device; empty until `capture` succeeds.
class cuda_graph {
 public:
  cuda_graph() = default;
  cuda_graph(cuda_graph&& o) noexcept
      : ordinal_{o.ordinal_}, graph_{std::exchange(o.graph_, nullptr)}, exec_{std::exchange(o.exec_, nullptr)} {}
  cuda_graph& operator=(cuda_graph&& o) noexcept {
    if (this != &o) {
      reset();
      ordinal_ = o.ordinal_;
      graph_ = std::exchange(o.graph_, nullptr);
      exec_ = std::exchange(o.exec_, nullptr);
    }
    return *this;
  }
  ~cuda_graph() { reset(); }

  explicit operator bool() const noexcept { return exec_ != nullptr; }

  // Captures what `body()` queues on `stream` (this thread's calls only: other threads keep working
  // on their own streams) and instantiates it. Returns an empty string on success; otherwise the
  // reason (the exception `body` threw, or CUDA's), with the capture ended and nothing kept. Memory
  // the body allocates and keeps (outputs, a layer's saved input) belongs to the graph: it is freed
  // and allocated again, at the same address, by each launch.
  template <class Body>
  std::string capture(int ordinal, cudaStream_t stream, Body&& body) {
    reset();
    if (legacy_default(stream))
      return "CUDA cannot capture work queued on the legacy default stream; give the strategy a stream of its own "
             "(one_device_strategy<cuda>{cuda{0}.on(stream)}; mirrored strategies have one per replica)";
    const device_guard g(ordinal);
    cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture", ordinal);
    std::string failure;
    try {
      body();
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "an exception that is not a std::exception";
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    deferred_frees::instance().release();
    if (failure.empty() && ended != cudaSuccess)
      failure = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
    (void)cudaGetLastError();  // a capture's errors (invalidated, unsupported) are not the program's
    if (!failure.empty()) {
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
      return failure;
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t made = cudaGraphInstantiateWithFlags(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch);
    if (made != cudaSuccess) {
      (void)cudaGetLastError();
      (void)cudaGraphDestroy(graph);
      return std::string("cudaGraphInstantiateWithFlags: ") + cudaGetErrorString(made);
    }
    ordinal_ = ordinal;
    graph_ = graph;
    exec_ = exec;
    return {};
  }

  // Queues one replay on `stream`.
  void launch(cudaStream_t stream) const {
    if (exec_ == nullptr) throw std::logic_error("distribute: launch of a CUDA graph that was never captured");
    const device_guard g(ordinal_);
    cuda_check(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch", ordinal_);
  }

  // Whether `stream` is the legacy default stream, on which no capture can begin (the null stream is
  // that one unless the program is built with per-thread default streams).
  static bool legacy_default(cudaStream_t stream) noexcept {
#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
    return stream == cudaStreamLegacy;
#else
    return stream == nullptr || stream == cudaStreamLegacy;
#endif
  }

  void reset() noexcept {
    if (exec_ != nullptr) (void)cudaGraphExecDestroy(exec_);
    if (graph_ != nullptr) (void)cudaGraphDestroy(graph_);
    exec_ = nullptr;
    graph_ = nullptr;
  }

 private:
  int ordinal_ = 0;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace detail
}  // namespace distribute
