// The GPU cost of training arithmetic, side by side in one run on one GPU: bench_nn's GPU counterpart.
//   - The bound: the device's measured peak, a square cuBLAS SGEMM (8192 x 8192 x 8192) in float32
//     (CUBLAS_PEDANTIC_MATH: no TF32, as the GPU engine computes float32) and with TF32 tensor cores
//     (CUBLAS_TF32_TENSOR_OP_MATH, as the engine computes with compute_options::tf32), in TFLOP/s;
//     measured at the start and again at the end of the run, so that a clock that moved shows.
//   - Ours: nn::conv2d and nn::conv_transpose2d on a GPU replica (one_device_strategy<cuda>: the GPU
//     engine, cuDNN) at bench_nn's cases, CycleGAN's demo and paper shapes (conv_cases.hpp), forward
//     and forward + backward (input and weight gradients), in float32 and in TF32; TFLOP/s and the
//     share of the bound of the same precision (measured at the start).
// FLOPs are counted as bench_nn counts them (conv_cases.hpp): a multiply-add is 2, a backward is
// twice the forward, a transposed convolution is the convolution it is the adjoint of.
// Timing: CUDA events on the replica's stream around a batch of calls, waited for before the next
// batch, so the GPU's work is what is counted, and so are the gaps where the host queues work more
// slowly than the GPU runs it (the small demo shapes). Each case is run forward and backward once
// before it is timed (cuDNN's plans are built on the first call of each shape and pass). Every figure
// is the median of 5 repetitions of at least 50 ms (10 ms with --quick).
//
//   bench_nn_gpu [--device N] [--quick]
//
// Without a visible GPU it says so and exits 1 (a benchmark, not a test).

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/engine/cuda.cuh>
#include <distribute/cuda/strategy/one_device_strategy.cuh>
#include <distribute/cuda/tensor/tensor.cuh>
#include <distribute/distribute.hpp>
#include <distribute/nn.hpp>

#include "bench_common.hpp"
#include "conv_cases.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <library_types.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;

namespace {

double min_seconds = 0.05;
constexpr int repetitions = 5;
constexpr int gemm_side = 8192;

// Two events on the current device, for timing work on a stream.
class event_pair {
 public:
  explicit event_pair(int ordinal) : ordinal_{ordinal} {
    dist::detail::cuda_check(cudaEventCreate(&start_), "cudaEventCreate", ordinal_);
    dist::detail::cuda_check(cudaEventCreate(&stop_), "cudaEventCreate", ordinal_);
  }
  event_pair(const event_pair&) = delete;
  event_pair& operator=(const event_pair&) = delete;
  ~event_pair() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  void start(cudaStream_t s) { dist::detail::cuda_check(cudaEventRecord(start_, s), "cudaEventRecord", ordinal_); }
  // Records the stop, waits for it and returns the seconds between the two events.
  double stop(cudaStream_t s) {
    dist::detail::cuda_check(cudaEventRecord(stop_, s), "cudaEventRecord", ordinal_);
    dist::detail::cuda_check(cudaEventSynchronize(stop_), "cudaEventSynchronize", ordinal_);
    float ms = 0;
    dist::detail::cuda_check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime", ordinal_);
    return static_cast<double>(ms) * 1e-3;
  }

 private:
  int ordinal_;
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// Seconds per call of `fn`, which queues its work on `device`'s stream: the median of the
// repetitions, each a batch of calls between two events on that stream.
template <class F>
double seconds_per_call(const dist::cuda& device, F&& fn) {
  event_pair ev(device.index());
  auto batch = [&](std::int64_t iters) {
    ev.start(device.stream());
    for (std::int64_t i = 0; i < iters; ++i) fn();
    return ev.stop(device.stream()) / static_cast<double>(iters);
  };
  std::int64_t iters = 1;
  for (;;) {
    const double s = batch(iters) * static_cast<double>(iters);
    const auto next = bench::next_iterations(iters, s, min_seconds);
    if (next == iters) break;
    iters = next;
  }
  std::vector<double> reps;
  for (int r = 0; r < repetitions; ++r) reps.push_back(batch(iters));
  return bench::median(reps);
}

// Values in [-1, 1) from a hash of the index: operands the GEMM cannot shortcut (zeros would draw less
// power and flatter the bound).
__global__ void fill_pattern(float* p, std::int64_t n, std::uint32_t seed) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    std::uint32_t h = static_cast<std::uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 16;
    h *= 0x7feb352du;
    h ^= h >> 15;
    p[i] = static_cast<float>(h & 0xffffu) / 32768.0f - 1.0f;
  }
}

void check_cublas(cublasStatus_t rc, const char* call, int ordinal) { dist::detail::cublas_check(rc, call, ordinal); }

// TFLOP/s of a square SGEMM of side `n` on `device`'s stream, in float32 or with TF32 tensor cores.
double sgemm_tflops(const dist::cuda& device, bool tf32, int n) {
  const int ordinal = device.index();
  const std::int64_t elements = static_cast<std::int64_t>(n) * n;
  dist::tensor<float, dist::cuda> a{dist::shape{elements}, device, dist::uninitialized};
  dist::tensor<float, dist::cuda> b{dist::shape{elements}, device, dist::uninitialized};
  dist::tensor<float, dist::cuda> c{dist::shape{elements}, device, dist::uninitialized};
  fill_pattern<<<1024, 256, 0, device.stream()>>>(a.data(), elements, 1u);
  fill_pattern<<<1024, 256, 0, device.stream()>>>(b.data(), elements, 2u);
  dist::detail::cuda_check(cudaPeekAtLastError(), "fill_pattern", ordinal);
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate", ordinal);
  struct destroy {
    cublasHandle_t h;
    ~destroy() { (void)cublasDestroy(h); }
  } destroy_h{h};
  check_cublas(cublasSetStream(h, device.stream()), "cublasSetStream", ordinal);
  check_cublas(cublasSetMathMode(h, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_PEDANTIC_MATH), "cublasSetMathMode",
               ordinal);
  const float alpha = 1.0f, beta = 0.0f;
  const double s = seconds_per_call(device, [&] {
    check_cublas(
        cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a.data(), n, b.data(), n, &beta, c.data(), n),
        "cublasSgemm", ordinal);
  });
  return 2.0 * static_cast<double>(n) * n * n / s / 1e12;
}

struct bounds {
  double float32 = 0, tf32 = 0;
  double of(bool t) const { return t ? tf32 : float32; }
};

bounds measure_bounds(const dist::cuda& device) {
  return {sgemm_tflops(device, false, gemm_side), sgemm_tflops(device, true, gemm_side)};
}

const char* precision_name(bool tf32) { return tf32 ? "tf32" : "float32"; }

// A name as a JSON string's contents.
std::string json_escaped(const std::string& s) {
  std::string out;
  for (const char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    if (static_cast<unsigned char>(ch) >= 0x20) out += ch;
  }
  return out;
}

struct conv_timing {
  double forward_s, train_s;
};

// Forward, and forward + backward, of `layer` on the replica `r`, after one untimed pass of each.
template <class R, class Layer>
conv_timing time_layer(R& r, Layer& layer, const bench::conv_case& c, const dist::tensor<float, dist::cuda>& x) {
  auto y = layer.forward(r, x);
  if (y.shape() != dist::shape::nchw(c.batch, c.out_c, c.output_side(), c.output_side()))
    throw std::logic_error(std::string("bench_nn_gpu: ") + c.name + ": the layer made " + y.shape().to_string() +
                           ", not the output conv_cases.hpp counts FLOPs for");
  dist::tensor<float, dist::cuda> dy{y.shape(), r.device(), dist::uninitialized};
  dy.fill(0.01f);
  (void)layer.backward(r, dy);
  r.device().synchronize();
  const double fwd = seconds_per_call(r.device(), [&] { (void)layer.forward(r, x); });
  const double train = seconds_per_call(r.device(), [&] {
    (void)layer.forward(r, x);
    (void)layer.backward(r, dy);
  });
  return {fwd, train};
}

// One case on the replica of `s` (its engine set to float32 or TF32).
conv_timing time_conv(dist::one_device_strategy<dist::cuda>& s, const bench::conv_case& c) {
  const dist::shape in = dist::shape::nchw(c.batch, c.in_c, c.size, c.size);
  std::vector<float> values(static_cast<std::size_t>(in.numel()));
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 17) * 0.1f - 0.8f;
  conv_timing t{};
  s.run([&](dist::replica auto& r) {
    const auto x = dist::tensor<float, dist::cuda>::from_host(in, std::span<const float>(values), r.device());
    if (c.transposed) {
      nn::conv_transpose2d<float, dist::cuda> up{{.in_channels = c.in_c,
                                                  .out_channels = c.out_c,
                                                  .kernel = c.kernel,
                                                  .stride = c.stride,
                                                  .padding = c.padding,
                                                  .output_padding = c.stride - 1,
                                                  .bias = false},
                                                 1,
                                                 r.device()};
      t = time_layer(r, up, c, x);
    } else {
      nn::conv2d<float, dist::cuda> conv{{.in_channels = c.in_c,
                                          .out_channels = c.out_c,
                                          .kernel = c.kernel,
                                          .stride = c.stride,
                                          .padding = c.padding,
                                          .pad_mode = c.mode,
                                          .bias = false},
                                         1,
                                         r.device()};
      t = time_layer(r, conv, c, x);
    }
    r.device().synchronize();
  });
  return t;
}

std::string version_triple(int v, int major_unit, int minor_unit) {
  return std::to_string(v / major_unit) + "." + std::to_string(v % major_unit / minor_unit) + "." +
         std::to_string(v % minor_unit);
}

int run(int ordinal) {
  cudaDeviceProp prop{};
  dist::detail::cuda_check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties", ordinal);
  const std::string gpu = prop.name;
  int driver = 0, runtime = 0, blas_major = 0, blas_minor = 0, blas_patch = 0;
  (void)cudaDriverGetVersion(&driver);
  (void)cudaRuntimeGetVersion(&runtime);
  (void)cublasGetProperty(MAJOR_VERSION, &blas_major);
  (void)cublasGetProperty(MINOR_VERSION, &blas_minor);
  (void)cublasGetProperty(PATCH_LEVEL, &blas_patch);
#if DISTRIBUTE_CUDA_ENGINE_HAS_CUDNN
  const std::string cudnn = "cuDNN " + version_triple(static_cast<int>(cudnnGetVersion()), 10000, 100);
#else
  const std::string cudnn = "no cuDNN in this build";
#endif
  std::printf(
      "# bench_nn_gpu  %s\n# device: cuda:%d %s (compute capability %d.%d, %d SMs, %.0f GiB); host: %s; load average "
      "before the run: %s\n",
      bench::utc_now().c_str(), ordinal, gpu.c_str(), prop.major, prop.minor, prop.multiProcessorCount,
      static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), bench::cpu_model().c_str(),
      bench::load_average().c_str());
  std::printf(
      "# driver %s, runtime %s, cuBLAS %d.%d.%d, %s; median of %d repetitions of >= %.0f ms, CUDA events on the "
      "replica's stream\n",
      version_triple(driver, 1000, 10).c_str(), version_triple(runtime, 1000, 10).c_str(), blas_major, blas_minor,
      blas_patch, cudnn.c_str(), repetitions, min_seconds * 1e3);
  if (const char* o = std::getenv("NVIDIA_TF32_OVERRIDE"))
    std::printf("# NVIDIA_TF32_OVERRIDE=%s is set: it overrides the TF32 choice of cuBLAS and cuDNN in this process\n",
                o);
  std::printf("\n");

  const dist::detail::device_guard current(ordinal);
  dist::detail::owned_stream stream(ordinal);
  const dist::cuda device = dist::cuda{ordinal}.on(stream.get());

  const bounds bound = measure_bounds(device);
  std::printf("bound: cuBLAS SGEMM %dx%dx%d: float32 (pedantic) %.2f TFLOP/s, TF32 tensor cores %.2f TFLOP/s\n\n",
              gemm_side, gemm_side, gemm_side, bound.float32, bound.tf32);
  for (const bool tf32 : {false, true})
    std::printf(
        "{\"bench\":\"nn_gpu_bound\",\"gpu\":\"%s\",\"when\":\"start\",\"kind\":\"cublasSgemm "
        "%d^3\",\"precision\":\"%s\","
        "\"tflops\":%.3f}\n",
        json_escaped(gpu).c_str(), gemm_side, precision_name(tf32), bound.of(tf32));
  std::printf("\n");

  if constexpr (!dist::engine<dist::cuda>::has_cudnn) {
    std::fprintf(stderr,
                 "bench_nn_gpu: this build has no cuDNN, so the GPU engine has no convolutions to time; only the "
                 "bound was measured\n");
    return 1;
  }

  // One replica per precision, on one stream: each engine keeps its cuDNN plans across the cases.
  dist::one_device_strategy<dist::cuda> f32{device}, t32{device};
  f32.set_compute_options({.tf32 = false});
  t32.set_compute_options({.tf32 = true});
  std::string engine_name;
  f32.run([&](dist::replica auto& r) { engine_name = r.engine().name(); });
  std::printf("GPU engine: %s (and the same with TF32)\n", engine_name.c_str());
  std::printf("%-39s  %-9s  %8s  %11s  %10s  %15s  %13s  %11s  %15s\n", "convolution (batch x shape)", "precision",
              "fwd ms", "fwd TFLOP/s", "fwd+bwd ms", "fwd+bwd TFLOP/s", "bound TFLOP/s", "fwd / bound",
              "fwd+bwd / bound");
  std::vector<std::string> json;
  // The paper generator's convolutions as a whole, per precision: their FLOPs over their time.
  double paper_flops[2] = {0, 0}, paper_seconds[2] = {0, 0};
  for (const auto& c : bench::cyclegan_conv_cases) {
    for (const bool tf32 : {false, true}) {
      const auto t = time_conv(tf32 ? t32 : f32, c);
      const double fwd_tflops = c.forward_flops() / t.forward_s / 1e12,
                   train_tflops = c.train_flops() / t.train_s / 1e12;
      const double b = bound.of(tf32);
      std::printf("%2lld x %-34s  %-9s  %8.4f  %11.3f  %10.4f  %15.3f  %13.2f  %10.1f%%  %14.1f%%\n",
                  static_cast<long long>(c.batch), c.name, precision_name(tf32), t.forward_s * 1e3, fwd_tflops,
                  t.train_s * 1e3, train_tflops, b, 100.0 * fwd_tflops / b, 100.0 * train_tflops / b);
      if (c.in_paper_generator > 0) {
        paper_flops[tf32] += c.in_paper_generator * c.train_flops();
        paper_seconds[tf32] += c.in_paper_generator * t.train_s;
      }
      char line[600];
      std::snprintf(line, sizeof line,
                    "{\"bench\":\"nn_gpu\",\"gpu\":\"%s\",\"case\":\"%s\",\"batch\":%lld,\"precision\":\"%s\","
                    "\"forward_ms\":%.5f,"
                    "\"forward_tflops\":%.4f,\"train_ms\":%.5f,\"train_tflops\":%.4f,\"bound_tflops\":%.3f,"
                    "\"forward_share_of_bound\":%.5f,\"train_share_of_bound\":%.5f}",
                    json_escaped(gpu).c_str(), c.name, static_cast<long long>(c.batch), precision_name(tf32),
                    t.forward_s * 1e3, fwd_tflops, t.train_s * 1e3, train_tflops, b, fwd_tflops / b, train_tflops / b);
      json.emplace_back(line);
    }
  }
  for (const bool tf32 : {false, true}) {
    if (paper_seconds[tf32] <= 0) continue;
    const double rate = paper_flops[tf32] / paper_seconds[tf32] / 1e12, b = bound.of(tf32);
    std::printf(
        "paper generator's convolutions, fwd+bwd, %s, weighted by their FLOPs: %.3f TFLOP/s = %.1f%% of the bound\n",
        precision_name(tf32), rate, 100.0 * rate / b);
    char line[400];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"nn_gpu_paper_generator\",\"gpu\":\"%s\",\"precision\":\"%s\",\"train_tflops\":%.4f,"
                  "\"bound_tflops\":%.3f,\"share_of_bound\":%.5f}",
                  json_escaped(gpu).c_str(), precision_name(tf32), rate, b, rate / b);
    json.emplace_back(line);
  }

  // The bound once more: a GPU that clocked down (heat, power) during the run shows here.
  const bounds end = measure_bounds(device);
  std::printf(
      "\nbound at the end of the run: float32 %.2f TFLOP/s, TF32 %.2f TFLOP/s (%+.1f%%, %+.1f%% from the start)\n\n",
      end.float32, end.tf32, 100.0 * (end.float32 / bound.float32 - 1.0), 100.0 * (end.tf32 / bound.tf32 - 1.0));
  for (const bool tf32 : {false, true}) {
    char line[300];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"nn_gpu_bound\",\"gpu\":\"%s\",\"when\":\"end\",\"kind\":\"cublasSgemm "
                  "%d^3\",\"precision\":\"%s\","
                  "\"tflops\":%.3f}",
                  json_escaped(gpu).c_str(), gemm_side, precision_name(tf32), end.of(tf32));
    json.emplace_back(line);
  }
  for (const auto& j : json) std::printf("%s\n", j.c_str());
  dist::detail::cuda_check(cudaGetLastError(), "the run", ordinal);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int ordinal = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--device" && i + 1 < argc) {
      try {
        ordinal = std::stoi(argv[++i]);
      } catch (const std::exception&) {
        std::fprintf(stderr, "bench_nn_gpu: --device takes a device number, not '%s'\n", argv[i]);
        return 2;
      }
    } else if (arg == "--quick") {
      min_seconds = 0.01;
    } else {
      std::fprintf(stderr, "usage: bench_nn_gpu [--device N] [--quick]\n");
      return arg == "--help" ? 0 : 2;
    }
  }
  try {
    const int visible = dist::cuda_device_count();
    if (visible == 0) {
      std::fprintf(stderr, "bench_nn_gpu: no CUDA device is visible\n");
      return 1;
    }
    if (ordinal < 0 || ordinal >= visible) {
      std::fprintf(stderr, "bench_nn_gpu: --device %d, but %d CUDA device(s) are visible\n", ordinal, visible);
      return 1;
    }
    return run(ordinal);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_nn_gpu: %s\n", e.what());
    return 1;
  }
}
