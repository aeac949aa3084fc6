#pragma once
// One CycleGAN training step of the example's trainer (examples/cyclegan/trainer.hpp, `full`
// placement), timed on synthetic data: the side of "ours" in the comparison with PyTorch that
// benchmarks/peer/run_peer.sh runs (the peer is benchmarks/peer/cyclegan_torch.py, a port of the same
// networks and step). Prints the parameter counts, seconds per step, images per second (global batch
// / seconds per step), the peak RSS and one JSON line. See docs/benchmarks.md.
//
//   bench_cyclegan [--strategy one_device|mirrored|multi_worker] [--device cpu|cuda] [--tf32] [--replicas N] [--size 28]
//                  [--channels 1] [--filters 16] [--blocks 3] [--d-layers 2] [--batch 8] [--steps 5] [--warmup 1]
//                  [--overlap on|off|both] [--rounds 3] [--mpi-window on|off] [--precision float32|bf16|fp16]
//                  [--graphs on|off] [--autotune] [--nondeterministic] [--threads N] [--adapt-threads on|off]
//                  [--winograd on|off] [--background-load N] [--seed 1] [--check-dir DIR] [--params-only]
//
// --strategy multi_worker (builds with MPI; start it under mpirun -np K) runs K workers of --replicas
// CPU replicas each; worker 0 prints. --mpi-window off makes workers on one machine all-reduce
// over the ring of MPI messages that workers on different machines use, instead of the shared-memory
// window. --overlap chooses whether each network's gradient all-reduce
// runs while its backward does (on, the trainer's default) or after it (off); `both` alternates the
// two, --steps steps each, for --rounds rounds in one run, and prints for each the seconds per step
// and the communication the step waited for (`strategy.timings()`: time inside collectives, the
// replicas' mean), the communication share of the blocking step, the share of it that overlap hid
// (1 - communication on / communication off) and what the step time says of it.
//
// --threads N sets each replica's engine threads (compute_options::threads; 0, the default, takes the
// replica's share of the cores). --adapt-threads off keeps each CPU engine at that count; on (the
// default, compute_options::adapt_threads) it runs fewer threads while other processes keep the cores
// busy. --winograd off computes every CPU
// convolution directly (compute_options::conv_winograd; on, the default, the wide 3x3 ones with
// Winograd: oneDNN's kernel where it has one, the engine's own F(4x4, 3x3) elsewhere).
//
// --background-load N starts N busy processes (forked children, each spinning on arithmetic at
// normal priority) before the warm-up and kills them after the timed steps, also when the run fails
// (a child also dies with its parent: PR_SET_PDEATHSIG). The run then measures the step on a machine
// shared with N programs that compete for the cores; the output and the JSON line carry N
// ("background_load") and the load average. Under multi_worker every worker starts its own N.
//
// --precision bf16 on the CPU: convolutions on oneDNN's bf16 kernels where the CPU has bf16 units
// (the engine refuses otherwise, with the reason).
//
// --device cuda (in builds with CUDA: bench_cyclegan_cuda.cu) runs the same trainer on GPU replicas
// (one_device: cuda:0; mirrored: --replicas logical replicas dealt over the visible GPUs), in float32
// unless --tf32 or --precision bf16|fp16 (mixed precision: convolutions and products on 16-bit
// copies, float32 master weights; no loss scaling, as the trainer has none), and adds the peak of the
// library's device memory during the timed steps (its memory pool, plus what CUDA graphs own). --graphs on holds each network in
// nn::graphed: its forward and backward are captured as CUDA graphs in the warm-up steps and replayed
// in the timed ones (the line "CUDA graphs:" says whether each network replays, or why it does not).
// --autotune times cuDNN's engines for each convolution in the warm-up steps and keeps the fastest
// (compute_options::conv_autotune; the peer's torch.backends.cudnn.benchmark). --nondeterministic lets
// cuDNN pick engines whose sums depend on timing (compute_options::deterministic = false), as the
// peer's default (torch.backends.cudnn.deterministic = False) does.
//
// --batch is the GLOBAL batch (split between the replicas). Every step trains on the same random
// batch (uniform in [-1, 1]); the image pool is the trainer's own (50 images).
//
// --check-dir DIR runs one step and writes, as raw little-endian float32: DIR/init.bin, the initial
// parameters of G_AB, G_BA, D_A, D_B in their enumeration order (`for_each_parameter`); DIR/data.bin,
// the A then the B batch (NCHW); DIR/grads.bin, each parameter's gradient of that step (in the same
// order; the trainer zeroes gradients before, not after, each half of the step); DIR/after.bin, the
// parameters after the step; and DIR/ours.json, the step's losses. The port loads the first two, runs
// its own step and compares the rest (cyclegan_torch.py --check-dir DIR).

#include "models.hpp"
#include "trainer.hpp"

#include "bench_common.hpp"

#include <distribute/distribute.hpp>
#include <distribute/preemption.hpp>

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace dist = distribute;

namespace bench_cyclegan {

struct options {
  std::string strategy = "one_device";
  std::string device = "cpu";  // cpu or cuda (where the build has CUDA)
  bool tf32 = false;           // cuda: TF32 tensor-core convolutions and products
  std::string precision =
      "float32";  // float32, bf16 or fp16 (cuda) convolutions and products (compute_options::precision)
  int replicas = 2;
  int size = 28, channels = 1, filters = 16, blocks = 3, d_layers = 2, batch = 8;
  int steps = 5, warmup = 1;
  std::uint64_t seed = 1;
  std::string check_dir;
  bool params_only = false;       // print the parameter counts as JSON and exit
  std::string overlap = "on";     // on, off or both (alternating, --rounds times)
  bool graphs = false;            // cuda: each network's passes replayed as CUDA graphs (nn::graphed)
  bool autotune = false;          // cuda: cuDNN's engines timed per convolution (compute_options::conv_autotune)
  bool nondeterministic = false;  // cuda: any cuDNN engine (compute_options::deterministic = false)
  bool mpi_window =
      true;  // multi_worker: all-reduce through a shared-memory window on one machine (off: the ring of messages used between machines)
  int rounds = 3;
  int threads = 0;            // compute_options::threads (0: the replica's share of the cores)
  bool adapt_threads = true;  // compute_options::adapt_threads (--adapt-threads on|off)
  bool winograd = true;       // compute_options::conv_winograd
  int background_load = 0;    // busy child processes while the steps run
};

// The engine options of --threads, --adapt-threads, --winograd, --tf32, --precision, --autotune and --nondeterministic.
inline dist::compute_options engine_options_for(const options& o) {
  return {.threads = o.threads,
          .adapt_threads = o.adapt_threads,
          .conv_winograd = o.winograd,
          .tf32 = o.tf32,
          .precision = o.precision == "bf16"   ? dist::compute_precision::bfloat16
                       : o.precision == "fp16" ? dist::compute_precision::float16
                                               : dist::compute_precision::float32,
          .conv_autotune = o.autotune,
          .deterministic = !o.nondeterministic};
}

[[noreturn]] inline void usage(const char* why) {
  std::fprintf(stderr,
               "bench_cyclegan: %s\nusage: bench_cyclegan [--strategy one_device|mirrored|multi_worker] [--device "
               "cpu|cuda] [--tf32] "
               "[--replicas N] [--size S]\n       [--channels C] [--filters F] [--blocks B] [--d-layers L] [--batch "
               "GLOBAL] [--steps N] "
               "[--warmup N]\n       [--overlap on|off|both] [--rounds N] [--mpi-window on|off] [--precision "
               "float32|bf16|fp16] [--graphs on|off] [--autotune] [--nondeterministic]\n"
               "       [--threads N] [--adapt-threads on|off] [--winograd on|off] [--background-load N] [--seed S] "
               "[--check-dir DIR] [--params-only]\n",
               why);
  std::exit(2);
}

inline options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value after " + a).c_str());
      return argv[++i];
    };
    auto integer = [&] { return std::stoi(value()); };
    auto on_off = [&] {
      const std::string v = value();
      if (v != "on" && v != "off") usage((a + " must be on or off").c_str());
      return v == "on";
    };
    if (a == "--strategy") o.strategy = value();
    else if (a == "--device") o.device = value();
    else if (a == "--tf32") o.tf32 = true;
    else if (a == "--autotune") o.autotune = true;
    else if (a == "--nondeterministic") o.nondeterministic = true;
    else if (a == "--threads") o.threads = integer();
    else if (a == "--adapt-threads") o.adapt_threads = on_off();
    else if (a == "--winograd") o.winograd = on_off();
    else if (a == "--background-load") o.background_load = integer();
    else if (a == "--precision") o.precision = value();
    else if (a == "--replicas") o.replicas = integer();
    else if (a == "--size") o.size = integer();
    else if (a == "--channels") o.channels = integer();
    else if (a == "--filters") o.filters = integer();
    else if (a == "--blocks") o.blocks = integer();
    else if (a == "--d-layers") o.d_layers = integer();
    else if (a == "--batch") o.batch = integer();
    else if (a == "--steps") o.steps = integer();
    else if (a == "--warmup") o.warmup = integer();
    else if (a == "--seed") o.seed = std::stoull(value());
    else if (a == "--check-dir") o.check_dir = value();
    else if (a == "--params-only") o.params_only = true;
    else if (a == "--overlap") o.overlap = value();
    else if (a == "--graphs") o.graphs = on_off();
    else if (a == "--rounds") o.rounds = integer();
    else if (a == "--mpi-window") o.mpi_window = on_off();
    else if (a == "--help" || a == "-h") usage("help");
    else usage(("unknown option " + a).c_str());
  }
  if (o.strategy != "one_device" && o.strategy != "mirrored" && o.strategy != "multi_worker")
    usage("--strategy must be one_device, mirrored or multi_worker");
  if (o.overlap != "on" && o.overlap != "off" && o.overlap != "both") usage("--overlap must be on, off or both");
  if (o.rounds < 1) usage("--rounds must be positive");
  if (o.device != "cpu" && o.device != "cuda") usage("--device must be cpu or cuda");
  if (o.precision != "float32" && o.precision != "bf16" && o.precision != "fp16")
    usage("--precision must be float32, bf16 or fp16");
  if (o.precision == "fp16" && o.device != "cuda")
    usage("--precision fp16 needs --device cuda (the CPU engine computes in float32 or bf16)");
  if (o.graphs && o.device != "cuda") usage("--graphs on needs --device cuda");
  if (o.strategy == "one_device") o.replicas = 1;
  if (o.threads < 0) usage("--threads must be 0 (the replica's share) or positive");
  if (o.background_load < 0) usage("--background-load must be 0 or positive");
  if (o.replicas < 1 || o.batch < 1 || o.steps < 1 || o.warmup < 0) usage("replicas, batch and steps must be positive");
  if (o.strategy != "multi_worker" && o.batch % o.replicas != 0)
    usage("--batch (global) must be a multiple of --replicas");
  if (!o.check_dir.empty()) o.steps = 1, o.warmup = 0;
  return o;
}

inline double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // ru_maxrss is in KiB on Linux
}

// --background-load: N busy child processes for as long as this lives. Each spins on arithmetic at
// normal priority until it is killed: by the destructor (the end of the run, or an exception passing
// through), or by the kernel when this process dies any other way (PR_SET_PDEATHSIG), so none
// outlives the benchmark.
class background_load {
 public:
  explicit background_load(int n) {
    std::fflush(nullptr);  // the children never write, but must not inherit unwritten output either
    const pid_t parent = getpid();
    for (int i = 0; i < n; ++i) {
      const pid_t pid = fork();
      if (pid < 0) {
        const int e = errno;
        stop();
        throw std::runtime_error(std::string("--background-load: fork failed: ") + std::strerror(e));
      }
      if (pid == 0) spin(parent);
      children_.push_back(pid);
    }
  }
  ~background_load() { stop(); }
  background_load(const background_load&) = delete;
  background_load& operator=(const background_load&) = delete;
  int size() const noexcept { return static_cast<int>(children_.size()); }

 private:
  // The child: only async-signal-safe calls (the parent may have threads).
  [[noreturn]] static void spin(pid_t parent) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(0);  // the parent died before the line above
    volatile double x = 1.0;
    for (;;) x = x * 1.0000001 + 1e-9;
  }
  void stop() noexcept {
    for (const pid_t pid : children_) kill(pid, SIGKILL);
    for (const pid_t pid : children_)
      while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {}
    children_.clear();
  }
  std::vector<pid_t> children_;
};

inline int affinity_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
}

// A model's parameters and gradients appended, read through the host wherever they live.
template <class M>
void append_parameters(M& model, std::vector<float>& values, std::vector<float>& grads) {
  model.for_each_parameter([&](auto v, auto g) {
    for (auto [span, out] : {std::pair{v, &values}, std::pair{g, &grads}}) {
      out->resize(out->size() + span.size());
      dist::detail::copy_parameter_values<M>(span.data(), span.size(), out->data() + out->size() - span.size());
    }
  });
}

// What the run reports of the device: its name and, on a GPU, the peak of device memory in use.
struct device_report {
  std::string name;                  // empty: the CPU (its model is printed)
  std::function<void()> reset_peak;  // before the timed steps
  std::function<double()> peak_mib;  // after them; < 0: not measured
};

inline void write_floats(const std::string& path, const std::vector<float>& v) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  if (!out) throw std::runtime_error("cannot write " + path);
}

template <class Trainer>
void all_parameters(Trainer& tr, std::vector<float>& values, std::vector<float>& grads) {
  values.clear();
  grads.clear();
  append_parameters(tr.g_ab().primary(), values, grads);
  append_parameters(tr.g_ba().primary(), values, grads);
  append_parameters(tr.d_a().primary(), values, grads);
  append_parameters(tr.d_b().primary(), values, grads);
}

// The A and B batches every step trains on: uniform in [-1, 1], from the seed.
inline std::pair<cyclegan::tensor, cyclegan::tensor> random_batches(const options& o) {
  const auto image = dist::shape::nchw(o.batch, o.channels, o.size, o.size);
  std::mt19937_64 rng{o.seed * 7919 + 17};
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  cyclegan::tensor a{image}, b{image};
  for (auto& v : a) v = uniform(rng);
  for (auto& v : b) v = uniform(rng);
  return {std::move(a), std::move(b)};
}

// --overlap both: the same trainer alternating blocking and overlapped gradient all-reduce, --steps
// steps each per round; per mode the median seconds per step and the communication per step.
template <dist::strategy S, class Trainer>
int compare_overlap(S& s, Trainer& tr, const options& o, std::int64_t g_params, std::int64_t d_params) {
  auto [a, b] = random_batches(o);
  const bool chief = s.is_chief();
  if (chief) {
    std::printf(
        "bench_cyclegan --overlap both: %s x%d (%d worker(s)%s), %dx%dx%d, %d filters, %d blocks, %d d-layers, global "
        "batch %d\n",
        o.strategy.c_str(), s.num_replicas_in_sync(), s.num_workers(),
        o.strategy != "multi_worker" ? ""
        : o.mpi_window               ? ", MPI shared-memory window"
                                     : ", MPI ring of messages",
        o.size, o.size, o.channels, o.filters, o.blocks, o.d_layers, o.batch);
    std::printf(
        "  parameters: G %lld, D %lld (each of two); %s, %d cores in this process's affinity, load %s, background load "
        "%d\n",
        static_cast<long long>(g_params), static_cast<long long>(d_params), bench::cpu_model().c_str(),
        affinity_cores(), bench::load_average().c_str(), o.background_load);
    std::fflush(stdout);
  }
  for (int i = 0; i < o.warmup; ++i) {
    tr.set_overlap(i % 2 == 1);
    tr.step(a, b);
  }
  std::vector<double> step_s[2], comm_s[2];  // [0]: off, [1]: on
  for (int round = 0; round < o.rounds; ++round) {
    for (const int on : {0, 1}) {
      tr.set_overlap(on == 1);
      for (int i = 0; i < o.steps; ++i) {
        const auto before = s.timings();
        const auto t0 = std::chrono::steady_clock::now();
        tr.step(a, b);
        step_s[on].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        comm_s[on].push_back((s.timings() - before).collective);
      }
    }
  }
  const double off = bench::median(step_s[0]), on = bench::median(step_s[1]);
  const double comm_off = bench::median(comm_s[0]), comm_on = bench::median(comm_s[1]);
  // Hidden: the share of the blocking step's communication the overlapped step no longer waits for
  // (by the replicas' time inside collectives); the step-time difference says what that bought, to
  // within the run's noise.
  const double share = off > 0 ? comm_off / off : 0, hidden = comm_off > 0 ? 1 - comm_on / comm_off : 0;
  if (chief) {
    std::printf("  overlap off: %.4f s/step, communication %.4f s/step (%.1f%% of the step)\n", off, comm_off,
                100 * share);
    std::printf("  overlap on:  %.4f s/step, communication waited for %.4f s/step\n", on, comm_on);
    std::printf(
        "  overlap hid %.1f%% of the blocking step's communication; step time on/off = %.3f, a difference of %.1f%% of "
        "the\n"
        "  blocking communication (medians of %d steps each, %d rounds)\n",
        100 * hidden, off > 0 ? on / off : 0, comm_off > 0 ? 100 * (off - on) / comm_off : 0.0, o.steps * o.rounds,
        o.rounds);
    std::printf(
        "{\"bench\":\"cyclegan_overlap\",\"strategy\":\"%s\",\"mpi_window\":%s,\"workers\":%d,\"replicas\":%d,\"size\":"
        "%d,\"filters\":%d,"
        "\"blocks\":%d,\"global_batch\":%d,\"steps\":%d,\"rounds\":%d,\"s_per_step_off\":%.6f,\"s_per_step_on\":%.6f,"
        "\"comm_off\":%.6f,\"comm_on\":%.6f,\"comm_share_off\":%.4f,\"hidden\":%.4f,\"cores\":%d,\"load\":\"%s\","
        "\"background_load\":%d,\"cpu\":\"%s\",\"time\":\"%s\"}\n",
        o.strategy.c_str(), o.mpi_window ? "true" : "false", s.num_workers(), s.num_replicas_in_sync(), o.size,
        o.filters, o.blocks, o.batch, o.steps, o.rounds, off, on, comm_off, comm_on, share, hidden, affinity_cores(),
        bench::load_average().c_str(), o.background_load, bench::cpu_model().c_str(), bench::utc_now().c_str());
  }
  return 0;
}

template <dist::strategy S>
int run(S& s, const options& o, const device_report& dev = {}) {
  cyclegan::train_options t;
  t.gen = {.channels = o.channels, .filters = o.filters, .blocks = o.blocks};
  t.disc = {.channels = o.channels, .filters = o.filters, .layers = o.d_layers, .norm = cyclegan::norm_kind::instance};
  t.batch = o.batch / s.num_replicas_in_sync();
  t.total_steps = o.warmup + o.steps;
  t.decay_fraction = 0;  // a constant learning rate: the schedule is not what is timed
  t.place = cyclegan::placement::full;
  t.seed = o.seed;
  t.overlap = o.overlap != "off";
  t.graphs = o.graphs;
  if (o.batch % s.num_replicas_in_sync() != 0) usage("--batch (global) must be a multiple of the replicas in sync");
  cyclegan::trainer<S> tr(s, t, o.channels, o.size, o.size);
  // Under multi_worker every worker runs the steps; worker 0 prints.
  const bool chief = s.is_chief();
  auto say = [chief](const char* format, auto... args) {
    if (chief) std::printf(format, args...);
  };

  const std::int64_t g_params = cyclegan::parameter_count(tr.g_ab().primary());
  const std::int64_t d_params = cyclegan::parameter_count(tr.d_a().primary());
  if (o.params_only) {
    say("{\"g_params\":%lld,\"d_params\":%lld}\n", static_cast<long long>(g_params), static_cast<long long>(d_params));
    return 0;
  }
  // Started before the warm-up, killed when this returns or throws.
  const background_load busy(o.background_load);
  if (o.overlap == "both") return compare_overlap(s, tr, o, g_params, d_params);

  auto [a, b] = random_batches(o);

  std::vector<float> values, grads;
  if (!o.check_dir.empty()) {
    all_parameters(tr, values, grads);
    write_floats(o.check_dir + "/init.bin", values);
    std::vector<float> data(a.begin(), a.end());
    data.insert(data.end(), b.begin(), b.end());
    write_floats(o.check_dir + "/data.bin", data);
  }

  say("bench_cyclegan: %s x%d, %dx%dx%d, %d filters, %d blocks, %d d-layers, global batch %d\n", o.strategy.c_str(),
      s.num_replicas_in_sync(), o.size, o.size, o.channels, o.filters, o.blocks, o.d_layers, o.batch);
  say("  parameters: G %lld, D %lld (each of two)\n", static_cast<long long>(g_params),
      static_cast<long long>(d_params));
  if (dev.name.empty())
    say("  %s, %d cores in this process's affinity, %s, load %s, background load %d busy process(es)\n",
        bench::cpu_model().c_str(), affinity_cores(), o.precision.c_str(), bench::load_average().c_str(), busy.size());
  else
    say("  %s, %s (host: %s), load %s, background load %d busy process(es)\n", dev.name.c_str(),
        o.precision != "float32" ? o.precision.c_str()
        : o.tf32                 ? "TF32"
                                 : "float32",
        bench::cpu_model().c_str(), bench::load_average().c_str(), busy.size());
  std::fflush(stdout);

  cyclegan::step_losses first{};
  for (int i = 0; i < o.warmup; ++i) {
    const auto l = tr.step(a, b);
    if (i == 0) first = l;
  }
  if (dev.reset_peak) dev.reset_peak();
  std::vector<double> times;
  for (int i = 0; i < o.steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto l = tr.step(a, b);
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (o.warmup == 0 && i == 0) first = l;
  }
  // The fewest threads a replica's CPU engine ran at the end (with --adapt-threads, fewer than its share
  // while the machine was busy); 0 on other engines.
  std::atomic<int> in_use{0};
  s.run([&](dist::replica auto& r) {
    if constexpr (requires { r.engine().active_threads(); }) {
      const int t = r.engine().active_threads();
      int seen = in_use.load();
      while ((seen == 0 || t < seen) && !in_use.compare_exchange_weak(seen, t)) {}
    }
  });
  const double per_step = bench::median(times);
  double mean = 0;
  for (double x : times) mean += x / static_cast<double>(times.size());
  const double images = o.batch / per_step;
  const double rss = peak_rss_mib();
  const double device_mib = dev.peak_mib ? dev.peak_mib() : -1.0;

  say("  step-1 losses: D_A %.6f, D_B %.6f, GAN_AB %.6f, GAN_BA %.6f, cycle %.6f, identity %.6f\n", first.d_a,
      first.d_b, first.gan_ab, first.gan_ba, first.cycle, first.identity);
  say("  %.4f s/step (median of %d, mean %.4f; %d warm-up), %.4g images/s, peak RSS %.1f MiB", per_step, o.steps, mean,
      o.warmup, images, rss);
  if (device_mib >= 0) say(", peak device memory %.1f MiB", device_mib);
  say("\n");
  if (in_use.load() > 0)
    say("  engine threads in use at the end: %d%s\n", in_use.load(), o.adapt_threads ? "" : " (--adapt-threads off)");
  // What watching for preemption adds to a step without a signal (preemption_watch::stop_requested:
  // a flag read in one process, one all-reduce of one integer across workers), beside the step.
  {
    dist::preemption_watch<S> watch{s};
    constexpr int checks = 2000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < checks; ++i)
      if (watch.stop_requested()) break;
    const double check = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / checks;
    say("  preemption check (no signal): %.2f us a step, %.4f%% of the step\n", 1e6 * check, 100 * check / per_step);
  }
  // The CPU engine's kernel choices, timed during the warm-up (compute_options::cpu_conv_choice).
  if (const auto choices = dist::cpu_conv_choices(); !choices.empty()) {
    say("  kernel choices timed during the warm-up (%zu):\n", choices.size());
    for (const auto& c : choices) say("    %s\n", c.to_string().c_str());
  }
  if (const auto graphs = tr.graph_status(); !graphs.empty()) say("  CUDA graphs: %s\n", graphs.c_str());

  if (!o.check_dir.empty()) {
    all_parameters(tr, values, grads);
    write_floats(o.check_dir + "/grads.bin", grads);
    write_floats(o.check_dir + "/after.bin", values);
    std::ofstream js(o.check_dir + "/ours.json");
    js.precision(10);
    js << "{\"d_a\":" << first.d_a << ",\"d_b\":" << first.d_b << ",\"gan_ab\":" << first.gan_ab
       << ",\"gan_ba\":" << first.gan_ba << ",\"cycle\":" << first.cycle << ",\"identity\":" << first.identity << "}\n";
  }

  say("{\"bench\":\"cyclegan\",\"side\":\"ours\",\"device\":\"%s\",\"tf32\":%s,\"precision\":\"%s\",\"graphs\":%s,"
      "\"autotune\":%s,\"deterministic\":%s,\"peak_device_mib\":%.1f,\"strategy\":\"%s\",\"replicas\":%d,\"size\":%d,"
      "\"channels\":%d,\"filters\":%d,"
      "\"blocks\":%d,\"d_layers\":%d,\"global_batch\":%d,\"steps\":%d,\"warmup\":%d,\"g_params\":%lld,\"d_params\":%"
      "lld,"
      "\"s_per_step\":%.6f,\"s_per_step_mean\":%.6f,\"images_per_s\":%.4f,\"peak_rss_mib\":%.1f,\"cores\":%d,\"load\":"
      "\"%s\","
      "\"threads\":%d,\"adapt_threads\":%s,\"threads_in_use\":%d,\"background_load\":%d,\"cpu\":\"%s\",\"compiler\":\"%"
      "s\",\"time\":\"%s\"}\n",
      dev.name.empty() ? "cpu" : dev.name.c_str(), o.tf32 ? "true" : "false", o.precision.c_str(),
      o.graphs ? "true" : "false", o.autotune ? "true" : "false", o.nondeterministic ? "false" : "true", device_mib,
      o.strategy.c_str(), s.num_replicas_in_sync(), o.size, o.channels, o.filters, o.blocks, o.d_layers, o.batch,
      o.steps, o.warmup, static_cast<long long>(g_params), static_cast<long long>(d_params), per_step, mean, images,
      rss, affinity_cores(), bench::load_average().c_str(), o.threads, o.adapt_threads ? "true" : "false",
      in_use.load(), busy.size(), bench::cpu_model().c_str(), bench::compiler(), bench::utc_now().c_str());
  return 0;
}

}  // namespace bench_cyclegan
