// The CPU cost of training, side by side in one run:
//   - conv2d and conv_transpose2d forward + backward on the CPU engine with one thread (oneDNN where
//     built in) at CycleGAN's demo and paper shapes, in GFLOP/s and as a share of the single-core FMA
//     peak measured here just before (the bound: a loop of independent FMAs that never touches
//     memory), beside the same layer on the portable reference engine (im2col + Eigen GEMM);
//   - gradient all-reduce of a CycleGAN generator's parameter set (48 tensors, 11.4 M floats) and of
//     a set of many small tensors: fused buckets (`all_reduce_gradients`, 25 MiB) against one
//     collective per tensor (the peer: what a loop over the tensors costs).
// FLOPs count a multiply-add as 2; a convolution's backward (input and weight gradients) is twice its
// forward. Every figure is the median of 5 repetitions of at least 50 ms. See docs/benchmarks.md.
//
//   bench_nn [--replicas 2,4] [--quick]

#include <distribute/distribute.hpp>
#include <distribute/nn.hpp>

#include <Eigen/Core>

#include "bench_common.hpp"
#include "conv_cases.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <utility>
#include <vector>

#if defined(__FMA__) || defined(__AVX__)
#  include <immintrin.h>
#endif

namespace dist = distribute;
namespace nn = distribute::nn;

namespace {

double min_seconds = 0.05;
constexpr int repetitions = 5;

// Seconds per call of `fn`, the median of the repetitions.
template <class F>
double seconds_per_call(F&& fn) {
  return bench::seconds_per_call(fn, min_seconds, repetitions);
}

// The single-core peak: 12 independent chains of vector FMAs (enough to cover the FMA latency on two
// pipes), no memory traffic. Without FMA in the instruction set, a multiply and an add.
const char* peak_kind() {
#if defined(__FMA__)
  return "AVX2 FMA (8 floats x 2 flops)";
#else
  return "SSE mul+add (4 floats x 2 flops)";
#endif
}
double peak_gflops() {
  constexpr int chains = 12;
  constexpr std::int64_t steps = 1 << 16;
#if defined(__FMA__)
  constexpr int lanes = 8;
  auto kernel = [] {
    __m256 acc[chains];
    for (int c = 0; c < chains; ++c) acc[c] = _mm256_set1_ps(static_cast<float>(c));
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
    for (std::int64_t i = 0; i < steps; ++i)
      for (int c = 0; c < chains; ++c) acc[c] = _mm256_fmadd_ps(acc[c], a, b);
    __m256 s = acc[0];
    for (int c = 1; c < chains; ++c) s = _mm256_add_ps(s, acc[c]);
    float out[8];
    _mm256_storeu_ps(out, s);
    volatile float sink = out[0];
    (void)sink;
  };
#else
  constexpr int lanes = 4;
  auto kernel = [] {
    typedef float v4 __attribute__((vector_size(16)));
    v4 acc[chains];
    for (int c = 0; c < chains; ++c) acc[c] = v4{} + static_cast<float>(c);
    const v4 a = v4{} + 0.999999f, b = v4{} + 1e-7f;
    for (std::int64_t i = 0; i < steps; ++i)
      for (int c = 0; c < chains; ++c) acc[c] = acc[c] * a + b;
    v4 s = acc[0];
    for (int c = 1; c < chains; ++c) s += acc[c];
    volatile float sink = s[0];
    (void)sink;
  };
#endif
  const double s = seconds_per_call(kernel);
  return 2.0 * lanes * chains * static_cast<double>(steps) / s / 1e9;
}

using bench::conv_case;

struct conv_result {
  double forward_gflops, train_gflops, reference_gflops;
  double train_flops;  // of one forward + backward
};

// One replica of one thread on an engine with `options`.
struct one_thread_replica {
  dist::engine_slot<dist::cpu> slot;
  dist::replica_context<dist::cpu, dist::comm::local> r;
  explicit one_thread_replica(dist::compute_options options) : r{dist::cpu{}, dist::comm::local{}, &slot} {
    options.threads = 1;
    slot.reset(options, 1);
  }
};

template <class Layer>
std::pair<double, double> time_layer(Layer& layer, dist::compute_options options, const dist::tensor<float>& x) {
  one_thread_replica rep{options};
  auto y = layer.forward(rep.r, x);
  dist::tensor<float> dy{y.shape()};
  dy.fill(0.01f);
  const double fwd = seconds_per_call([&] { layer.forward(rep.r, x); });
  const double train = seconds_per_call([&] {
    layer.forward(rep.r, x);
    layer.backward(rep.r, dy);
  });
  return {fwd, train};
}

conv_result time_conv(const conv_case& c) {
  dist::tensor<float> x{dist::shape::nchw(c.batch, c.in_c, c.size, c.size)};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 17) * 0.1f - 0.8f;
  // FLOPs as conv_cases.hpp counts them (shared with bench_nn_gpu).
  const double fwd_flops = c.forward_flops(), train_flops = c.train_flops();
  auto measure = [&](auto& layer) {
    const auto [fwd, train] = time_layer(layer, {}, x);
    const auto [ref_fwd, ref_train] = time_layer(layer, {.reference = true}, x);
    (void)ref_fwd;
    return conv_result{fwd_flops / fwd / 1e9, train_flops / train / 1e9, train_flops / ref_train / 1e9, train_flops};
  };
  if (c.transposed) {
    nn::conv_transpose2d<float> up{{.in_channels = c.in_c,
                                    .out_channels = c.out_c,
                                    .kernel = c.kernel,
                                    .stride = c.stride,
                                    .padding = c.padding,
                                    .output_padding = c.stride - 1,
                                    .bias = false},
                                   1};
    return measure(up);
  }
  nn::conv2d<float> conv{{.in_channels = c.in_c,
                          .out_channels = c.out_c,
                          .kernel = c.kernel,
                          .stride = c.stride,
                          .padding = c.padding,
                          .pad_mode = c.mode,
                          .bias = false},
                         1};
  return measure(conv);
}

// A model that is only a list of gradient tensors: what all_reduce_gradients sees of any model.
struct gradient_set {
  using scalar_type = float;
  std::vector<std::vector<float>> values, grads;
  explicit gradient_set(const std::vector<std::size_t>& sizes) {
    for (auto n : sizes) {
      values.emplace_back(0);
      grads.emplace_back(n, 1.0f);
    }
  }
  template <class F>
  void for_each_parameter(F&& f) {
    for (std::size_t i = 0; i < grads.size(); ++i) f(std::span<float>(values[i]), std::span<float>(grads[i]));
  }
  std::size_t floats() const {
    std::size_t n = 0;
    for (const auto& g : grads) n += g.size();
    return n;
  }
};

// The ResNet generator of CycleGAN (RGB, 9 blocks; instance norm without parameters): 48 tensors, 11,378,179 floats.
std::vector<std::size_t> cyclegan_generator() {
  std::vector<std::size_t> s;
  auto conv = [&](std::size_t in, std::size_t out, std::size_t k) {
    s.push_back(out * in * k * k);
    s.push_back(out);
  };
  conv(3, 64, 7);
  conv(64, 128, 3);
  conv(128, 256, 3);
  for (int b = 0; b < 9; ++b) {
    conv(256, 256, 3);
    conv(256, 256, 3);
  }
  conv(256, 128, 3);  // transposed: the same counts
  conv(128, 64, 3);
  conv(64, 3, 7);
  return s;
}

// Seconds per all_reduce_gradients call with `n` replicas, timed inside one step so that only the
// collectives are measured.
double time_all_reduce(int n, const std::vector<std::size_t>& sizes, std::size_t bucket_bytes,
                       std::size_t& collectives) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
  auto models = s.mirror([&](auto&) { return gradient_set(sizes); });
  double seconds = 0;
  s.run(
      [&](dist::replica auto& r, gradient_set& m) {
        const dist::gradient_reduction how{.op = dist::reduce_op::sum, .bucket_bytes = bucket_bytes};
        std::size_t c = 0;
        // Every replica must run the same number of calls: the iteration count is agreed on by the
        // primary's measurement, broadcast each round.
        std::int64_t iters = 1;
        for (;;) {
          const auto t0 = std::chrono::steady_clock::now();
          for (std::int64_t i = 0; i < iters; ++i) c = r.all_reduce_gradients(m, how);
          const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          const auto next = r.broadcast(bench::next_iterations(iters, sec, min_seconds), 0);
          if (next == iters) break;
          iters = next;
        }
        std::vector<double> reps;
        for (int rep = 0; rep < repetitions; ++rep) {
          const auto t0 = std::chrono::steady_clock::now();
          for (std::int64_t i = 0; i < iters; ++i) r.all_reduce_gradients(m, how);
          reps.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                         static_cast<double>(iters));
        }
        if (r.replica_id() == 0) {
          seconds = bench::median(reps);
          collectives = c;
        }
      },
      models);
  return seconds;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> replica_counts{2, 4};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--replicas" && i + 1 < argc) {
      replica_counts = bench::parse_int_list(argv[++i]);
    } else if (arg == "--quick") {
      min_seconds = 0.01;
    } else {
      std::fprintf(stderr, "usage: bench_nn [--replicas 2,4] [--quick]\n");
      return arg == "--help" ? 0 : 2;
    }
  }
  std::printf("# bench_nn  %s\n# machine: %u usable hardware threads, %s; load average before the run: %s\n",
              bench::utc_now().c_str(), dist::detail::usable_hardware_threads(), bench::cpu_model().c_str(),
              bench::load_average().c_str());
  std::printf("# compiler: %s; Eigen %d.%d.%d (the reference), SIMD: %s; median of %d repetitions of >= %.0f ms\n\n",
              bench::compiler(), EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION,
              Eigen::SimdInstructionSetsInUse(), repetitions, min_seconds * 1e3);

  const double peak = peak_gflops();
  std::printf("single-core peak, %s: %.1f GFLOP/s\n\n", peak_kind(), peak);
  std::printf("{\"bench\":\"nn_peak\",\"kind\":\"%s\",\"gflops\":%.2f}\n\n", peak_kind(), peak);

  // CycleGAN's convolutions at the demo's and the paper's shapes (conv_cases.hpp).
  const auto& cases = bench::cyclegan_conv_cases;
  // The clock of a VM core moves (up to 2x between runs here), so each case is compared with the peak
  // measured just before it, not only with the one at the start.
  std::printf("CPU engine: %s (one thread below)\n", dist::engine<dist::cpu>{{.threads = 1}}.name().c_str());
  std::printf(
      "convolution (batch x shape)           fwd GFLOP/s  fwd+bwd GFLOP/s  reference fwd+bwd  peak just before"
      "  fwd+bwd / peak  ours / reference\n");
  std::vector<std::string> json;
  // The paper generator's convolutions as a whole: its FLOPs over the time they take at these rates.
  double paper_flops = 0, paper_seconds = 0, paper_peak = 0, paper_cases = 0;
  for (const auto& c : cases) {
    const double local_peak = peak_gflops();
    const auto res = time_conv(c);
    std::printf("%2lld x %-34s %11.1f  %15.1f  %17.1f  %16.1f  %13.0f%%  %15.2fx\n", static_cast<long long>(c.batch),
                c.name, res.forward_gflops, res.train_gflops, res.reference_gflops, local_peak,
                100.0 * res.train_gflops / local_peak, res.train_gflops / res.reference_gflops);
    if (c.in_paper_generator > 0) {
      paper_flops += c.in_paper_generator * res.train_flops;
      paper_seconds += c.in_paper_generator * res.train_flops / (res.train_gflops * 1e9);
      paper_peak += local_peak;
      paper_cases += 1;
    }
    char line[400];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"nn_conv\",\"case\":\"%s\",\"batch\":%lld,\"forward_gflops\":%.2f,\"train_gflops\":%.2f,"
                  "\"reference_train_gflops\":%.2f,\"peak_gflops\":%.2f,\"share_of_peak\":%.3f}",
                  c.name, static_cast<long long>(c.batch), res.forward_gflops, res.train_gflops, res.reference_gflops,
                  local_peak, res.train_gflops / local_peak);
    json.emplace_back(line);
  }
  if (paper_cases > 0) {
    const double rate = paper_flops / paper_seconds / 1e9, peak_mean = paper_peak / paper_cases;
    std::printf("paper generator's convolutions, fwd+bwd, weighted by their FLOPs: %.1f GFLOP/s = %.0f%% of the peak\n",
                rate, 100.0 * rate / peak_mean);
    std::printf(
        "{\"bench\":\"nn_conv_paper_generator\",\"train_gflops\":%.2f,\"peak_gflops\":%.2f,\"share_of_peak\":%.3f}\n",
        rate, peak_mean, rate / peak_mean);
  }
  std::printf("\n");
  for (const auto& j : json) std::printf("%s\n", j.c_str());
  json.clear();

  struct param_set {
    const char* name;
    std::vector<std::size_t> sizes;
  };
  const param_set sets[] = {{"cyclegan-generator", cyclegan_generator()},
                            {"small-tensors", std::vector<std::size_t>(160, 256)}};
  std::printf(
      "\ngradient all-reduce (sum)     replicas  tensors    floats  fused ms (coll.)  per-tensor ms (coll.)  "
      "per-tensor/fused\n");
  for (const auto& ps : sets) {
    const gradient_set probe(ps.sizes);
    for (int n : replica_counts) {
      std::size_t fused_c = 0, per_c = 0;
      const double fused = time_all_reduce(n, ps.sizes, std::size_t{25} << 20, fused_c);
      const double per = time_all_reduce(n, ps.sizes, 0, per_c);
      std::printf("%-28s  %8d  %7zu  %8zu  %9.3f (%4zu)  %14.3f (%4zu)  %15.2fx\n", ps.name, n, ps.sizes.size(),
                  probe.floats(), fused * 1e3, fused_c, per * 1e3, per_c, per / fused);
      char line[320];
      std::snprintf(
          line, sizeof line,
          "{\"bench\":\"nn_gradient_allreduce\",\"set\":\"%s\",\"replicas\":%d,\"tensors\":%zu,\"floats\":%zu,"
          "\"fused_ms\":%.4f,\"fused_collectives\":%zu,\"per_tensor_ms\":%.4f,\"per_tensor_collectives\":%zu}",
          ps.name, n, ps.sizes.size(), probe.floats(), fused * 1e3, fused_c, per * 1e3, per_c);
      json.emplace_back(line);
    }
  }
  std::printf("\n");
  for (const auto& j : json) std::printf("%s\n", j.c_str());
  return 0;
}
