#pragma once
// Convolutions on a GPU with cuDNN, through NVIDIA's cudnn-frontend graph API: the three passes the
// GPU engine (cuda/engine/cuda.cuh) computes for convolution and transposed-convolution layers. One
// object per replica engine, holding a cuDNN handle bound to the replica's stream, the plans it has
// built and one workspace. Every call is queued on that stream and returns without waiting.
//
// This is the only header that includes the frontend, which costs every translation unit that
// includes it over a minute of compile time (on a 2-core machine; half of what it would be with the
// frontend's JSON support, which the CMake target leaves out). The class exists where the build has
// cuDNN, nvrtc and the frontend's headers: DISTRIBUTE_HAS_CUDNN (config.hpp), which CMake's
// distribute::cuda defines where it found all three (scripts/setup.sh fetches the headers where CUDA
// is installed). Elsewhere this header declares nothing.
//
// The header is over 600 lines because it is one class, whose three passes share its handle, plan
// cache and workspace, and because it stays the only header that includes the frontend.
//
// The graphs (float32 in and out unless mixed precision, float32 compute, logical NCHW tensors with explicit contiguous
// strides; weights [out, in, k, k]):
//   forward           conv_fprop(x, w) -> y; with a bias, a pointwise ADD of the bias tensor
//                     [1, C, 1, 1] fused into the same graph. cuDNN runs such a graph with its
//                     runtime-fusion engines, which do not cover every float32 case (with TF32 not
//                     allowed, none may be left): where no engine takes the fused graph, the plan is
//                     the convolution alone and a kernel adds the bias after it. Decided once, when
//                     the plan is built; the values are the same either way.
//   backward data     conv_dgrad(dy, w) -> dx, overwriting dx.
//   backward weights  conv_wgrad(dy, x) into scratch memory, then a kernel adds it to dw (dw +=).
//                     cuDNN's weight gradient overwrites its output (the frontend fixes the
//                     operation's beta at 0); fusing an ADD of the old dw into the graph would need a
//                     runtime-fusion engine for a float32 weight gradient with an epilogue, which
//                     cuDNN does not promise, and would read and write dw in one graph, which the
//                     graph API does not promise to allow either. The bias gradient (db += the sum of
//                     dy per output channel) is CUB's segmented reduction, in double, cut into chunks
//                     as the engine's sums are (segmented_reduce.cuh), so that a layer of 3 output
//                     channels is not 3 blocks; fixed orders, so the bits are the same from run to
//                     run, with the += in the last stage's epilogue. A cuDNN reduction graph would
//                     need a second graph or kernel for the add.
//
// Plans are cached in the object, one per (geometry, pass, bias or not, pointer alignment, precision):
// a graph is built once (validate, build_operation_graph, create_execution_plans with heuristics
// mode A and then the fallback list, the engine filters below, check_support, build_plans: the first
// engine in heuristics order whose plan builds) and afterwards only executed, with a variant pack of
// the call's device pointers. Pointers that are not all 16-byte aligned (a tensor inside a larger
// buffer) get a plan of their own, built for 4-byte alignment.
//
// Autotune (compute_options::conv_autotune, off by default): build_plans builds every engine that
// passes the filters, and the plan's first run outside a CUDA graph's capture times each of them on
// that call's operands (the cudnn-frontend's autotune: a warm-up run, then timed runs until the time
// stops improving by 5%, waiting for the device) and keeps the fastest, as PyTorch's
// cudnn.benchmark does. The timing runs write the call's outputs (a weight gradient: its scratch),
// which the call then writes again. The engine that wins depends on timing, so two runs may compute
// a shape with different engines; each engine is deterministic either way.
//
// The default choice (compute_options::deterministic with deterministic_conv_slowdown, 1.5): every
// deterministic engine within the workspace limit is built and timed at the plan's first eager run
// as autotune does, the fastest kept; then that engine and cuDNN's first choice among all engines
// (a second graph, the rival, built with the same precision and limit) are timed on the call's
// operands, each as the frontend's autotune times (a warm-up, then runs until the time stops
// improving by 5%). The deterministic engine stays unless it takes more than the slowdown times the
// rival's time; otherwise the rival's graph replaces it, the plan says why
// (nondeterministic_convolutions()) and so does one line on stderr. Either way the choice is made
// before the plan's first result and kept. On the H100, cuDNN's first deterministic data gradient
// for the 7x7 3->64 convolution at 256x256 ran on 3 blocks at 14 ms a call: timing finds the
// deterministic engines cuDNN ranks lower, and the rival bounds what determinism may cost.
//
// Engine filters. TF32 is chosen by the call's precision, never by default: under `float32`,
// engines with the TENSOR_CORE or DOWN_CONVERT_INPUTS numerical notes are removed (on Ampere and
// later those compute float32 convolutions in TF32, a 10-bit mantissa), so the results match the
// CPU engine to float rounding; under `tf32` they are allowed, which is several times faster
// and about 1e-3 relative. Under compute_options::deterministic (the default) engines with the
// NONDETERMINISTIC note are removed: a fixed configuration gives the same bits from run to run.
// Off, they stay, as in PyTorch's default: cuDNN's fastest data and weight gradients for many
// shapes add partial sums with atomics. Engines needing more workspace than
// compute_options::conv_workspace_limit are removed too, in both modes and with autotune; where that
// leaves none that builds, the plan is built without the limit and workspace_limit_exceeded() says
// so. What is left keeps the heuristics' order (detail/conv_engine_filter.hpp, tested on the CPU).
//
// Mixed precision (`bfloat16`, `float16`): the operands are narrowed to 16-bit copies (Thrust, on
// the stream, in a buffer kept between calls), the graph's tensors are 16-bit with float
// accumulation (tensor cores), and the result is widened back to float: y and dx overwritten, the
// weight gradient added to dw in float, the bias added in float after the convolution (not fused).
// Where cuDNN has no 16-bit engine for a geometry (building the plan fails), that plan is TF32
// instead, and `precision_fallbacks()` says why; the plan key holds the precision asked for.
//
// Workspace: one device buffer per object, grown when a plan needs more, allocated and freed in the
// order of the replica's stream (the library's pool, cuda/device/memory.cuh), so growing it waits for nothing.
//
// Errors: every cuDNN, frontend or CUDA failure is an exception naming the pass, the geometry and
// the device, with cuDNN's message: "distribute: cuDNN conv forward [2x3x16x16 -> 8x16x16, kernel 3,
// stride 1, padding 1] on cuda:0 failed: ...". A geometry that is invalid, or whose output extents
// are not floor((H + 2p - k) / s) + 1 (the only ones cuDNN computes), is an std::invalid_argument.

#include <distribute/config.hpp>
#include <distribute/cuda/device/half_conversions.cuh>

#if !DISTRIBUTE_HAS_CUDA
#  error "<distribute/cuda/engine/detail/cudnn_conv.cuh> needs nvcc and the CUDA toolkit (link distribute::cuda)"
#endif

#if DISTRIBUTE_HAS_CUDNN

#  include <distribute/cuda/device/cuda.cuh>
#  include <distribute/cuda/engine/detail/segmented_reduce.cuh>
#  include <distribute/cuda/engine/detail/thrust_for_each.hpp>
#  include <distribute/cuda/tensor/tensor.cuh>
#  include <distribute/engine/conv_geometry.hpp>
#  include <distribute/engine/detail/conv_engine_filter.hpp>
#  include <distribute/engine/engine.hpp>

#  include <cuda_bf16.h>
#  include <cuda_fp16.h>
#  include <cuda_runtime.h>
#  include <cudnn.h>
#  include <cudnn_frontend.h>
#  include <thrust/iterator/counting_iterator.h>
#  include <thrust/iterator/tabulate_output_iterator.h>
#  include <thrust/iterator/transform_iterator.h>
#  include <thrust/system/cuda/execution_policy.h>
#  include <thrust/transform.h>

#  include <algorithm>
#  include <array>
#  include <cstddef>
#  include <cstdio>
#  include <cstdint>
#  include <exception>
#  include <initializer_list>
#  include <limits>
#  include <map>
#  include <memory>
#  include <new>
#  include <stdexcept>
#  include <string>
#  include <type_traits>
#  include <unordered_map>
#  include <utility>
#  include <vector>

namespace distribute::detail {

namespace cudnn_conv_kernels {

constexpr int threads = 256;

inline unsigned int blocks_for(std::int64_t n) {
  return static_cast<unsigned int>(std::clamp<std::int64_t>((n + threads - 1) / threads, 1, 4096));
}

// y[i] += bias[channel of i], over NCHW y of `channels` planes of `plane` elements.
template <class T>
__global__ void add_channel_bias(T* y, const T* bias, std::int64_t n, std::int64_t plane, std::int64_t channels) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] += bias[(i / plane) % channels];
}

// to[i] += from[i].
template <class T>
__global__ void accumulate(T* to, const T* from, std::int64_t n) {
  for (std::int64_t i = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    to[i] += from[i];
}

// A float plus a 16-bit value (mixed precision's conversions: cuda/device/half_conversions.cuh).
template <class H>
struct add_widened {
  __host__ __device__ float operator()(float a, H b) const { return a + distribute::detail::widen_from<H>{}(b); }
};

}  // namespace cudnn_conv_kernels

class cudnn_convolutions {
 public:
  // One per replica engine: `ordinal` the GPU, `stream` the replica's stream. Each call says the
  // precision it computes in (engine.hpp's compute_precision, the engine's current one). `autotune`
  // (compute_options::conv_autotune): each plan times every engine cuDNN offers for it at its first
  // eager run and keeps the fastest (see the top of this file).
  cudnn_convolutions(int ordinal, cudaStream_t stream, bool autotune = false)
      : cudnn_convolutions(ordinal, stream, compute_options{.conv_autotune = autotune}) {}
  // `options`: conv_autotune, deterministic and conv_workspace_limit say which engines are
  // considered (engine/detail/conv_engine_filter.hpp); the rest are the engine's, not ours.
  cudnn_convolutions(int ordinal, cudaStream_t stream, const compute_options& options)
      : ordinal_{ordinal}, stream_{stream}, options_{options} {
    device_guard guard(ordinal_);
    if (const cudnnStatus_t rc = cudnnCreate(&handle_); rc != CUDNN_STATUS_SUCCESS) {
      handle_ = nullptr;
      throw std::runtime_error("distribute: cudnnCreate on cuda:" + std::to_string(ordinal_) +
                               " failed: " + cudnnGetErrorString(rc));
    }
    if (const cudnnStatus_t rc = cudnnSetStream(handle_, stream_); rc != CUDNN_STATUS_SUCCESS) {
      (void)cudnnDestroy(handle_);
      handle_ = nullptr;
      throw std::runtime_error("distribute: cudnnSetStream on cuda:" + std::to_string(ordinal_) +
                               " failed: " + cudnnGetErrorString(rc));
    }
  }
  cudnn_convolutions(const cudnn_convolutions&) = delete;
  cudnn_convolutions& operator=(const cudnn_convolutions&) = delete;
  ~cudnn_convolutions() {
    device_guard guard(ordinal_, std::nothrow);
    plans_.clear();
    workspace_ = scratch_buffer{};  // freed in the stream's order, after the work that used it
    halves_ = scratch_buffer{};
    if (handle_ != nullptr) (void)cudnnDestroy(handle_);
  }

  // y = conv(x, w) + bias; `bias` may be null.
  void forward(const conv_geometry& g, const float* x, const float* w, const float* bias, float* y,
               compute_precision precision = compute_precision::float32) {
    check_geometry(pass::forward, g);
    if (g.batch == 0) return;
    device_guard guard(ordinal_);
    if (is_half(precision)) {
      plan& h = plan_for(pass::forward, g, false, true, precision);
      if (is_half(h.precision)) {
        with_half_type(h.precision, [&](auto tag) {
          using H = decltype(tag);
          const auto [hx, hw, hy] = halves<H>(g.input_size(), g.weight_size(), g.output_size());
          narrow_into(x, g.input_size(), hx);
          narrow_into(w, g.weight_size(), hw);
          std::unordered_map<std::int64_t, void*> pack{{uid_x, hx}, {uid_w, hw}, {uid_y, hy}};
          execute(pass::forward, g, h, pack, 0);
          widen_into(hy, g.output_size(), y);
        });
        if (bias != nullptr) add_bias(g, bias, y);
        return;
      }
      precision = h.precision;  // no 16-bit plan for this geometry: the fallback's
    }
    plan& p = plan_for(pass::forward, g, bias != nullptr, aligned({x, w, bias, y}), precision);
    std::unordered_map<std::int64_t, void*> pack{
        {uid_x, const_cast<float*>(x)}, {uid_w, const_cast<float*>(w)}, {uid_y, y}};
    if (bias != nullptr && p.fused_bias) pack.emplace(uid_bias, const_cast<float*>(bias));
    execute(pass::forward, g, p, pack, 0);
    if (bias != nullptr && !p.fused_bias) add_bias(g, bias, y);
  }

  // dx = the data gradient of the convolution for dy (overwritten).
  void backward_data(const conv_geometry& g, const float* dy, const float* w, float* dx,
                     compute_precision precision = compute_precision::float32) {
    check_geometry(pass::backward_data, g);
    if (g.batch == 0) return;
    device_guard guard(ordinal_);
    if (is_half(precision)) {
      plan& h = plan_for(pass::backward_data, g, false, true, precision);
      if (is_half(h.precision)) {
        with_half_type(h.precision, [&](auto tag) {
          using H = decltype(tag);
          const auto [hdy, hw, hdx] = halves<H>(g.output_size(), g.weight_size(), g.input_size());
          narrow_into(dy, g.output_size(), hdy);
          narrow_into(w, g.weight_size(), hw);
          std::unordered_map<std::int64_t, void*> pack{{uid_y, hdy}, {uid_w, hw}, {uid_x, hdx}};
          execute(pass::backward_data, g, h, pack, 0);
          widen_into(hdx, g.input_size(), dx);
        });
        return;
      }
      precision = h.precision;
    }
    plan& p = plan_for(pass::backward_data, g, false, aligned({dy, w, dx}), precision);
    std::unordered_map<std::int64_t, void*> pack{
        {uid_y, const_cast<float*>(dy)}, {uid_w, const_cast<float*>(w)}, {uid_x, dx}};
    execute(pass::backward_data, g, p, pack, 0);
  }

  // dw += the weight gradient for (x, dy); db += the sum of dy per output channel (db may be null).
  void backward_weights(const conv_geometry& g, const float* x, const float* dy, float* dw, float* db,
                        compute_precision precision = compute_precision::float32) {
    check_geometry(pass::backward_weights, g);
    if (g.batch == 0) return;
    device_guard guard(ordinal_);
    const std::int64_t n = g.weight_size();
    bool done = false;
    if (is_half(precision)) {
      plan& h = plan_for(pass::backward_weights, g, false, true, precision);
      if (is_half(h.precision)) {
        // The 16-bit gradient goes to scratch behind cuDNN's workspace and is added to dw in float.
        with_half_type(h.precision, [&](auto tag) {
          using H = decltype(tag);
          const auto [hx, hdy, unused] = halves<H>(g.input_size(), g.output_size(), 0);
          (void)unused;
          narrow_into(x, g.input_size(), hx);
          narrow_into(dy, g.output_size(), hdy);
          void* scratch = nullptr;
          std::unordered_map<std::int64_t, void*> pack{{uid_x, hx}, {uid_y, hdy}};
          execute(pass::backward_weights, g, h, pack, static_cast<std::size_t>(n) * sizeof(H), &scratch);
          thrust::transform(thrust::cuda::par_nosync.on(stream_), dw, dw + n, static_cast<const H*>(scratch), dw,
                            cudnn_conv_kernels::add_widened<H>{});
          check_launch(pass::backward_weights, g, "adding the 16-bit weight gradient");
        });
        done = true;
      } else {
        precision = h.precision;
      }
    }
    if (!done) {
      // The gradient is written to scratch behind cuDNN's workspace, then added to dw.
      plan& p = plan_for(pass::backward_weights, g, false, aligned({x, dy}), precision);
      void* scratch = nullptr;
      std::unordered_map<std::int64_t, void*> pack{{uid_x, const_cast<float*>(x)}, {uid_y, const_cast<float*>(dy)}};
      execute(pass::backward_weights, g, p, pack, static_cast<std::size_t>(n) * sizeof(float), &scratch);
      cudnn_conv_kernels::accumulate<float>
          <<<cudnn_conv_kernels::blocks_for(n), cudnn_conv_kernels::threads, 0, stream_>>>(
              dw, static_cast<const float*>(scratch), n);
      check_launch(pass::backward_weights, g, "the kernel adding the weight gradient");
    }
    if (const std::int64_t plane = g.out_height * g.out_width; db != nullptr && g.batch * plane > 0) {
      const auto terms =
          thrust::make_transform_iterator(thrust::counting_iterator<std::int64_t>(0),
                                          thrust_loops::channel_term<float>{dy, g.batch, g.out_channels, plane});
      planned_segmented_sum(ordinal_, stream_, g.out_channels, g.batch * plane, terms,
                            thrust::make_tabulate_output_iterator(thrust_loops::add_sum_to<float>{db}));
      check_launch(pass::backward_weights, g, "the bias gradient's sums");
    }
  }

  // Plans built so far (one per geometry, pass and variant; a 16-bit request that fell back to TF32
  // is not one): for tests.
  std::size_t cached_plans() const noexcept {
    std::size_t n = 0;
    for (const auto& [key, p] : plans_) n += p->graph != nullptr;
    return n;
  }
  // Plans whose engine was chosen by timing (conv_autotune, or the default deterministic choice),
  // and the engine configurations cuDNN listed for them in all (those that did not build were not
  // timed): for tests and logs.
  std::size_t tuned_plans() const noexcept {
    std::size_t n = 0;
    for (const auto& [key, p] : plans_) n += p->tuned_from > 0;
    return n;
  }
  std::size_t tuned_candidates() const noexcept {
    std::size_t n = 0;
    for (const auto& [key, p] : plans_) n += static_cast<std::size_t>(p->tuned_from);
    return n;
  }
  // Convolutions that took cuDNN's first choice over the fastest deterministic engine, which was more
  // than compute_options::deterministic_conv_slowdown times slower, with both times, one line each
  // (each also said once on stderr): for logs.
  std::vector<std::string> nondeterministic_convolutions() const {
    std::vector<std::string> out;
    for (const auto& [key, p] : plans_)
      if (!p->nondeterministic_because.empty()) out.push_back(p->nondeterministic_because);
    return out;
  }
  // Why 16-bit plans were replaced by TF32 ones (no cuDNN engine for that geometry in 16 bits), one
  // line each: for logs.
  std::vector<std::string> precision_fallbacks() const {
    std::vector<std::string> out;
    for (const auto& [key, p] : plans_)
      if (!p->fallback_because.empty()) out.push_back(p->fallback_because);
    return out;
  }
  // Plans whose engine needs more workspace than conv_workspace_limit (no engine within it built), and
  // why the limited build failed, one line each: for logs.
  std::vector<std::string> workspace_limit_exceeded() const {
    std::vector<std::string> out;
    for (const auto& [key, p] : plans_)
      if (!p->over_workspace_limit_because.empty()) out.push_back(p->over_workspace_limit_because);
    return out;
  }
  // Bytes of the workspace (cuDNN's, and the weight-gradient scratch) held now.
  std::size_t workspace_bytes() const noexcept { return workspace_.bytes(); }
  // Bytes of replaced workspaces and 16-bit buffers kept because a CUDA graph captured them.
  std::size_t retired_bytes() const noexcept { return workspace_.retired_bytes() + halves_.retired_bytes(); }

 private:
  enum class pass { forward, backward_data, backward_weights };
  static const char* name(pass p) noexcept {
    switch (p) {
      case pass::forward: return "forward";
      case pass::backward_data: return "backward data";
      default: return "backward weights";
    }
  }

  // Tensor ids in the variant pack: x (or dx), w (or dw), y (or dy), the bias.
  static constexpr std::int64_t uid_x = 1, uid_w = 2, uid_y = 3, uid_bias = 4;
  static constexpr std::size_t scratch_alignment = 256;

  struct plan {
    std::unique_ptr<cudnn_frontend::graph::Graph> graph;
    std::int64_t workspace = 0;                                // bytes cuDNN needs
    bool fused_bias = false;                                   // the graph adds the bias (forward with a bias)
    std::string unfused_because;                               // why not, where it was asked for
    compute_precision precision = compute_precision::float32;  // what the plan computes in
    std::string fallback_because;                              // a 16-bit plan was asked for: why this one is TF32
    std::string over_workspace_limit_because;                  // no engine within conv_workspace_limit built: why
    // How many engines were timed (conv_autotune, or the default deterministic choice; every one
    // built at least one). 0: not timed yet, or no timing (the heuristics' first choice).
    std::int64_t tuned_from = 0;
    bool tune_pending = false;  // every engine the filter left was built, to be timed at the first eager run
    // cuDNN's first choice among all engines, timed against the deterministic one at the first
    // eager run (compute_options::deterministic_conv_slowdown), then dropped or taken.
    std::unique_ptr<plan> rival;
    std::string nondeterministic_because;  // the rival was taken: why
  };
  using plan_key = std::array<std::int64_t, 14>;

  // --- errors -------------------------------------------------------------------------------------

  std::string prefix(pass p, const conv_geometry& g) const {
    return std::string("distribute: cuDNN conv ") + name(p) + " " + g.to_string() +
           " on cuda:" + std::to_string(ordinal_) + " failed: ";
  }
  [[noreturn]] void fail(pass p, const conv_geometry& g, const std::string& what) const {
    throw std::runtime_error(prefix(p, g) + what);
  }
  void check_geometry(pass p, const conv_geometry& g) const {
    try {
      g.check();
    } catch (const std::invalid_argument&) {
      throw std::invalid_argument(prefix(p, g) + "the geometry is invalid");
    }
    const std::int64_t h = (g.in_height + 2 * g.pad - g.kernel) / g.stride + 1;
    const std::int64_t w = (g.in_width + 2 * g.pad - g.kernel) / g.stride + 1;
    if (g.out_height != h || g.out_width != w)
      throw std::invalid_argument(prefix(p, g) + "its output is " + std::to_string(g.out_height) + "x" +
                                  std::to_string(g.out_width) + ", but this input, kernel, stride and padding give " +
                                  std::to_string(h) + "x" + std::to_string(w) + " (floor((H + 2p - k) / s) + 1)");
  }
  // A frontend step: its error, or an exception it throws, becomes ours.
  template <class F>
  void step(pass p, const conv_geometry& g, const char* what, F&& f) const {
    bool failed = false;
    std::string message;
    try {
      cudnn_frontend::error_t status = f();
      failed = status.is_bad();
      if (failed) message = status.get_message();
    } catch (const std::exception& e) {
      failed = true;
      message = e.what();
    }
    if (failed) fail(p, g, std::string(what) + ": " + message);
  }
  void add_bias(const conv_geometry& g, const float* bias, float* y) {
    const std::int64_t n = g.output_size();
    cudnn_conv_kernels::add_channel_bias<float>
        <<<cudnn_conv_kernels::blocks_for(n), cudnn_conv_kernels::threads, 0, stream_>>>(
            y, bias, n, g.out_height * g.out_width, g.out_channels);
    check_launch(pass::forward, g, "the bias kernel");
  }

  // --- 16-bit operands ------------------------------------------------------------------------------

  template <class F>
  static void with_half_type(compute_precision p, F&& f) {
    if (p == compute_precision::bfloat16) f(__nv_bfloat16{});
    else f(__half{});
  }
  // Three 16-bit buffers of a, b and c elements, 256-byte aligned, in one allocation kept between
  // calls (grown in the stream's order, as the workspace is: a scratch_buffer, which graphs that
  // captured it keep alive).
  template <class H>
  std::array<H*, 3> halves(std::int64_t a, std::int64_t b, std::int64_t c) {
    const auto round = [](std::int64_t n) {
      return (static_cast<std::size_t>(n) * sizeof(H) + scratch_alignment - 1) / scratch_alignment * scratch_alignment;
    };
    const std::size_t need = round(a) + round(b) + round(c);
    char* base = static_cast<char*>(halves_.get(ordinal_, need, stream_));
    return {reinterpret_cast<H*>(base), reinterpret_cast<H*>(base + round(a)),
            reinterpret_cast<H*>(base + round(a) + round(b))};
  }
  template <class H>
  void narrow_into(const float* from, std::int64_t n, H* to) {
    thrust::transform(thrust::cuda::par_nosync.on(stream_), from, from + n, to, distribute::detail::narrow_to<H>{});
  }
  template <class H>
  void widen_into(const H* from, std::int64_t n, float* to) {
    thrust::transform(thrust::cuda::par_nosync.on(stream_), from, from + n, to, distribute::detail::widen_from<H>{});
  }

  void check_launch(pass p, const conv_geometry& g, const char* kernel) const {
    const cudaError_t rc = cudaPeekAtLastError();
    if (rc == cudaSuccess || rc == cudaErrorNotReady) return;
    (void)cudaGetLastError();
    throw cuda_error(
        rc, prefix(p, g) + "launching " + kernel + ": " + cudaGetErrorName(rc) + " (" + cudaGetErrorString(rc) + ")");
  }

  // --- plans --------------------------------------------------------------------------------------

  static bool aligned(std::initializer_list<const float*> pointers) noexcept {
    for (const float* q : pointers)
      if (reinterpret_cast<std::uintptr_t>(q) % 16 != 0) return false;
    return true;
  }

  plan& plan_for(pass p, const conv_geometry& g, bool bias, bool aligned16, compute_precision precision) {
    const plan_key key{g.batch, g.in_channels, g.in_height, g.in_width, g.out_channels, g.kernel,       g.stride,
                       g.pad,   g.out_height,  g.out_width, int(p),     int(bias),      int(aligned16), int(precision)};
    if (const auto it = plans_.find(key); it != plans_.end()) return *it->second;
    std::unique_ptr<plan> made;
    if (is_half(precision)) {
      // A 16-bit plan where cuDNN has an engine for this geometry; TF32 otherwise, saying why.
      // The fallback is recorded as a plan without a graph: the call then asks for the TF32 plan
      // of its own pointers' alignment (and bias), which is built once under its own key.
      try {
        made = build(p, g, false, true, precision);
      } catch (const std::runtime_error& e) {
        made = std::make_unique<plan>();
        made->precision = compute_precision::tf32;
        made->fallback_because = e.what();
      }
    } else if (p == pass::forward && bias) {
      // The fused graph where cuDNN has an engine for it; the convolution alone and the bias kernel
      // otherwise (see the top of this file).
      try {
        made = build(p, g, true, aligned16, precision);
      } catch (const std::runtime_error& e) {
        made = build(p, g, false, aligned16, precision);
        made->unfused_because = e.what();
      }
    } else {
      made = build(p, g, false, aligned16, precision);
    }
    return *plans_.emplace(key, std::move(made)).first->second;
  }

  // A plan with the engines conv_engine_filter allows, and its rival where the filter asks for one
  // (a rival that does not build leaves the deterministic choice standing).
  std::unique_ptr<plan> build(pass p, const conv_geometry& g, bool fuse_bias, bool aligned16,
                              compute_precision precision) const {
    const conv_engine_filter filter = conv_engine_filter_for(precision, options_);
    auto made = build_within_limit(p, g, fuse_bias, aligned16, precision, filter);
    made->tune_pending = filter.build_all;
    if (filter.slowdown > 0) {
      try {
        made->rival = build_within_limit(p, g, fuse_bias, aligned16, precision, filter.rival());
      } catch (const std::runtime_error&) {
        made->rival.reset();
      }
    }
    return made;
  }
  // Where the workspace limit leaves no engine that builds, without the limit.
  std::unique_ptr<plan> build_within_limit(pass p, const conv_geometry& g, bool fuse_bias, bool aligned16,
                                           compute_precision precision, const conv_engine_filter& filter) const {
    if (filter.workspace_limit == 0) return build(p, g, fuse_bias, aligned16, precision, filter);
    try {
      return build(p, g, fuse_bias, aligned16, precision, filter);
    } catch (const std::runtime_error& e) {
      auto made = build(p, g, fuse_bias, aligned16, precision, filter.without_workspace_limit());
      made->over_workspace_limit_because = e.what();
      return made;
    }
  }
  std::unique_ptr<plan> build(pass p, const conv_geometry& g, bool fuse_bias, bool aligned16,
                              compute_precision precision, const conv_engine_filter& filter) const {
    namespace fe = cudnn_frontend;
    using tensor = fe::graph::Tensor_attributes;
    auto result = std::make_unique<plan>();
    result->precision = precision;
    result->graph = std::make_unique<fe::graph::Graph>();
    fe::graph::Graph& graph = *result->graph;
    // The tensors' type: float, or the 16-bit copies under mixed precision; the arithmetic is float.
    const fe::DataType_t io = precision == compute_precision::bfloat16  ? fe::DataType_t::BFLOAT16
                              : precision == compute_precision::float16 ? fe::DataType_t::HALF
                                                                        : fe::DataType_t::FLOAT;
    graph.set_io_data_type(io)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const std::int64_t alignment = aligned16 ? 16 : static_cast<std::int64_t>(sizeof(float));
    // A logical NCHW tensor, contiguous.
    const auto describe = [&](tensor& t, const char* label, std::int64_t uid, std::int64_t n, std::int64_t c,
                              std::int64_t h, std::int64_t w) -> tensor& {
      return t.set_name(label)
          .set_uid(uid)
          .set_dim({n, c, h, w})
          .set_stride({c * h * w, h * w, w, 1})
          .set_data_type(io)
          .set_alignment(alignment);
    };
    const auto input = [&](const char* label, std::int64_t uid, std::int64_t n, std::int64_t c, std::int64_t h,
                           std::int64_t w) {
      tensor t;
      return graph.tensor(describe(t, label, uid, n, c, h, w));
    };
    const auto output = [&](const std::shared_ptr<tensor>& t, const char* label, std::int64_t uid, std::int64_t n,
                            std::int64_t c, std::int64_t h,
                            std::int64_t w) { describe(t->set_output(true), label, uid, n, c, h, w); };
    const std::vector<std::int64_t> padding{g.pad, g.pad}, stride{g.stride, g.stride}, dilation{1, 1};

    try {
      switch (p) {
        case pass::forward: {
          const auto x = input("x", uid_x, g.batch, g.in_channels, g.in_height, g.in_width);
          const auto w = input("w", uid_w, g.out_channels, g.in_channels, g.kernel, g.kernel);
          auto y = graph.conv_fprop(x, w,
                                    fe::graph::Conv_fprop_attributes()
                                        .set_name("conv")
                                        .set_padding(padding)
                                        .set_stride(stride)
                                        .set_dilation(dilation)
                                        .set_compute_data_type(fe::DataType_t::FLOAT));
          if (fuse_bias) {
            const auto b = input("bias", uid_bias, 1, g.out_channels, 1, 1);
            // Virtual: the convolution's result inside the graph, laid out like the output.
            y->set_data_type(fe::DataType_t::FLOAT)
                .set_dim({g.batch, g.out_channels, g.out_height, g.out_width})
                .set_stride({g.out_channels * g.out_height * g.out_width, g.out_height * g.out_width, g.out_width, 1});
            y = graph.pointwise(y, b,
                                fe::graph::Pointwise_attributes()
                                    .set_name("bias")
                                    .set_mode(fe::PointwiseMode_t::ADD)
                                    .set_compute_data_type(fe::DataType_t::FLOAT));
            result->fused_bias = true;
          }
          output(y, "y", uid_y, g.batch, g.out_channels, g.out_height, g.out_width);
          break;
        }
        case pass::backward_data: {
          const auto dy = input("dy", uid_y, g.batch, g.out_channels, g.out_height, g.out_width);
          const auto w = input("w", uid_w, g.out_channels, g.in_channels, g.kernel, g.kernel);
          const auto dx = graph.conv_dgrad(dy, w,
                                           fe::graph::Conv_dgrad_attributes()
                                               .set_name("dgrad")
                                               .set_padding(padding)
                                               .set_stride(stride)
                                               .set_dilation(dilation)
                                               .set_compute_data_type(fe::DataType_t::FLOAT));
          output(dx, "dx", uid_x, g.batch, g.in_channels, g.in_height, g.in_width);
          break;
        }
        case pass::backward_weights: {
          const auto dy = input("dy", uid_y, g.batch, g.out_channels, g.out_height, g.out_width);
          const auto x = input("x", uid_x, g.batch, g.in_channels, g.in_height, g.in_width);
          const auto dw = graph.conv_wgrad(dy, x,
                                           fe::graph::Conv_wgrad_attributes()
                                               .set_name("wgrad")
                                               .set_padding(padding)
                                               .set_stride(stride)
                                               .set_dilation(dilation)
                                               .set_compute_data_type(fe::DataType_t::FLOAT));
          output(dw, "dw", uid_w, g.out_channels, g.in_channels, g.kernel, g.kernel);
          break;
        }
      }
    } catch (const std::exception& e) {
      fail(p, g, std::string("describing the graph: ") + e.what());
    }

    step(p, g, "validate", [&] { return graph.validate(); });
    step(p, g, "build_operation_graph", [&] { return graph.build_operation_graph(handle_); });
    step(p, g, "create_execution_plans",
         [&] { return graph.create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK}); });
    // No TF32 unless asked for; no engine whose sums depend on timing unless determinism is off; no
    // workspace beyond the limit (see the top of this file). The heuristics' order stays.
    try {
      std::vector<fe::NumericalNote_t> notes;
      if (filter.exclude_tf32) notes = {fe::NumericalNote_t::TENSOR_CORE, fe::NumericalNote_t::DOWN_CONVERT_INPUTS};
      if (filter.exclude_nondeterministic) notes.push_back(fe::NumericalNote_t::NONDETERMINISTIC);
      if (!notes.empty()) graph.deselect_numeric_notes(notes);
      if (filter.workspace_limit > 0) graph.deselect_workspace_greater_than(filter.workspace_limit);
    } catch (const std::exception& e) {
      fail(p, g, std::string("deselecting engines: ") + e.what());
    }
    step(p, g, "check_support", [&] { return graph.check_support(); });
    // Timed at the first eager run (autotune, the default deterministic choice): every engine that
    // builds, the heuristics' first one chosen until then.
    step(p, g, "build_plans", [&] {
      return graph.build_plans(filter.build_all ? fe::BuildPlanPolicy_t::ALL
                                                : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE);
    });
    step(p, g, "get_workspace_size", [&] { return graph.get_workspace_size(result->workspace); });
    return result;
  }

  // --- execution ----------------------------------------------------------------------------------

  static std::size_t scratch_offset(std::int64_t cudnn_bytes) noexcept {
    const auto b = static_cast<std::size_t>(cudnn_bytes);
    return (b + scratch_alignment - 1) / scratch_alignment * scratch_alignment;
  }

  // Runs plan `p` on the stream with `pack`, in a workspace of cuDNN's bytes plus `scratch_bytes` of
  // scratch behind them (returned in `*scratch`, which the pack gets as the weight gradient).
  void execute(pass ps, const conv_geometry& g, plan& p, std::unordered_map<std::int64_t, void*>& pack,
               std::size_t scratch_bytes, void** scratch = nullptr) {
    if (p.tune_pending && !stream_capturing(stream_)) tune(ps, g, p, pack, scratch_bytes);
    char* base = bind_workspace(ps, g, p, pack, scratch_bytes);
    if (scratch != nullptr) *scratch = base + scratch_offset(p.workspace);
    step(ps, g, p.unfused_because.empty() ? "execute" : "execute (the bias unfused)",
         [&] { return p.graph->execute(handle_, pack, p.workspace > 0 ? static_cast<void*>(base) : nullptr); });
  }

  // The workspace for plan `q`, with `scratch_bytes` of scratch behind cuDNN's bytes where asked for
  // (the pack's weight gradient then points at it): where the workspace starts.
  char* bind_workspace(pass ps, const conv_geometry& g, const plan& q, std::unordered_map<std::int64_t, void*>& pack,
                       std::size_t scratch_bytes) {
    const std::size_t offset = scratch_offset(q.workspace);
    char* base = workspace(ps, g, scratch_bytes > 0 ? offset + scratch_bytes : static_cast<std::size_t>(q.workspace));
    if (scratch_bytes > 0) pack[uid_w] = base + offset;
    return base;
  }

  // The workspace, grown to `need` bytes where it is smaller (a scratch_buffer: one a CUDA graph
  // captured stays valid for its replays).
  char* workspace(pass ps, const conv_geometry& g, std::size_t need) {
    try {
      return static_cast<char*>(workspace_.get(ordinal_, need, stream_));
    } catch (const std::exception& e) {
      fail(ps, g, std::string("allocating its workspace: ") + e.what());
    }
  }

  // conv_autotune or the default deterministic choice: runs every engine built for plan `p` on this call's operands (the outputs it
  // writes are written again by the call itself; a weight gradient goes to scratch) in a workspace
  // large enough for the largest, and keeps the fastest (the cudnn-frontend's autotune: cuDNN's
  // timing loop, which waits for the device). Not inside a CUDA graph's capture, where nothing may
  // wait: the plan is then timed at its next eager run.
  void tune(pass ps, const conv_geometry& g, plan& p, std::unordered_map<std::int64_t, void*>& pack,
            std::size_t scratch_bytes) {
    const std::int64_t candidates = p.graph->get_execution_plan_count();
    const std::size_t offset = scratch_offset(p.graph->get_autotune_workspace_size());
    char* base = workspace(ps, g, offset + scratch_bytes);
    if (scratch_bytes > 0) pack[uid_w] = base + offset;
    step(ps, g, "autotune", [&] { return p.graph->autotune(handle_, pack, base); });
    step(ps, g, "get_workspace_size (after autotune)", [&] { return p.graph->get_workspace_size(p.workspace); });
    p.tuned_from = std::max<std::int64_t>(candidates, 1);
    p.tune_pending = false;
    if (p.rival != nullptr) race(ps, g, p, pack, scratch_bytes);
  }

  // The deterministic engine tune() kept against the rival, timed on this call's operands: the rival
  // replaces it where keeps_deterministic says so. A rival that fails to run is dropped.
  void race(pass ps, const conv_geometry& g, plan& p, std::unordered_map<std::int64_t, void*>& pack,
            std::size_t scratch_bytes) {
    const std::unique_ptr<plan> rival = std::move(p.rival);
    const double mine = time_plan(ps, g, p, pack, scratch_bytes);
    double theirs = 0;
    try {
      theirs = time_plan(ps, g, *rival, pack, scratch_bytes);
    } catch (const std::runtime_error&) {
      return;
    }
    // A rival exists only where the slowdown is finite and above 0 (conv_engine_filter_for).
    const double slowdown = options_.deterministic_conv_slowdown;
    if (keeps_deterministic(mine, theirs, slowdown)) return;
    p.graph = std::move(rival->graph);
    p.workspace = rival->workspace;
    p.over_workspace_limit_because = rival->over_workspace_limit_because;
    p.nondeterministic_because = "cuDNN conv " + std::string(name(ps)) + " " + g.to_string() +
                                 " on cuda:" + std::to_string(ordinal_) + ": the fastest deterministic engine took " +
                                 short_ms(mine) + ", cuDNN's first choice " + short_ms(theirs) + " (more than " +
                                 short_number(slowdown) +
                                 " times as long): it computes with cuDNN's choice, which may not be deterministic "
                                 "(compute_options::deterministic_conv_slowdown)";
    std::fprintf(stderr, "distribute: %s\n", p.nondeterministic_because.c_str());
  }
  static std::string short_number(double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.3g", v);
    return text;
  }
  static std::string short_ms(double ms) { return short_number(ms) + " ms"; }

  // Milliseconds plan `q` takes on the call's operands, as the frontend's autotune times an engine:
  // a warm-up run, then timed runs (events on the stream, waited for) until one is no longer 5%
  // faster than the best so far, at most 100. Not inside a capture (the caller checks).
  double time_plan(pass ps, const conv_geometry& g, plan& q, std::unordered_map<std::int64_t, void*>& pack,
                   std::size_t scratch_bytes) {
    char* base = bind_workspace(ps, g, q, pack, scratch_bytes);
    void* space = q.workspace > 0 ? static_cast<void*>(base) : nullptr;
    struct events {
      cudaEvent_t start = nullptr, stop = nullptr;
      ~events() {
        if (start != nullptr) (void)cudaEventDestroy(start);
        if (stop != nullptr) (void)cudaEventDestroy(stop);
      }
    } e;
    cuda_check(cudaEventCreate(&e.start), "cudaEventCreate", ordinal_);
    cuda_check(cudaEventCreate(&e.stop), "cudaEventCreate", ordinal_);
    step(ps, g, "timing an engine (warm-up)", [&] { return q.graph->execute(handle_, pack, space); });
    float best = std::numeric_limits<float>::max();
    for (int i = 0; i < 100; ++i) {
      cuda_check(cudaEventRecord(e.start, stream_), "cudaEventRecord", ordinal_);
      step(ps, g, "timing an engine", [&] { return q.graph->execute(handle_, pack, space); });
      cuda_check(cudaEventRecord(e.stop, stream_), "cudaEventRecord", ordinal_);
      cuda_check(cudaEventSynchronize(e.stop), "cudaEventSynchronize", ordinal_);
      float ms = 0;
      cuda_check(cudaEventElapsedTime(&ms, e.start, e.stop), "cudaEventElapsedTime", ordinal_);
      const bool better = ms < 0.95F * best;
      best = std::min(best, ms);
      if (!better) break;
    }
    return static_cast<double>(best);
  }

  int ordinal_;
  cudaStream_t stream_;
  compute_options options_;
  cudnnHandle_t handle_ = nullptr;
  scratch_buffer workspace_;
  scratch_buffer halves_;  // the 16-bit operands of mixed-precision passes
  std::map<plan_key, std::unique_ptr<plan>> plans_;
};

}  // namespace distribute::detail

#endif  // DISTRIBUTE_HAS_CUDNN
