// A discriminator step with an R1 penalty against the same step without, ours and PyTorch's, side by
// side in one run. The discriminator is a PatchGAN's (pix2pix, CycleGAN) written for a tape:
//   conv 3->64 k4 s2 p1, leaky ReLU 0.2, conv 64->128 k4 s2 p1, instance norm (affine), leaky ReLU,
//   conv 128->256 k4 s2 p1, instance norm, leaky ReLU, conv 256->1 k4 s1 p1.
// The steps, on one_device_strategy's CPU engine:
//   (a) without: D on the real and on the generated batch, the logistic loss
//       mean softplus(-D(real)) + mean softplus(D(fake)), backward;
//   (b) with R1: the same plus nn::r1_penalty(real, weight 10) (a third forward on the real batch, its
//       input gradient recorded on the tape), one backward of the sum;
//   (c) with R1 sharing the real forward: the real batch watched, its scores used by the loss and by
//       tape::gradient(sum(D(real)), real, nn::create_graph), the penalty written out (the form a
//       PyTorch user writes with real.requires_grad_()).
// The peer (benchmarks/peer/penalty_torch.py, run by the Python given with --peer) times the same three
// steps in PyTorch (torch.autograd.grad(D(x).sum(), x, create_graph=True), the same formula) on the
// same number of threads. Each side runs the three steps in turns (a, b, c, a, b, c, ...: --cycles
// cycles after one untimed), so that a change of the machine's load falls on all three; per step it
// takes the wall clock and the process's CPU time (every thread's). It reports each step's fastest
// and median, by either clock, and the ratios (b) / (a) and (c) / (a) both of the fastest steps and
// as the median of each cycle's ratio (its steps seconds apart at most); on a shared machine the
// fastest step is the one the other programs disturbed least, and with one thread its CPU time is
// the step's own work. (b) is also timed by phase (forward and loss;
// the penalty call; the backward), the medians over its steps. Per round ours runs first, then the
// peer. See docs/benchmarks.md.
//
//   bench_penalty [--peer PYTHON] [--threads N] [--rounds 3] [--cycles 15] [--configs 4x64,1x128]
//   bench_penalty --profile a|b|c [--steps 10] [--configs 4x64] [--threads N]
//                                   one step alone, --steps times, untimed: for a profiler, or for
//                                   DNNL_VERBOSE=1 to count the convolution passes of a step

#include <distribute/distribute.hpp>
#include <distribute/nn.hpp>
#include <distribute/nn/penalties.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <time.h>

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::shape;
using dist::tensor;

namespace {

template <class T>
struct patch_discriminator : nn::module<patch_discriminator<T>, T> {
  nn::conv2d<T> c1{{.in_channels = 3, .out_channels = 64, .kernel = 4, .stride = 2, .padding = 1}, 1};
  nn::conv2d<T> c2{{.in_channels = 64, .out_channels = 128, .kernel = 4, .stride = 2, .padding = 1}, 2};
  nn::instance_norm<T> n2{{.channels = 128, .affine = true}, 3};
  nn::conv2d<T> c3{{.in_channels = 128, .out_channels = 256, .kernel = 4, .stride = 2, .padding = 1}, 4};
  nn::instance_norm<T> n3{{.channels = 256, .affine = true}, 5};
  nn::conv2d<T> c4{{.in_channels = 256, .out_channels = 1, .kernel = 4, .stride = 1, .padding = 1}, 6};
  nn::leaky_relu<T> act{T(0.2)};

  auto members() { return nn::members("c1", c1, "c2", c2, "n2", n2, "c3", c3, "n3", n3, "c4", c4); }

  template <class Tape>
  typename Tape::variable operator()(Tape& t, typename Tape::variable x) {
    auto h = t(act, t(c1, x));
    h = t(act, t(n2, t(c2, h)));
    h = t(act, t(n3, t(c3, h)));
    return t(c4, h);
  }
};

tensor<float> uniform(shape s, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  tensor<float> t{s};
  for (auto& x : t) x = d(gen);
  return t;
}

// The figures of one side for one configuration, by name: "a", "b", "c" the median wall-clock seconds
// of a step, "a_min" ... its fastest, "a_cpu" ... the median CPU seconds, "a_cpu_min" ... the fewest, "b_ratio", "c_ratio" the
// medians of the cycles' ratios to (a) (wall clock), "b_ratio_cpu", "c_ratio_cpu" of CPU time.
using figures_t = std::map<std::string, double>;

struct config {
  std::int64_t batch, size;
};

// The peer's figures by name, from penalty_torch.py's lines "name value".
figures_t peer_figures(const std::string& python, int threads, const config& c, int cycles) {
  figures_t out;
  if (python.empty()) return out;
  const std::string cmd = python + " " + DISTRIBUTE_BENCH_SOURCE_DIR + "/peer/penalty_torch.py --threads " +
                          std::to_string(threads) + " --batch " + std::to_string(c.batch) + " --size " +
                          std::to_string(c.size) + " --cycles " + std::to_string(cycles);
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char name[128];
  double value = 0;
  while (std::fscanf(p, "%127s %lf", name, &value) == 2) out[name] = value;
  pclose(p);
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// This process's CPU seconds (every thread's). On a machine other programs keep busy the wall clock
// also counts the time a thread waited for a core; the CPU time does not (it still counts a thread
// spinning at a barrier for one that waits).
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

figures_t summarise(const std::vector<double> (&wall)[3], const std::vector<double> (&cpu)[3]) {
  figures_t f;
  const char* names[3] = {"a", "b", "c"};
  for (int v = 0; v < 3; ++v) {
    const std::string k = names[v];
    f[k] = bench::median(wall[v]);
    f[k + "_min"] = *std::min_element(wall[v].begin(), wall[v].end());
    f[k + "_cpu"] = bench::median(cpu[v]);
    f[k + "_cpu_min"] = *std::min_element(cpu[v].begin(), cpu[v].end());
    if (v == 0) continue;
    std::vector<double> rw, rc;
    for (std::size_t i = 0; i < wall[0].size(); ++i) {
      rw.push_back(wall[v][i] / wall[0][i]);
      rc.push_back(cpu[v][i] / cpu[0][i]);
    }
    f[k + "_ratio"] = bench::median(rw);
    f[k + "_ratio_cpu"] = bench::median(rc);
  }
  return f;
}

[[noreturn]] void usage() {
  std::fprintf(stderr,
               "usage: bench_penalty [--peer PYTHON] [--threads N] [--rounds 3] [--cycles 15] "
               "[--configs 4x64,1x128]\n       bench_penalty --profile a|b|c [--steps 10] [--configs 4x64] "
               "[--threads N]\n");
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  std::string python, profile;
  int threads = 0, rounds = 3, profile_steps = 10;
  int cycles = 15;
  std::vector<config> configs{{4, 64}, {1, 128}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) usage();
    const std::string v = argv[++i];
    if (a == "--peer") python = v;
    else if (a == "--threads") threads = std::stoi(v);
    else if (a == "--rounds") rounds = std::stoi(v);
    else if (a == "--profile") profile = v;
    else if (a == "--steps") profile_steps = std::stoi(v);
    else if (a == "--cycles") cycles = std::stoi(v);
    else if (a == "--configs") {
      configs.clear();
      for (std::string s = v; !s.empty();) {
        const auto comma = s.find(','), x = s.find('x');
        if (x == std::string::npos || x > comma) usage();
        configs.push_back({std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1, comma - x - 1))});
        s = comma == std::string::npos ? "" : s.substr(comma + 1);
      }
    } else usage();
  }
  if (threads < 0 || rounds < 1 || cycles < 1 || configs.empty() || profile_steps < 1) usage();
  if (!profile.empty() && profile != "a" && profile != "b" && profile != "c") usage();

  // A fixed thread count, as PyTorch's: the engine does not shed threads when the machine is busy.
  dist::one_device_strategy<> s;
  s.set_compute_options({.threads = threads, .adapt_threads = false});
  s.run([&](auto& r) { threads = r.engine().threads(); });

  patch_discriminator<float> d;
  std::int64_t parameters = 0;
  d.for_each_parameter([&](const auto& w, const auto&) { parameters += static_cast<std::int64_t>(w.size()); });

  std::printf(
      "# bench_penalty  %s\n# machine: %s; load average before the run: %s\n# compiler: %s; one_device, %d engine "
      "threads (PyTorch: torch.set_num_threads(%d)); %d cycles of the steps (a), (b), (c) in turns per round\n"
      "# D: PatchGAN 3-64-128-256-1, k4, instance norm, leaky ReLU 0.2; %lld parameters\n",
      bench::utc_now().c_str(), bench::cpu_model().c_str(), bench::load_average().c_str(), bench::compiler(), threads,
      threads, cycles, static_cast<long long>(parameters));

  const char* names[3] = {"a", "b", "c"};
  const char* labels[3] = {"(a) without penalty", "(b) with R1", "(c) with R1, shared forward"};
  // results[config]["ours_b_min"] ... over the rounds.
  std::vector<std::map<std::string, std::vector<double>>> results(configs.size());

  for (int round = 1; round <= rounds; ++round) {
    for (std::size_t ci = 0; ci < configs.size(); ++ci) {
      const config c = configs[ci];
      const auto real = uniform(shape::nchw(c.batch, 3, c.size, c.size), 1);
      const auto fake = uniform(shape::nchw(c.batch, 3, c.size, c.size), 2);
      const float n = static_cast<float>(c.batch);
      const std::string load_before = bench::load_average();

      // phases: (b) split at the loss and at the penalty, when given.
      auto step = [&](int variant, double* phases) {
        s.run([&](auto& r) {
          const auto t0 = std::chrono::steady_clock::now();
          d.zero_grad();
          nn::tape t{r};
          auto gan_loss = [&](auto sr, auto sf) {
            return nn::add(t, nn::mean(t, nn::softplus(t, nn::scale(t, sr, -1.0f))), nn::mean(t, nn::softplus(t, sf)));
          };
          if (variant == 2) {
            const auto rv = t.watch(real);
            const auto sr = t(d, rv), sf = t(d, t.constant(fake));
            const auto g = t.gradient(nn::sum(t, sr), rv, nn::create_graph);
            const auto r1 = nn::scale(t, nn::sum(t, nn::square(t, g)), 10.0f / 2 / n);
            t.backward(nn::add(t, gan_loss(sr, sf), r1));
            return;
          }
          auto loss = gan_loss(t(d, t.constant(real)), t(d, t.constant(fake)));
          const double t1 = phases ? seconds_since(t0) : 0;
          if (variant == 1)
            loss = nn::add(t, loss, nn::r1_penalty(t, real, [&](auto v) { return t(d, v); }, {.weight = 10}));
          const double t2 = phases ? seconds_since(t0) : 0;
          t.backward(loss);
          if (phases) {
            phases[0] = t1;
            phases[1] = t2 - t1;
            phases[2] = seconds_since(t0) - t2;
          }
        });
      };
      if (!profile.empty()) {
        for (int i = 0; i < profile_steps; ++i) step(profile[0] - 'a', nullptr);
        std::printf("ran step (%s) %d times on a batch of %lld of 3x%lldx%lld\n", profile.c_str(), profile_steps,
                    static_cast<long long>(c.batch), static_cast<long long>(c.size), static_cast<long long>(c.size));
        return 0;
      }
      // One untimed cycle (the convolutions' first runs choose their kernels), then the timed ones.
      std::vector<double> wall[3], cpu[3], phase[3];
      for (int cycle = 0; cycle <= cycles; ++cycle) {
        for (int v = 0; v < 3; ++v) {
          double p[3];
          const auto t0 = std::chrono::steady_clock::now();
          const double c0 = cpu_seconds();
          step(v, v == 1 ? p : nullptr);
          const double w = seconds_since(t0), cs = cpu_seconds() - c0;
          if (cycle == 0) continue;
          wall[v].push_back(w);
          cpu[v].push_back(cs);
          if (v == 1)
            for (int k = 0; k < 3; ++k) phase[k].push_back(p[k]);
        }
      }
      figures_t ours = summarise(wall, cpu);
      ours["b_forward"] = bench::median(phase[0]);
      ours["b_penalty"] = bench::median(phase[1]);
      ours["b_backward"] = bench::median(phase[2]);
      const figures_t peer = peer_figures(python, threads, c, cycles);
      const std::string load_after = bench::load_average();
      bool have_peer = true;
      for (const char* k : {"a", "b", "c", "a_min", "b_min", "c_min", "a_cpu", "b_cpu", "c_cpu", "a_cpu_min",
                            "b_cpu_min", "c_cpu_min", "b_ratio", "c_ratio", "b_ratio_cpu", "c_ratio_cpu"})
        have_peer = have_peer && peer.count(k);

      std::printf("\nround %d: batch %lld of 3x%lldx%lld; load average %s before, %s after", round,
                  static_cast<long long>(c.batch), static_cast<long long>(c.size), static_cast<long long>(c.size),
                  load_before.c_str(), load_after.c_str());
      if (peer.count("parameters"))
        std::printf("; PyTorch's D: %.0f parameters%s", peer.at("parameters"),
                    static_cast<std::int64_t>(peer.at("parameters")) == parameters ? " (the same)" : " (DIFFERENT)");
      // Per step: wall clock fastest and median, CPU time fewest and median; ours, then PyTorch's.
      std::printf("\n%-28s %36s %36s %14s\n%-28s", "", "ours: wall min, med; CPU min, med",
                  "PyTorch: wall min, med; CPU min, med", "ours/pt: min", "step, ms");
      auto four = [](const figures_t& f, const std::string& k) {
        std::printf(" %8.2f %8.2f %8.2f %8.2f", f.at(k + "_min") * 1e3, f.at(k) * 1e3, f.at(k + "_cpu_min") * 1e3,
                    f.at(k + "_cpu") * 1e3);
      };
      std::printf("%36s %36s %14s\n", "", "", "wall, CPU");
      for (int v = 0; v < 3; ++v) {
        const std::string k = names[v];
        std::printf("%-28s", labels[v]);
        four(ours, k);
        if (have_peer) {
          four(peer, k);
          std::printf(" %6.2fx %6.2fx\n", ours[k + "_min"] / peer.at(k + "_min"),
                      ours[k + "_cpu_min"] / peer.at(k + "_cpu_min"));
        } else {
          std::printf(" %36s\n", "-");
        }
      }
      std::printf("%-28s %36s %36s\n", "ratio to (a)", "ours: wall min, cycles'; CPU min, cycles'",
                  "PyTorch: the same");
      auto ratios = [](const figures_t& f, const std::string& k) {
        std::printf(" %7.2fx %7.2fx %7.2fx %7.2fx", f.at(k + "_min") / f.at("a_min"), f.at(k + "_ratio"),
                    f.at(k + "_cpu_min") / f.at("a_cpu_min"), f.at(k + "_ratio_cpu"));
      };
      for (int v = 1; v < 3; ++v) {
        const std::string k = names[v];
        std::printf("%-28s", v == 1 ? "(b) / (a)" : "(c) / (a)");
        ratios(ours, k);
        if (have_peer) ratios(peer, k);
        std::printf("\n");
      }
      std::printf("(b) by phase, median ms: forward real+fake and loss %.2f, penalty call %.2f, backward %.2f (ours)",
                  ours["b_forward"] * 1e3, ours["b_penalty"] * 1e3, ours["b_backward"] * 1e3);
      if (peer.count("b_forward"))
        std::printf("; %.2f, %.2f, %.2f (PyTorch)", peer.at("b_forward") * 1e3, peer.at("b_penalty") * 1e3,
                    peer.at("b_backward") * 1e3);
      std::printf("\n");
      auto fig = [](const figures_t& m, const std::string& k) { return m.count(k) ? m.at(k) : 0.0; };
      std::printf("{\"bench\":\"penalty\",\"round\":%d,\"batch\":%lld,\"size\":%lld,\"threads\":%d,\"cycles\":%d",
                  round, static_cast<long long>(c.batch), static_cast<long long>(c.size), threads, cycles);
      for (const char* side : {"ours", "peer"})
        for (const char* k :
             {"a", "b", "c", "a_min", "b_min", "c_min", "a_cpu", "b_cpu", "c_cpu", "a_cpu_min", "b_cpu_min",
              "c_cpu_min", "b_ratio", "c_ratio", "b_ratio_cpu", "c_ratio_cpu", "b_forward", "b_penalty", "b_backward"})
          std::printf(",\"%s_%s\":%.6g", side, k, fig(std::string(side) == "ours" ? ours : peer, k));
      std::printf(",\"load_before\":\"%s\",\"load_after\":\"%s\"}\n", load_before.c_str(), load_after.c_str());
      std::fflush(stdout);
      for (const auto& [k, v] : ours) results[ci]["ours_" + k].push_back(v);
      if (have_peer)
        for (const auto& [k, v] : peer) results[ci]["peer_" + k].push_back(v);
    }
  }

  // Over the rounds: the fastest steps (wall clock and CPU time), and the medians of the rounds' cycle
  // ratios.
  for (const char* clock : {"", "_cpu"}) {
    const bool on_cpu = *clock != 0;
    std::printf(
        "\nover %d round(s), %s: the fastest step, ms; (b) / (a) of the fastest and the median of the rounds' "
        "cycle ratios\n%-9s %8s %8s %7s %7s %9s %9s %7s %7s %10s %10s\n",
        rounds, on_cpu ? "CPU time" : "wall clock", "config", "ours a", "ours b", "b/a", "cycles", "torch a", "torch b",
        "b/a", "cycles", "a ours/pt", "b ours/pt");
    const std::string a_min = std::string("a") + (on_cpu ? "_cpu_min" : "_min"),
                      b_min = std::string("b") + (on_cpu ? "_cpu_min" : "_min"),
                      b_ratio = std::string("b_ratio") + clock;
    for (std::size_t ci = 0; ci < configs.size(); ++ci) {
      auto& f = results[ci];
      auto lowest = [&](const std::string& k) { return *std::min_element(f[k].begin(), f[k].end()); };
      const double oa = lowest("ours_" + a_min), ob = lowest("ours_" + b_min);
      std::printf("%lldx%-7lld %8.2f %8.2f %6.2fx %6.2fx", static_cast<long long>(configs[ci].batch),
                  static_cast<long long>(configs[ci].size), oa * 1e3, ob * 1e3, ob / oa,
                  bench::median(f["ours_" + b_ratio]));
      if (!f["peer_" + a_min].empty()) {
        const double pa = lowest("peer_" + a_min), pb = lowest("peer_" + b_min);
        std::printf(" %9.2f %9.2f %6.2fx %6.2fx %9.2fx %9.2fx\n", pa * 1e3, pb * 1e3, pb / pa,
                    bench::median(f["peer_" + b_ratio]), oa / pa, ob / pb);
      } else {
        std::printf("\n");
      }
    }
  }
  return 0;
}
