#pragma once
// The GPU engine: what the layers call for their arithmetic when their replica is on a `cuda`
// device (engine/engine.hpp says what an engine offers). The layers are the CPU's, unchanged:
//
//   convolutions     cuDNN's graph API (cuda/engine/detail/cudnn_conv.cuh), plans cached per shape
//   matrix products  cuBLAS (linear layers)
//   element-wise     the layers' functors (nn/detail/kernels.hpp) through Thrust, on the replica's
//                    stream (cuda/engine/detail/thrust_for_each.hpp): the same arithmetic as the CPU's
//   plane sums       CUB's segmented reduction over the same functors, on the stream
//
// Every call is queued on the replica's stream (the one its `cuda` device is bound to) and returns
// without waiting, except `to_host`, which waits for the values it copies. The engine is made by the
// replica's strategy on first use and used by that replica's thread only.
//
// TF32: float convolutions and matrix products use TF32 tensor cores only when
// `compute_options::tf32` says so (off by default: float results then match the CPU engine's to float
// rounding; on, to about 1e-3 relative, several times faster on Hopper).
//
// Mixed precision: under `compute_options::precision` bfloat16 or float16, or a model's own
// (nn::with_precision), convolutions and matrix products run on 16-bit copies of their operands with
// float accumulation and float results; tensors, parameters and gradients stay float32 (the master
// weights). The element-wise layers and sums stay float32.
//
// Determinism: a fixed configuration gives the same bits run to run (cuDNN plans are chosen once per
// shape and kept, among deterministic engines unless compute_options::deterministic is off; CUB's
// segmented reductions and cuBLAS's products are deterministic for fixed sizes). The plane sums are
// not in the CPU engine's order, so they match its sums to rounding, not in every bit.
//
// Every element-wise pass offers a GPU one work item per element (engine/pass_observer.hpp records
// them): functors that loop over a plane or a row per call belong to the CPU's loops only.

#include <distribute/config.hpp>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/graph.cuh>
#include <distribute/cuda/device/half_conversions.cuh>
#include <distribute/cuda/engine/detail/segmented_reduce.cuh>
#include <distribute/cuda/engine/detail/thrust_for_each.hpp>
#include <distribute/cuda/tensor/tensor.cuh>
#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/detail/segmented_sum_plan.hpp>
#include <distribute/engine/engine.hpp>
#include <distribute/engine/gemm_geometry.hpp>
#include <distribute/engine/pass_observer.hpp>
#if defined(DISTRIBUTE_HAS_CUDNN) && DISTRIBUTE_HAS_CUDNN
#  include <distribute/cuda/engine/detail/cudnn_conv.cuh>
#  define DISTRIBUTE_CUDA_ENGINE_HAS_CUDNN 1
#else
#  define DISTRIBUTE_CUDA_ENGINE_HAS_CUDNN 0
#endif

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <thrust/execution_policy.h>
#include <thrust/fill.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/system/cuda/execution_policy.h>
#include <thrust/transform.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute {

namespace detail {

inline void cublas_check(cublasStatus_t rc, const char* call, int ordinal) {
  if (rc == CUBLAS_STATUS_SUCCESS) return;
  throw cuda_error(cudaErrorUnknown, std::string("distribute: ") + call + " on cuda:" + std::to_string(ordinal) +
                                         " failed: " + cublasGetStatusName(rc) + " (" + cublasGetStatusString(rc) +
                                         ")");
}

// A cuBLAS handle bound to one stream, destroyed with its engine.
class cublas_handle {
 public:
  cublas_handle(int ordinal, cudaStream_t stream) : ordinal_{ordinal} {
    const device_guard current(ordinal);
    cublas_check(cublasCreate(&h_), "cublasCreate", ordinal);
    cublas_check(cublasSetStream(h_, stream), "cublasSetStream", ordinal);
    cublas_check(cublasSetMathMode(h_, mode_), "cublasSetMathMode", ordinal);
  }
  cublas_handle(const cublas_handle&) = delete;
  cublas_handle& operator=(const cublas_handle&) = delete;
  ~cublas_handle() {
    if (h_ != nullptr) {
      const device_guard current(ordinal_);
      (void)cublasDestroy(h_);
    }
  }
  cublasHandle_t get() const noexcept { return h_; }
  // The math mode, set only when it changes: pedantic for float32 products, TF32 tensor cores where
  // asked for, the default for 16-bit inputs (pedantic mode asks for standardised arithmetic in every
  // phase, which may keep 16-bit products off the tensor cores; they still accumulate in float32).
  void set_mode(cublasMath_t mode) {
    if (mode == mode_) return;
    const device_guard current(ordinal_);
    cublas_check(cublasSetMathMode(h_, mode), "cublasSetMathMode", ordinal_);
    mode_ = mode;
  }

 private:
  int ordinal_;
  cublasHandle_t h_ = nullptr;
  cublasMath_t mode_ = CUBLAS_PEDANTIC_MATH;
};

// p[i] = v (a kernel's functor: a namespace-scope type, which the generated launch code can name).
template <class T>
struct fill_with {
  T* p;
  T v;
  DISTRIBUTE_HOST_DEVICE void operator()(std::int64_t i) const { p[i] = v; }
};

}  // namespace detail

template <>
class engine<cuda> {
 public:
  using device_type = cuda;
  // Whether convolutions can run in this build (cuDNN and its frontend headers found).
  static constexpr bool has_cudnn = DISTRIBUTE_CUDA_ENGINE_HAS_CUDNN;

  // `device`: the replica's GPU and stream. `share` (host threads) means nothing to a GPU engine; it
  // is taken so that every engine is made alike.
  explicit engine(compute_options options = {}, int /*share*/ = 0, cuda device = cuda{0})
      : options_{options}, device_{device}, precision_{default_precision(options)} {
    if (is_half(precision_)) check_half(precision_);
  }
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // Host threads the engine uses: one, the replica's.
  int threads() const noexcept { return 1; }
  const compute_options& options() const noexcept { return options_; }
  const cuda& device() const noexcept { return device_; }
  cudaStream_t stream() const noexcept { return device_.stream(); }
  // Whether the replica's stream is being captured into a CUDA graph (code that cannot be captured
  // refuses then: optimisers keeping host step values, host reads).
  bool capturing() const { return detail::stream_capturing(stream()); }
  std::string name() const {
    return std::string(has_cudnn ? "cuDNN" : "no cuDNN (convolutions unavailable)") + " + cuBLAS + Thrust on " +
           device_.name() + ", " + std::string(to_string(precision_));
  }

  // Mixed precision (engine.hpp): what convolutions and matrix products compute in from now on
  // (nn::with_precision sets it around a model's passes). bfloat16 needs compute capability 8.0 or
  // later; float16 runs on every GPU cuDNN supports.
  compute_precision precision() const noexcept { return precision_; }
  void use_precision(compute_precision p) {
    if (is_half(p)) check_half(p);
    precision_ = p;
  }
  // Why 16-bit convolution plans became TF32 ones (cuDNN had no 16-bit engine for the geometry).
  std::vector<std::string> precision_fallbacks() const {
#if DISTRIBUTE_CUDA_ENGINE_HAS_CUDNN
    if (cudnn_) return cudnn_->precision_fallbacks();
#endif
    return {};
  }

  // --- convolutions (conv_geometry.hpp); x, y: NCHW; w: [out, in, k, k]; device memory ------------

  // y = conv(x, w) + bias; `bias` may be null.
  template <class T>
  void conv_forward(const conv_geometry& g, const T* x, const T* w, const T* bias, T* y) {
    convolutions<T>("conv_forward", g).forward(g, x, w, bias, y, precision_);
  }
  // dx = the data gradient of the convolution for dy (overwritten).
  template <class T>
  void conv_backward_data(const conv_geometry& g, const T* dy, const T* w, T* dx) {
    convolutions<T>("conv_backward_data", g).backward_data(g, dy, w, dx, precision_);
  }
  // dw += the weight gradient for (x, dy); db += the sum of dy per output channel (db may be null).
  template <class T>
  void conv_backward_weights(const conv_geometry& g, const T* x, const T* dy, T* dw, T* db) {
    convolutions<T>("conv_backward_weights", g).backward_weights(g, x, dy, dw, db, precision_);
  }

  // --- dense matrix products (gemm_geometry.hpp); row-major; device memory -----------------------

  // c = op(a) op(b), or c += op(a) op(b) when g.accumulate. cuBLAS is column-major: a row-major c is
  // a column-major c^T, so it computes c^T = op(b)^T op(a)^T with the operands' roles swapped.
  template <class T>
  void gemm(const gemm_geometry& g, const T* a, const T* b, T* c) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, double>,
                  "distribute: the GPU engine's gemm is float or double");
    g.check();
    if (g.m == 0 || g.n == 0) return;
    const detail::device_guard current(device_.index());  // cuBLAS's handle and Thrust's launches are the device's
    const T alpha = 1, beta = g.accumulate ? T(1) : T(0);
    if (g.k == 0) {
      if (!g.accumulate) fill(c, g.c_size(), T(0));
      return;
    }
    const int m = checked_int(g.m, g), n = checked_int(g.n, g), k = checked_int(g.k, g);
    const cublasOperation_t op_b = g.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_a = g.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int ldb = g.transpose_b ? k : n;
    const int lda = g.transpose_a ? m : k;
    if constexpr (std::is_same_v<T, float>) {
      if (is_half(precision_)) {
        // 16-bit copies of a and b (Thrust, on the stream), a float c, float accumulation; b's copy
        // starts 256-byte aligned, as cuBLAS's fastest kernels want.
        const bool bf16 = precision_ == compute_precision::bfloat16;
        const std::int64_t na = g.m * g.k, nb = g.k * g.n, na_padded = (na + 127) / 128 * 128;
        void* ha = halves(na_padded + nb);
        void* hb = static_cast<char*>(ha) + static_cast<std::size_t>(na_padded) * 2;
        if (bf16) {
          narrow(a, na, static_cast<__nv_bfloat16*>(ha));
          narrow(b, nb, static_cast<__nv_bfloat16*>(hb));
        } else {
          narrow(a, na, static_cast<__half*>(ha));
          narrow(b, nb, static_cast<__half*>(hb));
        }
        const cudaDataType_t type = bf16 ? CUDA_R_16BF : CUDA_R_16F;
        const cublasHandle_t h = blas();
        blas_->set_mode(CUBLAS_DEFAULT_MATH);
        detail::cublas_check(cublasGemmEx(h, op_b, op_a, n, m, k, &alpha, hb, type, ldb, ha, type, lda, &beta, c,
                                          CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                             bf16 ? "cublasGemmEx (bfloat16)" : "cublasGemmEx (float16)", device_.index());
        return;
      }
      const cublasHandle_t h = blas();
      blas_->set_mode(precision_ == compute_precision::tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH);
      detail::cublas_check(cublasSgemm(h, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, n), "cublasSgemm",
                           device_.index());
    } else {
      const cublasHandle_t h = blas();
      blas_->set_mode(CUBLAS_PEDANTIC_MATH);
      detail::cublas_check(cublasDgemm(h, op_b, op_a, n, m, k, &alpha, b, ldb, a, lda, &beta, c, n), "cublasDgemm",
                           device_.index());
    }
  }

  // --- element-wise work and sums ----------------------------------------------------------------

  // f(i) for every i in [0, n), on the replica's stream.
  template <class F>
  void for_each(std::int64_t n, F f) {
    detail::record_pass(pass_kind::for_each, n, f);
    const detail::device_guard current(device_.index());
    detail::for_each_index(policy(), n, f);
    check_launch("for_each");
  }
  // f(s, i) for every segment s in [0, segments) and i in [0, length): one work item per element
  // (a functor's whole_segment, the CPU's form, is not used here).
  template <class F>
  void for_each_in_segments(std::int64_t segments, std::int64_t length, F f) {
    detail::record_pass(pass_kind::for_each_in_segments, segments * length, f);
    const detail::device_guard current(device_.index());
    detail::for_each_plane_index(policy(), segments, length, f);
    check_launch("for_each_in_segments");
  }
  // out[s] = the sum over i of f(s, i), in double; `out` in device memory. CUB's segmented reduction
  // (one block a segment, a fixed order: the same bits run to run), queued without waiting for the
  // device: Thrust's reduce_by_key reads its segment count back to the host, which waits for the
  // stream and cannot be captured into a CUDA graph. Long segments are cut into chunks summed by
  // blocks of their own, then the chunks' sums by a second reduction (detail/segmented_sum_plan.hpp,
  // detail/segmented_reduce.cuh). Scratch comes from the stream's pool.
  template <class F>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out) {
    segmented_sum(segments, length, f, out, no_finish{});
  }
  // The same with an epilogue: out[s] = finish(s, the sum), written by the reduction's last stage
  // through a tabulate output iterator, so that per-segment work after a sum takes no launch of its own.
  template <class F, class Finish>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out, Finish finish) {
    const detail::segmented_sum_plan plan = detail::plan_segmented_sum(segments, length);
    detail::record_pass(pass_kind::segmented_sum, plan.work_items(), f, plan.launches());
    if (segments <= 0) return;
    const detail::device_guard current(device_.index());
    const thrust::counting_iterator<std::int64_t> first(0);
    if (length <= 0) {
      if constexpr (std::is_same_v<Finish, no_finish>) thrust::fill_n(policy(), out, segments, 0.0);
      else thrust::for_each_n(policy(), first, segments, detail::thrust_loops::finish_empty<Finish>{out, finish});
      check_launch("segmented_sum");
      return;
    }
    // Where the sums go: `out`, or through the epilogue.
    const auto results = [&] {
      if constexpr (std::is_same_v<Finish, no_finish>) return out;
      else return thrust::make_tabulate_output_iterator(detail::thrust_loops::finish_into<Finish>{out, finish});
    }();
    const auto values = thrust::make_transform_iterator(first, detail::thrust_loops::plane_term<F>{f, length});
    detail::planned_segmented_sum(device_.index(), stream(), segments, length, values, results);
    check_launch("segmented_sum");
  }
  // Small results (statistics, loss values) copied from device memory to the host, waiting for them.
  template <class T>
  void to_host(const T* src, std::size_t n, T* dst) const {
    detail::record_host_read(n * sizeof(T));
    if (n == 0) return;
    detail::refuse_while_capturing(stream(), device_.index(),
                                   "reading device values on the host (engine<cuda>::to_host)");
    const detail::device_guard current(device_.index());
    detail::cuda_check(cudaMemcpyAsync(dst, src, n * sizeof(T), cudaMemcpyDeviceToHost, stream()),
                       "cudaMemcpyAsync (to host)", device_.index());
    detail::cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize", device_.index());
  }

  // The engine of the calling thread for `device` (code outside any strategy): one per thread and
  // device ordinal, on the device's default stream.
  static engine& thread_default(const cuda& device = cuda{0}) {
    thread_local std::map<int, std::unique_ptr<engine>> engines;
    auto& e = engines[device.index()];
    if (!e) e = std::make_unique<engine>(compute_options{}, 0, cuda{device.index()});
    return *e;
  }

  // Cached convolution plans, for tests and logs.
  std::size_t cached_plans() const noexcept {
#if DISTRIBUTE_CUDA_ENGINE_HAS_CUDNN
    return cudnn_ ? cudnn_->cached_plans() : 0;
#else
    return 0;
#endif
  }
  // Of those, the plans whose engine was chosen by timing (compute_options::conv_autotune).
  std::size_t tuned_plans() const noexcept {
#if DISTRIBUTE_CUDA_ENGINE_HAS_CUDNN
    return cudnn_ ? cudnn_->tuned_plans() : 0;
#else
    return 0;
#endif
  }

 private:
  // Where Thrust runs: the replica's stream, without a synchronisation after each algorithm.
  using policy_type = decltype(thrust::cuda::par_nosync.on(cudaStream_t{}));
  policy_type policy() const { return thrust::cuda::par_nosync.on(stream()); }

  // No epilogue: segmented_sum writes the sums themselves.
  struct no_finish {};

  void check_launch(const char* what) const {
    const cudaError_t rc = cudaPeekAtLastError();
    if (rc != cudaSuccess && rc != cudaErrorNotReady) {
      (void)cudaGetLastError();
      detail::cuda_check(rc, what, device_.index());
    }
  }

  template <class T>
  void fill(T* p, std::int64_t n, T v) {
    detail::for_each_index(policy(), n, detail::fill_with<T>{p, v});
    check_launch("fill");
  }

  static int checked_int(std::int64_t v, const gemm_geometry& g) {
    if (v > INT32_MAX)
      throw std::length_error("distribute: a matrix product beyond cuBLAS's 32-bit sizes " + g.to_string());
    return static_cast<int>(v);
  }

  cublasHandle_t blas() {
    if (!blas_) blas_ = std::make_unique<detail::cublas_handle>(device_.index(), stream());
    return blas_->get();
  }

  // A device buffer of at least `count` 16-bit values, kept between calls (grown in stream order; a
  // scratch_buffer, which CUDA graphs that captured it keep alive).
  void* halves(std::int64_t count) {
    return halves_.get(device_.index(), static_cast<std::size_t>(count) * 2, stream());
  }
  template <class H>
  void narrow(const float* from, std::int64_t n, H* to) {
    thrust::transform(policy(), from, from + n, to, detail::narrow_to<H>{});
    check_launch("narrowing to 16 bits");
  }
  void check_half(compute_precision p) {
    if (p != compute_precision::bfloat16) return;
    if (capability_major_ < 0)  // asked once: a bfloat16 model sets the precision on every pass
      detail::cuda_check(cudaDeviceGetAttribute(&capability_major_, cudaDevAttrComputeCapabilityMajor, device_.index()),
                         "cudaDeviceGetAttribute", device_.index());
    const int major = capability_major_;
    if (major < 8)
      throw std::invalid_argument("distribute: bfloat16 compute needs a GPU of compute capability 8.0 or later; " +
                                  device_.name() + " is " + std::to_string(major) + ".x (use float16 or float32)");
  }

#if DISTRIBUTE_CUDA_ENGINE_HAS_CUDNN
  template <class T>
  detail::cudnn_convolutions& convolutions(const char* pass, const conv_geometry& g) {
    static_assert(std::is_same_v<T, float>, "distribute: the GPU engine's convolutions are float32");
    (void)pass;
    g.check();
    if (!cudnn_) cudnn_ = std::make_unique<detail::cudnn_convolutions>(device_.index(), stream(), options_);
    return *cudnn_;
  }
  std::unique_ptr<detail::cudnn_convolutions> cudnn_;
#else
  // Without cuDNN a convolution cannot run on the GPU: a clear error rather than a slow fallback.
  struct no_convolutions {
    template <class... A>
    void forward(A&&...) {}
    template <class... A>
    void backward_data(A&&...) {}
    template <class... A>
    void backward_weights(A&&...) {}
  };
  template <class T>
  no_convolutions convolutions(const char* pass, const conv_geometry& g) {
    throw std::runtime_error(
        std::string("distribute: ") + pass + " " + g.to_string() + " on " + device_.name() +
        ": this build has no cuDNN (the GPU engine's convolutions need cuDNN and the cudnn-frontend "
        "headers; scripts/setup.sh fetches them where CUDA is installed)");
  }
#endif

  compute_options options_;
  cuda device_;
  compute_precision precision_;
  std::unique_ptr<detail::cublas_handle> blas_;
  int capability_major_ = -1;      // the device's compute capability (major), once asked
  detail::scratch_buffer halves_;  // 16-bit operands of mixed-precision products
};

static_assert(compute_engine<engine<cuda>>);

}  // namespace distribute
