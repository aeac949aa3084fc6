// The operations between layers on the CPU engine (nn/reductions.hpp, broadcasting.hpp,
// elementwise.hpp, shape_ops.hpp), side by side in one run with
//   - the bound: the machine's streaming bandwidth for the same bytes with the same threads, measured
//     just before each case (a read-only sum for a reduction, a copy for an operation that writes as
//     much as it reads);
//   - the peer: the same operation in PyTorch on the same cores (benchmarks/peer/ops_torch.py, run by
//     the Python given with --peer; a Python with torch, such as the interop environment's).
// Each figure is the median of 5 repetitions of at least 50 ms, output allocated per call as a user's
// code allocates it. See docs/benchmarks.md.
//
//   bench_ops [--peer PYTHON] [--quick]

#include <distribute/nn.hpp>

#include "bench_common.hpp"

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#if defined(_OPENMP)
#  include <omp.h>
#endif

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::shape;
using dist::tensor;

namespace {

double min_seconds = 0.05;

double seconds_per_call(const std::function<void()>& fn) { return bench::seconds_per_call(fn, min_seconds, 5); }

// The bounds, on `threads` threads over buffers as large as the operation's.
volatile float sink = 0;
double read_bound(std::int64_t floats, int threads) {
  std::vector<float> a(static_cast<std::size_t>(floats), 1.0f);
  const float* p = a.data();
  return seconds_per_call([&] {
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {
#if defined(_OPENMP)
      const int t = omp_get_thread_num(), n = omp_get_num_threads();
#else
      const int t = 0, n = 1;
#endif
      const std::int64_t begin = floats * t / n, end = floats * (t + 1) / n;
      // One thread's share in 16 independent sums: a read at the cores' load speed, not at the
      // latency of one chain of additions.
      float acc[16] = {};
      std::int64_t i = begin;
      for (; i + 16 <= end; i += 16)
        for (int l = 0; l < 16; ++l) acc[l] += p[i + l];
      for (; i < end; ++i) acc[0] += p[i];
      for (int l = 0; l < 16; ++l) total += acc[l];
    }
    sink = total;
  });
}
double copy_bound(std::int64_t floats, int threads) {
  std::vector<float> a(static_cast<std::size_t>(floats), 1.0f);
  return seconds_per_call([&] {
    // A fresh destination per call, as the operations allocate theirs.
    std::unique_ptr<float[]> b{new float[static_cast<std::size_t>(floats)]};
#pragma omp parallel num_threads(threads)
    {
#if defined(_OPENMP)
      const int t = omp_get_thread_num(), n = omp_get_num_threads();
#else
      const int t = 0, n = 1;
#endif
      const std::int64_t begin = floats * t / n, end = floats * (t + 1) / n;
      std::memcpy(b.get() + begin, a.data() + begin, static_cast<std::size_t>(end - begin) * sizeof(float));
    }
    sink = b[static_cast<std::size_t>(floats - 1)];
  });
}

tensor<float> random_tensor(shape s, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  tensor<float> t{s};
  for (auto& x : t) x = d(gen);
  return t;
}

// The peer's seconds per case, by name, from ops_torch.py's lines "name seconds".
std::map<std::string, double> peer_times(const std::string& python, const std::string& script, int threads,
                                         const shape& s) {
  std::map<std::string, double> out;
  if (python.empty()) return out;
  const std::string cmd = python + " " + script + " --threads " + std::to_string(threads) + " --shape " +
                          std::to_string(s[0]) + "," + std::to_string(s[1]) + "," + std::to_string(s[2]) + "," +
                          std::to_string(s[3]);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char name[128];
  double sec = 0;
  while (std::fscanf(p, "%127s %lf", name, &sec) == 2) out[name] = sec;
  pclose(p);
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string python;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--peer" && i + 1 < argc) python = argv[++i];
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr, "usage: bench_ops [--peer PYTHON] [--quick]\n");
      return 2;
    }
  }
  if (quick) min_seconds = 0.01;
  auto r = nn::local();
  const int threads = r.engine().threads();
  const std::string script = std::string(DISTRIBUTE_BENCH_SOURCE_DIR) + "/peer/ops_torch.py";

  std::printf(
      "# bench_ops  %s\n# machine: %s; load average before the run: %s\n# compiler: %s; %d engine threads; "
      "median of 5 repetitions of >= %.0f ms\n",
      bench::utc_now().c_str(), bench::cpu_model().c_str(), bench::load_average().c_str(), bench::compiler(), threads,
      min_seconds * 1e3);

  for (const shape s : {shape{8, 64, 64, 64}, shape{32, 16, 28, 28}}) {
    const auto x = random_tensor(s, 1), per_channel = random_tensor(shape{s[1], 1, 1}, 2),
               mask = random_tensor(shape{s[0], 1, s[2], s[3]}, 3);
    const std::int64_t n = s.numel();
    const double read = read_bound(n, threads), copy = copy_bound(n, threads);
    const auto peer = peer_times(python, script, threads, s);
    struct bench_case {
      const char* name;
      bool writes;  // writes as much as it reads: the copy is its bound
      std::function<void()> run;
    };
    // Layers between convolutions, forward and backward in one call: an instance norm (affine) with
    // the ReLU that follows it (fused in a sequential) and a leaky ReLU. Their bound is the copy's:
    // they read and write several tensors of x's size (the norm three reads and two writes forward,
    // three reads and one write backward), so "bound / ours" reads low by that factor.
    nn::sequential norm_relu{nn::instance_norm<float>{{.channels = s[1], .affine = true}, 7}, nn::relu<float>{}};
    nn::leaky_relu<float> leaky{0.2f};
    const auto dy = random_tensor(s, 4);
    const std::vector<bench_case> cases{
        {"sum_hw_keepdim", false, [&] { (void)nn::sum(r, x, {2, 3}, true); }},
        {"sum_n", false, [&] { (void)nn::sum(r, x, 0); }},
        {"mean_all", false, [&] { (void)nn::mean(r, x); }},
        {"max_hw", false, [&] { (void)nn::max(r, x, {2, 3}); }},
        {"sum_to_c11", false, [&] { (void)nn::sum_to(r, x, shape{s[1], 1, 1}); }},
        {"add_c11", true, [&] { (void)nn::add(r, x, per_channel); }},
        {"mul_n1hw", true, [&] { (void)nn::mul(r, x, mask); }},
        {"softplus", true, [&] { (void)nn::softplus(r, x); }},
        {"sigmoid", true, [&] { (void)nn::sigmoid(r, x); }},
        {"exp", true, [&] { (void)nn::exp(r, x); }},
        {"permute_nhwc", true, [&] { (void)nn::permute(r, x, {0, 2, 3, 1}); }},
        {"instance_norm_relu_fwd_bwd", true,
         [&] {
           (void)norm_relu.forward(r, x);
           (void)norm_relu.backward(r, dy);
         }},
        {"leaky_relu_fwd_bwd", true,
         [&] {
           (void)leaky.forward(r, x);
           (void)leaky.backward(r, dy);
         }},
    };
    const double mb = static_cast<double>(n) * 4 / 1e6;
    std::printf("\n[%lld, %lld, %lld, %lld] float32, %.1f MB; read bound %.2f ms (%.1f GB/s), copy bound %.2f ms\n",
                static_cast<long long>(s[0]), static_cast<long long>(s[1]), static_cast<long long>(s[2]),
                static_cast<long long>(s[3]), mb, read * 1e3, mb / 1e3 / read, copy * 1e3);
    std::printf("%-28s %10s %10s %12s %12s %14s\n", "operation", "ours ms", "bound ms", "bound / ours", "PyTorch ms",
                "PyTorch / ours");
    for (const auto& c : cases) {
      const double ours = seconds_per_call(c.run), bound = c.writes ? copy : read;
      const auto p = peer.find(c.name);
      std::printf("%-28s %10.3f %10.3f %11.0f%% ", c.name, ours * 1e3, bound * 1e3, 100 * bound / ours);
      if (p != peer.end()) std::printf("%12.3f %13.2fx\n", p->second * 1e3, p->second / ours);
      else std::printf("%12s %14s\n", "-", "-");
      std::printf(
          "{\"bench\":\"ops\",\"op\":\"%s\",\"shape\":\"%s\",\"threads\":%d,\"ours_s\":%.6g,\"bound_s\":%.6g,"
          "\"peer_s\":%.6g}\n",
          c.name, s.to_string().c_str(), threads, ours, bound, p != peer.end() ? p->second : 0.0);
    }
  }
  return 0;
}
