// What nn::tape costs: the CycleGAN example's training step as the trainer wires it by hand
// (examples/cyclegan/trainer.hpp, wiring::by_hand) beside the same step recorded on a tape
// (wiring::tape: each generator applied three times and the discriminators frozen on one tape, one
// backward; the discriminators' half on a second tape), from the same initial weights on the same
// batch, one_device on the CPU.
//
// First it checks that the two compute the same step: after each of --check-steps steps, every loss,
// every parameter's gradient and every parameter of G_AB, G_BA, D_A and D_B must be equal bit for bit
// (the taped step records its calls so that the tape's backward sums in the hand-wired order); any
// difference is printed and the program exits with status 1. Then it times them in interleaved
// rounds, --steps steps of each per round (hand first in even rounds, tape first in odd ones, so
// that a change of the machine's load falls on both alike), and prints each side's median seconds
// per step, the tape / hand ratio (of the medians, and per round: median, min, max), the load average
// before and after, and one JSON line.
//
//   bench_tape [--size 28] [--channels 1] [--filters 16] [--blocks 3] [--d-layers 2] [--batch 8]
//              [--rounds 10] [--steps 3] [--warmup 1] [--check-steps 2] [--threads 0] [--check-only]
//              [--profile hand|tape] [--paper] [--seed 1]
//
// --paper is the reference's networks and batch: 256x256x3, 64 filters, 9 blocks, 3 d-layers, batch 1
// (about 12 s a step on 2 cores), with 3 rounds of 1 step, 1 check step (which warms both up) and no
// other warm-up, unless given after it. --threads N: the engine's threads (0, the default: every core).
// --check-only runs the check and exits (0 where the two steps agree). --profile hand|tape runs, after
// the check, --rounds x --steps steps of that side alone (to record it under a profiler), and the
// peak resident memory over those steps (Linux: the high-water mark reset before them through
// /proc/self/clear_refs; it then counts what the process holds anyway, both trainers' networks and
// optimisers and the scratch, as the resident memory before the steps, printed beside it).

#include "models.hpp"
#include "trainer.hpp"

#include "bench_common.hpp"

#include <distribute/distribute.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <random>
#include <string>
#include <vector>

namespace dist = distribute;

namespace {

// A field of /proc/self/status in KiB ("VmRSS:", "VmHWM:"); -1 where it cannot be read.
long status_kib(const char* field) {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long kib = -1;
  const std::size_t n = std::strlen(field);
  while (std::fgets(line, sizeof line, f))
    if (std::strncmp(line, field, n) == 0) {
      kib = std::strtol(line + n, nullptr, 10);
      break;
    }
  std::fclose(f);
  return kib;
}

// Resets the process's peak resident memory (VmHWM) to its current one; false where the kernel
// does not allow it.
bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (!f) return false;
  const bool ok = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

struct options {
  int size = 28, channels = 1, filters = 16, blocks = 3, d_layers = 2, batch = 8;
  int rounds = 10, steps = 3, warmup = 1, check_steps = 2;
  int threads = 0;  // compute_options::threads (0: every core)
  bool check_only = false, paper = false;
  std::string profile;  // "hand" or "tape": after the check, only that side's steps (for a profiler)
  std::uint64_t seed = 1;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(why == "help" ? stdout : stderr,
               "%s%sbench_tape [--size 28] [--channels 1] [--filters 16] [--blocks 3] [--d-layers 2] [--batch 8]\n"
               "           [--rounds 10] [--steps 3] [--warmup 1] [--check-steps 2] [--threads 0] [--check-only] "
               "[--profile hand|tape] [--paper] [--seed 1]\n",
               why == "help" ? "" : why.c_str(), why == "help" ? "" : "\n");
  std::exit(why == "help" ? 0 : 2);
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto integer = [&] {
      if (i + 1 >= argc) usage("missing value after " + a);
      try {
        return std::stoi(argv[++i]);
      } catch (const std::exception&) {
        usage(a + " takes an integer, not '" + argv[i] + "'");
      }
    };
    if (a == "--size") o.size = integer();
    else if (a == "--channels") o.channels = integer();
    else if (a == "--filters") o.filters = integer();
    else if (a == "--blocks") o.blocks = integer();
    else if (a == "--d-layers") o.d_layers = integer();
    else if (a == "--batch") o.batch = integer();
    else if (a == "--rounds") o.rounds = integer();
    else if (a == "--steps") o.steps = integer();
    else if (a == "--warmup") o.warmup = integer();
    else if (a == "--check-steps") o.check_steps = integer();
    else if (a == "--threads") o.threads = integer();
    else if (a == "--seed") o.seed = static_cast<std::uint64_t>(integer());
    else if (a == "--check-only") o.check_only = true;
    else if (a == "--profile") {
      if (i + 1 >= argc) usage("missing value after --profile");
      o.profile = argv[++i];
      if (o.profile != "hand" && o.profile != "tape") usage("--profile must be hand or tape");
    } else if (a == "--paper") {
      o.paper = true;
      o.size = 256, o.channels = 3, o.filters = 64, o.blocks = 9, o.d_layers = 3, o.batch = 1;
      o.rounds = 3, o.steps = 1, o.check_steps = 1, o.warmup = 0;  // the check step warms both up
    } else if (a == "--help" || a == "-h") usage("help");
    else usage("unknown option " + a);
  }
  if (o.size < 8 || o.channels < 1 || o.filters < 1 || o.blocks < 0 || o.d_layers < 1 || o.batch < 1)
    usage("--size (at least 8), --channels, --filters, --d-layers and --batch must be positive, --blocks at least 0");
  if (o.rounds < 1 || o.steps < 1 || o.warmup < 0 || o.check_steps < 1 || o.threads < 0)
    usage("--rounds, --steps and --check-steps must be positive, --warmup and --threads at least 0");
  return o;
}

// The A and B batches: uniform in [-1, 1], a new pair each step (from the seed and the step).
std::pair<cyclegan::tensor, cyclegan::tensor> batches(const options& o, std::int64_t step) {
  const auto image = dist::shape::nchw(o.batch, o.channels, o.size, o.size);
  std::mt19937_64 rng{o.seed * 7919 + 17 + static_cast<std::uint64_t>(step)};
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  cyclegan::tensor a{image}, b{image};
  for (auto& v : a) v = uniform(rng);
  for (auto& v : b) v = uniform(rng);
  return {std::move(a), std::move(b)};
}

// Compares two trainers' networks after a step: each parameter and its gradient, bit for bit.
// Returns the number of tensors that differ, printing the first element of each.
template <class Hand, class Taped>
int compare_networks(Hand& hand, Taped& taped, std::int64_t step) {
  int bad = 0;
  auto one = [&](const char* name, auto& h, auto& t) {
    std::vector<std::pair<std::span<float>, std::span<float>>> hs, ts;
    h.for_each_parameter([&](std::span<float> v, std::span<float> g) { hs.emplace_back(v, g); });
    t.for_each_parameter([&](std::span<float> v, std::span<float> g) { ts.emplace_back(v, g); });
    if (hs.size() != ts.size()) {
      std::printf("  step %lld: %s has %zu parameters by hand, %zu taped\n", static_cast<long long>(step), name,
                  hs.size(), ts.size());
      ++bad;
      return;
    }
    for (std::size_t k = 0; k < hs.size(); ++k) {
      for (int which = 0; which < 2; ++which) {
        const auto x = which ? hs[k].second : hs[k].first;
        const auto y = which ? ts[k].second : ts[k].first;
        for (std::size_t i = 0; i < x.size(); ++i) {
          if (std::bit_cast<std::uint32_t>(x[i]) != std::bit_cast<std::uint32_t>(y[i])) {
            std::printf("  step %lld: %s parameter %zu's %s differs at element %zu of %zu: %.9g by hand, %.9g taped\n",
                        static_cast<long long>(step), name, k, which ? "gradient" : "value", i, x.size(),
                        static_cast<double>(x[i]), static_cast<double>(y[i]));
            ++bad;
            break;
          }
        }
      }
    }
  };
  one("G_AB", hand.g_ab().primary(), taped.g_ab().primary());
  one("G_BA", hand.g_ba().primary(), taped.g_ba().primary());
  one("D_A", hand.d_a().primary(), taped.d_a().primary());
  one("D_B", hand.d_b().primary(), taped.d_b().primary());
  return bad;
}

int compare_losses(const cyclegan::step_losses& h, const cyclegan::step_losses& t, std::int64_t step) {
  static const char* names[] = {"D_A", "D_B", "GAN_AB", "GAN_BA", "cycle", "identity"};
  const auto hv = h.values(), tv = t.values();
  int bad = 0;
  for (std::size_t i = 0; i < hv.size(); ++i)
    if (std::bit_cast<std::uint64_t>(hv[i]) != std::bit_cast<std::uint64_t>(tv[i])) {
      std::printf("  step %lld: loss %s is %.17g by hand, %.17g taped\n", static_cast<long long>(step), names[i], hv[i],
                  tv[i]);
      ++bad;
    }
  return bad;
}

// Wall-clock seconds and this process's CPU seconds (every thread's): on a machine that other
// programs keep busy the wall clock also counts the time a thread waited for a core, the CPU time
// does not.
struct clock_pair {
  double wall = 0, cpu = 0;
  static clock_pair now() {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return {std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(),
            static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec)};
  }
  clock_pair operator-(const clock_pair& o) const { return {wall - o.wall, cpu - o.cpu}; }
  clock_pair& operator+=(const clock_pair& o) {
    wall += o.wall, cpu += o.cpu;
    return *this;
  }
};

int run(const options& o) {
  using S = dist::one_device_strategy<dist::cpu>;
  S s;
  s.set_compute_options({.threads = o.threads});
  const int threads = s.run_on_primary([](auto& r) { return r.engine().threads(); });
  cyclegan::train_options t;
  t.gen = {.channels = o.channels, .filters = o.filters, .blocks = o.blocks};
  t.disc = {.channels = o.channels, .filters = o.filters, .layers = o.d_layers, .norm = cyclegan::norm_kind::instance};
  t.batch = o.batch;
  t.total_steps = 1'000'000;
  t.decay_fraction = 0;  // a constant learning rate
  t.seed = o.seed;
  cyclegan::trainer<S> hand(s, t, o.channels, o.size, o.size);
  cyclegan::trainer<S, cyclegan::wiring::tape> taped(s, t, o.channels, o.size, o.size);

  std::printf(
      "bench_tape: the CycleGAN step wired by hand and on nn::tape, one_device (CPU), %dx%dx%d, %d filters, %d blocks, "
      "%d d-layers, batch %d\n",
      o.size, o.size, o.channels, o.filters, o.blocks, o.d_layers, o.batch);
  std::printf("  parameters: G %lld, D %lld (each of two)\n",
              static_cast<long long>(cyclegan::parameter_count(hand.g_ab().primary())),
              static_cast<long long>(cyclegan::parameter_count(hand.d_a().primary())));
  std::printf("  %s, %d engine thread(s), %s, load %s\n", bench::cpu_model().c_str(), threads, bench::compiler(),
              bench::load_average().c_str());
  std::fflush(stdout);

  // The check: the same step, the same bits.
  std::int64_t step = 0;
  if (const int bad = compare_networks(hand, taped, step); bad > 0) {
    std::printf("FAILED: the two trainers start from different weights\n");
    return 1;
  }
  for (int i = 0; i < o.check_steps; ++i, ++step) {
    const auto [a, b] = batches(o, step);
    const auto lh = hand.step(a, b);
    const auto lt = taped.step(a, b);
    const int bad = compare_losses(lh, lt, step) + compare_networks(hand, taped, step);
    if (bad > 0) {
      std::printf(
          "FAILED: the taped step differs from the hand-wired one in %d loss(es) or tensor(s) after step %lld\n", bad,
          static_cast<long long>(step));
      return 1;
    }
    if (i == 0)
      std::printf("  step 1 losses (both): D_A %.6f, D_B %.6f, GAN_AB %.6f, GAN_BA %.6f, cycle %.6f, identity %.6f\n",
                  lh.d_a, lh.d_b, lh.gan_ab, lh.gan_ba, lh.cycle, lh.identity);
  }
  std::printf(
      "  check: %d step(s), every loss, parameter gradient and parameter of the four networks equal bit for bit\n",
      o.check_steps);
  std::fflush(stdout);
  if (o.check_only) return 0;

  // The timing: interleaved rounds on the same batch.
  const auto [a, b] = batches(o, 0);
  if (!o.profile.empty()) {
    const long before_kib = status_kib("VmRSS:");
    const bool reset = reset_peak_rss();
    const clock_pair t0 = clock_pair::now();
    for (int i = 0; i < o.rounds * o.steps; ++i) o.profile == "hand" ? hand.step(a, b) : taped.step(a, b);
    const clock_pair dt = clock_pair::now() - t0;
    std::printf("  --profile %s: %d steps, %.4f s/step (CPU %.4f s)\n", o.profile.c_str(), o.rounds * o.steps,
                dt.wall / (o.rounds * o.steps), dt.cpu / (o.rounds * o.steps));
    if (reset && before_kib > 0)
      std::printf("  --profile %s: peak RSS over these steps %.1f MiB (resident before them: %.1f MiB)\n",
                  o.profile.c_str(), static_cast<double>(status_kib("VmHWM:")) / 1024,
                  static_cast<double>(before_kib) / 1024);
    return 0;
  }
  for (int i = 0; i < o.warmup; ++i) {
    hand.step(a, b);
    taped.step(a, b);
  }
  const std::string load_before = bench::load_average();
  std::vector<double> hand_wall, tape_wall, hand_cpu, tape_cpu, wall_ratios, cpu_ratios;
  for (int round = 0; round < o.rounds; ++round) {
    clock_pair th, tt;
    auto time = [&](auto& tr, std::vector<double>& wall, std::vector<double>& cpu, clock_pair& sum) {
      for (int i = 0; i < o.steps; ++i) {
        const clock_pair t0 = clock_pair::now();
        tr.step(a, b);
        const clock_pair dt = clock_pair::now() - t0;
        wall.push_back(dt.wall);
        cpu.push_back(dt.cpu);
        sum += dt;
      }
    };
    if (round % 2 == 0) time(hand, hand_wall, hand_cpu, th), time(taped, tape_wall, tape_cpu, tt);
    else time(taped, tape_wall, tape_cpu, tt), time(hand, hand_wall, hand_cpu, th);
    wall_ratios.push_back(tt.wall / th.wall);
    cpu_ratios.push_back(tt.cpu / th.cpu);
    std::printf(
        "  round %d: hand %.4f s/step (CPU %.4f s), tape %.4f s/step (CPU %.4f s), tape / hand %.4f (CPU %.4f), load "
        "%s\n",
        round + 1, th.wall / o.steps, th.cpu / o.steps, tt.wall / o.steps, tt.cpu / o.steps, tt.wall / th.wall,
        tt.cpu / th.cpu, bench::load_average().c_str());
    std::fflush(stdout);
  }
  const std::string load_after = bench::load_average();
  struct summary {
    double hand, tape, ratio, round_median, round_min, round_max;
  };
  auto summarise = [](const std::vector<double>& h, const std::vector<double>& t, const std::vector<double>& r) {
    return summary{bench::median(h),
                   bench::median(t),
                   bench::median(t) / bench::median(h),
                   bench::median(r),
                   *std::min_element(r.begin(), r.end()),
                   *std::max_element(r.begin(), r.end())};
  };
  const summary wall = summarise(hand_wall, tape_wall, wall_ratios), cpu = summarise(hand_cpu, tape_cpu, cpu_ratios);
  std::printf("  %d engine thread(s); medians of %d steps each (%d rounds of %d); load %s before, %s after\n", threads,
              o.rounds * o.steps, o.rounds, o.steps, load_before.c_str(), load_after.c_str());
  for (const auto& [name, m] : {std::pair{"wall", wall}, std::pair{"CPU ", cpu}})
    std::printf(
        "  %s: hand %.4f s/step, tape %.4f s/step, tape / hand %.4f of the medians; per round median %.4f, min %.4f, "
        "max %.4f\n",
        name, m.hand, m.tape, m.ratio, m.round_median, m.round_min, m.round_max);
  std::printf(
      "{\"bench\":\"tape\",\"model\":\"cyclegan\",\"strategy\":\"one_device\",\"device\":\"cpu\",\"threads\":%d,"
      "\"size\":%d,"
      "\"channels\":%d,\"filters\":%d,\"blocks\":%d,\"d_layers\":%d,\"batch\":%d,\"rounds\":%d,\"steps_per_round\":%d,"
      "\"check_steps\":%d,\"bit_identical\":true,\"hand_s_per_step\":%.6f,\"tape_s_per_step\":%.6f,\"ratio\":%.4f,"
      "\"ratio_round_median\":%.4f,\"ratio_round_min\":%.4f,\"ratio_round_max\":%.4f,\"hand_cpu_s_per_step\":%.6f,"
      "\"tape_cpu_s_per_step\":%.6f,\"cpu_ratio\":%.4f,\"cpu_ratio_round_median\":%.4f,\"cpu_ratio_round_min\":%.4f,"
      "\"cpu_ratio_round_max\":%.4f,\"load_before\":\"%s\",\"load_after\":\"%s\",\"cpu\":\"%s\",\"compiler\":\"%s\","
      "\"time\":\"%s\"}\n",
      threads, o.size, o.channels, o.filters, o.blocks, o.d_layers, o.batch, o.rounds, o.steps, o.check_steps,
      wall.hand, wall.tape, wall.ratio, wall.round_median, wall.round_min, wall.round_max, cpu.hand, cpu.tape,
      cpu.ratio, cpu.round_median, cpu.round_min, cpu.round_max, load_before.c_str(), load_after.c_str(),
      bench::cpu_model().c_str(), bench::compiler(), bench::utc_now().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tape: %s\n", e.what());
    return 1;
  }
}
