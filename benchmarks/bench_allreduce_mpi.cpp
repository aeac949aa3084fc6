// The MPI side of bench_allreduce, run under mpiexec. Three modes:
//
//   mpiexec -np N bench_allreduce_mpi --sizes 4096,65536 [--min-seconds 0.05] [--repetitions 5]
//     The peer figure of bench_allreduce: MPI_Allreduce (MPI_SUM, MPI_FLOAT, in place) across the
//     processes, timed the way bench_allreduce times its own all-reduce. Rank 0 prints one JSON line
//     per size, {"bytes":B,"seconds_per_iter":S}, which bench_allreduce parses.
//
//   mpiexec -np W bench_allreduce_mpi --multi-worker --replicas 1,2 --sizes ...
//     multi_worker_mirrored_strategy<cpu, mpi>: W workers x R replicas all-reducing a buffer of each
//     size per replica (hierarchical: shared memory, then MPI across workers, then fan-out), side by
//     side with raw MPI_Allreduce of the same size per process, in the same processes.
//
//   mpiexec -np W bench_allreduce_mpi --gradients --replicas 1,2 [--mpi-window on|off]
//     A CycleGAN-sized parameter set (two ResNet generators, two PatchGAN discriminators: 116 tensors,
//     28.3 M floats) and a set of many small tensors (1,024 x 256 floats): all_reduce_gradients in
//     fused buckets against one MPI_Allreduce per tensor, beside the bound of one pass over the set
//     (each process reading and writing it once, in place), the least any all-reduce of it can take;
//     and the fused buckets travelling as bfloat16 (gradient_compression::bfloat16: half the bytes,
//     two conversions more).
//
//   mpiexec -np W bench_allreduce_mpi --overlap [--set cyclegan|discriminators] [--compute-ms 400]
//                                     [--mpi-window on|off]
//     How the gradient all-reduce proceeds beside backward's compute, by the two ways a worker can
//     have its collectives progress while it computes: the library's (r.overlap_gradients: the
//     buckets run on a communication thread, announced by r.gradients_ready as each layer's compute
//     ends) and MPI_Iallreduce (one per tensor, started as its layer's compute ends and progressed by
//     MPI_Testall after each layer; MPI_Waitall at the end). The compute is a fixed amount of
//     arithmetic per layer, in proportion to its size (calibrated on rank 0 to --compute-ms in all),
//     on the replica's thread. Each way is timed alone (compute only, all-reduce only), one after the
//     other (blocking), and overlapped, with the time the overlapped step still waits for the
//     all-reduce after its last layer (in wait() / MPI_Waitall); hidden = 1 - that wait / the
//     all-reduce alone.
//
// The last three print a table and JSON lines with "workers" (rank 0). The timed loops run inside one
// step of the strategy, between barriers, so that the clock on rank 0 covers every replica; ours and
// MPI alternate in rounds so that both see the same machine.

#include <distribute/comm/mpi_runtime.hpp>
#include <distribute/concepts/replica.hpp>
#include <distribute/strategy/multi_worker_mirrored_strategy.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace dist = distribute;

namespace {

enum class mode { peer, multi_worker, gradients, overlap };

struct options {
  mode what = mode::peer;
  std::string set = "cyclegan";    // --overlap: the parameter set
  double compute_ms = 400;         // --overlap: the compute of one backward
  bool mpi_window = true;          // --overlap, --gradients: workers of one machine share memory (off: messages)
  std::vector<std::size_t> sizes;  // bytes per process (or replica)
  std::vector<int> replicas{1, 2};
  double min_seconds = 0.05;  // each timed repetition runs at least this long
  int repetitions = 5;        // timed repetitions; the median is reported
};

std::vector<std::size_t> parse_sizes(std::string_view list) {
  std::vector<std::size_t> sizes;
  while (!list.empty()) {
    const auto comma = list.find(',');
    const std::string item(list.substr(0, comma));
    std::size_t used = 0;
    const auto bytes = std::stoull(item, &used);
    if (used != item.size() || bytes == 0 || bytes % sizeof(float) != 0)
      throw std::invalid_argument("size '" + item + "' is not a positive multiple of 4 bytes");
    if (bytes / sizeof(float) > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw std::invalid_argument("size '" + item + "' has more elements than an MPI count can hold");
    sizes.push_back(bytes);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
  }
  return sizes;
}

options parse_options(int argc, char** argv) {
  options opts;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--multi-worker") {
      opts.what = mode::multi_worker;
      continue;
    }
    if (arg == "--gradients") {
      opts.what = mode::gradients;
      continue;
    }
    if (arg == "--overlap") {
      opts.what = mode::overlap;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + std::string(arg));
    const char* value = argv[++i];
    if (arg == "--sizes") opts.sizes = parse_sizes(value);
    else if (arg == "--replicas") opts.replicas = bench::parse_int_list(value);
    else if (arg == "--min-seconds") opts.min_seconds = std::stod(value);
    else if (arg == "--repetitions") opts.repetitions = std::stoi(value);
    else if (arg == "--set") opts.set = value;
    else if (arg == "--compute-ms") opts.compute_ms = std::stod(value);
    else if (arg == "--mpi-window") {
      if (std::string_view(value) != "on" && std::string_view(value) != "off")
        throw std::invalid_argument("--mpi-window: on or off, got " + std::string(value));
      opts.mpi_window = std::string_view(value) == "on";
    } else throw std::invalid_argument("unknown argument " + std::string(arg));
  }
  if (opts.set != "cyclegan" && opts.set != "discriminators")
    throw std::invalid_argument("--set: cyclegan or discriminators, got " + opts.set);
  if (!(opts.compute_ms > 0)) throw std::invalid_argument("--compute-ms must be positive");
  if (opts.sizes.empty() && opts.what != mode::gradients && opts.what != mode::overlap) {
    if (opts.what == mode::peer) throw std::invalid_argument("--sizes is required");
    for (std::size_t b = 4096; b <= (std::size_t{64} << 20); b *= 4) opts.sizes.push_back(b);
  }
  if (opts.repetitions < 1 || opts.min_seconds <= 0) throw std::invalid_argument("bad timing policy");
  for (int r : opts.replicas)
    if (r < 1) throw std::invalid_argument("--replicas: counts from 1");
  return opts;
}

// Times `step` in a group whose `sync()` is a barrier and whose `share(v)` gives everyone rank 0's
// v: the group agrees on the iteration count, and rank 0's clock, read between barriers, covers the
// slowest member. The median seconds per step on rank 0 (meaningless elsewhere).
template <class Step, class Sync, class Share>
double time_in_group(bool leader, const options& policy, Step step, Sync sync, Share share) {
  auto timed = [&](std::int64_t iters) {
    sync();
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) step();
    sync();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  step();  // warm-up: connections, first touch of the engines' buffers
  std::int64_t iters = 1;
  for (;;) {
    const double seconds = timed(iters);
    const std::int64_t next = share(leader ? bench::next_iterations(iters, seconds, policy.min_seconds) : 0);
    if (next == iters) break;
    iters = next;
  }
  std::vector<double> per_iter;
  for (int k = 0; k < policy.repetitions; ++k) per_iter.push_back(timed(iters) / static_cast<double>(iters));
  return bench::median(per_iter);
}

double time_raw_mpi(std::size_t bytes, int rank, const options& opts, int repeat = 1) {
  // Filling pre-faults the pages; zeros keep the repeated in-place sums finite.
  std::vector<float> buf(bytes / sizeof(float), 0.0f);
  const int count = static_cast<int>(buf.size());
  return time_in_group(
      rank == 0, opts,
      [&] {
        for (int i = 0; i < repeat; ++i)
          MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      },
      [] { MPI_Barrier(MPI_COMM_WORLD); },
      [](std::int64_t v) {
        MPI_Bcast(&v, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
        return v;
      });
}

// `step(replica)` timed inside one step of the strategy, on every replica of every worker.
template <class S, class Prepare>
double time_strategy(S& s, const options& opts, Prepare prepare) {
  const auto seconds = s.run([&](dist::replica auto& r) {
    auto step = prepare(r);
    return time_in_group(
        r.replica_id() == 0, opts, step, [&] { r.barrier(); }, [&](std::int64_t v) { return r.broadcast(v, 0); });
  });
  return seconds[0];
}

// Ours and the peer are measured in alternating rounds; each figure is the median round.
constexpr int rounds = 3;

double gbs(std::size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

std::string human_bytes(std::size_t b) {
  if (b >= (std::size_t{1} << 20) && b % (std::size_t{1} << 20) == 0) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024 && b % 1024 == 0) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

void print_header(const char* what, int workers, const options& opts) {
  std::printf("# bench_allreduce_mpi %s  %s\n", what, bench::utc_now().c_str());
  std::printf("# machine: %u hardware threads, %s; load average before the run: %s\n",
              std::thread::hardware_concurrency(), bench::cpu_model().c_str(), bench::load_average().c_str());
  std::printf(
      "# %d workers (MPI processes); compiler: %s; timing: median of %d alternating rounds, each the median of\n"
      "# %d repetitions of >= %.0f ms\n",
      workers, bench::compiler(), rounds, opts.repetitions, opts.min_seconds * 1e3);
}

void multi_worker(int rank, int workers, const options& opts) {
  struct row {
    int replicas;
    std::size_t bytes;
    double ours, mpi;
  };
  std::vector<row> rows;
  if (rank == 0) {
    print_header("--multi-worker", workers, opts);
    std::printf(
        "# algbw = bytes per replica / time, GB = 1e9 bytes; MPI = MPI_Allreduce of the same bytes per process\n\n");
    std::printf("%8s  %9s  %10s  %9s  %9s  %8s\n", "workers", "replicas", "size", "ours GB/s", "MPI GB/s", "ours/MPI");
    std::fflush(stdout);
  }
  for (const int replicas : opts.replicas) {
    dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi> s{{.local_replicas = replicas}};
    for (const std::size_t bytes : opts.sizes) {
      // The two alternate, round after round, so that they see the same machine (the median round).
      std::vector<double> mpi_rounds, ours_rounds;
      for (int round = 0; round < rounds; ++round) {
        mpi_rounds.push_back(time_raw_mpi(bytes, rank, opts));
        ours_rounds.push_back(time_strategy(s, opts, [&](auto& r) {
          return [&r, buf = std::vector<float>(bytes / sizeof(float), 0.0f)]() mutable {
            r.all_reduce(dist::reduce_op::sum, buf);
          };
        }));
      }
      const double mpi = bench::median(mpi_rounds), ours = bench::median(ours_rounds);
      if (rank == 0) {
        const row x{replicas, bytes, gbs(bytes, ours), gbs(bytes, mpi)};
        std::printf("%8d  %9d  %10s  %9.3f  %9.3f  %7.2fx\n", workers, replicas, human_bytes(bytes).c_str(), x.ours,
                    x.mpi, x.ours / x.mpi);
        std::fflush(stdout);
        rows.push_back(x);
      }
    }
  }
  if (rank != 0) return;
  std::printf("\n");
  for (const auto& x : rows)
    std::printf(
        "{\"bench\":\"allreduce_multi_worker\",\"workers\":%d,\"replicas_per_worker\":%d,\"bytes\":%zu,"
        "\"algbw_gbs\":%.4f,\"mpi_algbw_gbs\":%.4f}\n",
        workers, x.replicas, x.bytes, x.ours, x.mpi);
}

// The parameter tensors of CycleGAN (two ResNet-9 generators for 256x256 images, two 70x70
// PatchGAN discriminators, instance norm without affine parameters, so every convolution has a bias):
// 116 tensors, 28.3 M floats.
std::vector<std::size_t> cyclegan_tensors() {
  std::vector<std::size_t> t;
  auto conv = [&](std::size_t in, std::size_t out, std::size_t k) {
    t.push_back(in * out * k * k);
    t.push_back(out);
  };
  for (int g = 0; g < 2; ++g) {
    conv(3, 64, 7);
    conv(64, 128, 3);
    conv(128, 256, 3);
    for (int b = 0; b < 18; ++b) conv(256, 256, 3);  // 9 residual blocks of two convolutions
    conv(256, 128, 3);
    conv(128, 64, 3);
    conv(64, 3, 7);
  }
  for (int d = 0; d < 2; ++d) {
    conv(3, 64, 4);
    conv(64, 128, 4);
    conv(128, 256, 4);
    conv(256, 512, 4);
    conv(512, 1, 4);
  }
  return t;
}

struct gradient_set {
  using scalar_type = float;
  std::vector<std::vector<float>> grads;
  template <class F>
  void for_each_parameter(F&& f) {
    for (auto& g : grads) f(std::span<float>(g), std::span<float>(g));
  }
};

// Many small tensors (the biases and normalisation parameters of a deep network): 1,024 tensors
// of 256 floats, 1 MiB in all. Here a call's fixed cost, not the bytes, decides.
std::vector<std::size_t> small_tensors() { return std::vector<std::size_t>(1024, 256); }

void gradients(int rank, int workers, const options& opts) {
  struct parameter_set {
    const char* name;
    std::vector<std::size_t> tensors;
  };
  const parameter_set sets[] = {{"cyclegan", cyclegan_tensors()}, {"small", small_tensors()}};
  struct row {
    const char* set;
    std::size_t tensors, floats;
    int replicas;
    double fused, ours_per_tensor, mpi_per_tensor, pass, bf16;
    std::size_t buckets;
  };
  std::vector<row> rows;
  if (rank == 0) {
    print_header("--gradients", workers, opts);
    std::printf(
        "# fused = all_reduce_gradients, 25 MiB buckets; per tensor = one collective per tensor (ours with\n"
        "# bucket_bytes 0, and MPI_Allreduce); pass = every process reading and writing its whole set once,\n"
        "# in place, all at once: the least any all-reduce of it must do, so MPI/pass bounds what fusing\n"
        "# can gain; bf16 = the fused buckets travelling as bfloat16 (gradient_compression::bfloat16)\n");
    std::printf("# between the workers: %s\n",
                opts.mpi_window ? "the shared-memory window of workers on one machine" : "the ring of MPI messages");
    for (const auto& set : sets) {
      std::size_t floats = 0;
      for (auto n : set.tensors) floats += n;
      std::printf("# set %s: %zu tensors, %zu floats (%.1f MiB)\n", set.name, set.tensors.size(), floats,
                  static_cast<double>(floats * sizeof(float)) / (1 << 20));
    }
    std::printf("\n%8s  %8s  %9s  %8s  %9s  %8s  %14s  %13s  %8s  %11s  %10s  %11s\n", "set", "workers", "replicas",
                "buckets", "fused ms", "bf16 ms", "ours/tensor ms", "MPI/tensor ms", "pass ms", "MPI / fused",
                "MPI / pass", "fused / bf16");
    std::fflush(stdout);
  }
  auto time_mpi = [&](auto&& body) {
    return time_in_group(
        rank == 0, opts, body, [] { MPI_Barrier(MPI_COMM_WORLD); },
        [](std::int64_t v) {
          MPI_Bcast(&v, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
          return v;
        });
  };
  for (const auto& set : sets) {
    const auto& tensors = set.tensors;
    std::size_t floats = 0;
    for (auto n : tensors) floats += n;
    // Raw MPI, one MPI_Allreduce per tensor, and the one-pass bound, in the same processes; measured
    // beside each row, so that all see the same machine.
    std::vector<std::vector<float>> raw;
    for (auto n : tensors) raw.emplace_back(n, 0.0f);
    auto time_mpi_per_tensor = [&] {
      return time_mpi([&] {
        for (auto& g : raw)
          MPI_Allreduce(MPI_IN_PLACE, g.data(), static_cast<int>(g.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      });
    };
    auto time_pass = [&] {
      return time_mpi([&] {
        for (auto& g : raw)
          for (auto& x : g) x = -x;
      });
    };
    for (const int replicas : opts.replicas) {
      dist::comm::mpi_options mpi_opts;
      mpi_opts.shared_memory = opts.mpi_window;
      dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi> s{{.local_replicas = replicas, .mpi = mpi_opts}};
      auto models = s.values_from_function([&](int) {
        gradient_set m;
        for (auto n : tensors) m.grads.emplace_back(n, 0.0f);
        return m;
      });
      std::size_t buckets = 0;
      auto time_with = [&](std::size_t bucket_bytes,
                           dist::gradient_compression compression = dist::gradient_compression::none) {
        return time_strategy(s, opts, [&](auto& r) {
          auto& m = models[static_cast<std::size_t>(r.replica_id() - s.first_replica_id())];
          return [&r, &m, &buckets, bucket_bytes, compression] {
            const auto n = r.all_reduce_gradients(m, {.bucket_bytes = bucket_bytes, .compression = compression});
            if (r.replica_id() == 0 && bucket_bytes != 0) buckets = n;
          };
        });
      };
      std::vector<double> mpi_rounds, fused_rounds, ours_rounds, pass_rounds, bf16_rounds;
      const std::size_t fused_cap = dist::gradient_reduction{}.bucket_bytes;
      for (int round = 0; round < rounds; ++round) {
        mpi_rounds.push_back(time_mpi_per_tensor());
        pass_rounds.push_back(time_pass());
        fused_rounds.push_back(time_with(fused_cap));
        ours_rounds.push_back(time_with(0));
        bf16_rounds.push_back(time_with(fused_cap, dist::gradient_compression::bfloat16));
      }
      if (rank == 0) {
        const row x{set.name,
                    tensors.size(),
                    floats,
                    replicas,
                    bench::median(fused_rounds),
                    bench::median(ours_rounds),
                    bench::median(mpi_rounds),
                    bench::median(pass_rounds),
                    bench::median(bf16_rounds),
                    buckets};
        std::printf("%8s  %8d  %9d  %8zu  %9.3f  %8.3f  %14.3f  %13.3f  %8.3f  %10.2fx  %9.2fx  %10.2fx\n", x.set,
                    workers, replicas, buckets, x.fused * 1e3, x.bf16 * 1e3, x.ours_per_tensor * 1e3,
                    x.mpi_per_tensor * 1e3, x.pass * 1e3, x.mpi_per_tensor / x.fused, x.mpi_per_tensor / x.pass,
                    x.fused / x.bf16);
        std::fflush(stdout);
        rows.push_back(x);
      }
    }
  }
  if (rank != 0) return;
  std::printf("\n");
  for (const auto& x : rows)
    std::printf(
        "{\"bench\":\"gradient_allreduce\",\"set\":\"%s\",\"workers\":%d,\"replicas_per_worker\":%d,\"tensors\":%zu,"
        "\"floats\":%zu,\"buckets\":%zu,\"fused_seconds\":%.6f,\"ours_per_tensor_seconds\":%.6f,"
        "\"mpi_per_tensor_seconds\":%.6f,\"pass_seconds\":%.6f,\"bfloat16_fused_seconds\":%.6f,\"mpi_window\":%s}\n",
        x.set, workers, x.replicas, x.tensors, x.floats, x.buckets, x.fused, x.ours_per_tensor, x.mpi_per_tensor,
        x.pass, x.bf16, opts.mpi_window ? "true" : "false");
}

// The two discriminators of cyclegan_tensors() alone (what the example mirrors): 10 tensors, 5.5 M floats.
std::vector<std::size_t> discriminator_tensors() {
  const auto all = cyclegan_tensors();
  return std::vector<std::size_t>(all.end() - 20, all.end());
}

// One tensor of a gradient_set, as a layer whose backward has just finished (r.gradients_ready).
struct one_gradient {
  using scalar_type = float;
  std::vector<float>* g;
  template <class F>
  void for_each_parameter(F&& f) {
    f(std::span<float>(*g), std::span<float>(*g));
  }
};

// Fixed work standing for a layer's backward: `rounds` passes of multiply-adds over a 64 KiB
// buffer (in cache: the work is arithmetic, not memory traffic that the all-reduce would share).
struct compute_load {
  std::vector<float> x = std::vector<float>(16384, 1.0f);
  void run(std::int64_t rounds) {
    for (std::int64_t k = 0; k < rounds; ++k)
      for (auto& v : x) v = v * 0.999999f + 1e-6f;
  }
  // Rounds that take about `ms` here, alone.
  std::int64_t calibrate(double ms) {
    std::int64_t n = 1;
    for (;;) {
      const auto t0 = std::chrono::steady_clock::now();
      run(n);
      const double took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (took > 20) return std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(n) * ms / took));
      n *= 2;
    }
  }
};

void overlap(int rank, int workers, const options& opts) {
  const auto tensors = opts.set == "cyclegan" ? cyclegan_tensors() : discriminator_tensors();
  std::size_t floats = 0;
  for (auto n : tensors) floats += n;
  compute_load load;
  std::int64_t total_rounds = rank == 0 ? load.calibrate(opts.compute_ms) : 0;
  MPI_Bcast(&total_rounds, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
  // Rounds per tensor, in proportion to its size (at least one).
  std::vector<std::int64_t> rounds_of;
  for (auto n : tensors)
    rounds_of.push_back(
        std::max<std::int64_t>(1, static_cast<std::int64_t>(static_cast<double>(total_rounds) * static_cast<double>(n) /
                                                            static_cast<double>(floats))));
  if (rank == 0) {
    print_header("--overlap", workers, opts);
    std::printf(
        "# set %s: %zu tensors, %zu floats (%.1f MiB); compute %.0f ms per backward (calibrated on rank 0);\n"
        "# our all-reduce between workers: %s\n",
        opts.set.c_str(), tensors.size(), floats, static_cast<double>(floats * sizeof(float)) / (1 << 20),
        opts.compute_ms,
        opts.mpi_window ? "the shared-memory window of workers on one machine" : "the ring of MPI messages");
    std::printf(
        "# ours = the library's bucketed all-reduce on its communication thread (25 MiB buckets); MPI = one\n"
        "# MPI_Iallreduce per tensor, progressed by MPI_Testall after each layer; ms per step, median round\n\n");
    std::printf("%5s  %10s  %12s  %11s  %14s  %9s  %7s\n", "way", "compute ms", "all-reduce ms", "blocking ms",
                "overlapped ms", "waited ms", "hidden");
    std::fflush(stdout);
  }
  dist::comm::mpi_options mpi_opts;
  mpi_opts.shared_memory = opts.mpi_window;
  dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi> s{{.local_replicas = 1, .mpi = mpi_opts}};
  auto models = s.values_from_function([&](int) {
    gradient_set m;
    for (auto n : tensors) m.grads.emplace_back(n, 0.0f);
    return m;
  });
  std::vector<std::vector<float>> raw;
  for (auto n : tensors) raw.emplace_back(n, 0.0f);
  auto backward = [&](auto&& after_layer) {  // layers in reverse order, as backward finishes them
    for (std::size_t i = tensors.size(); i-- > 0;) {
      load.run(rounds_of[i]);
      after_layer(i);
    }
  };
  // The four figures of one way: compute only, all-reduce only, blocking, overlapped; and the wait
  // at the end of the overlapped steps (summed over its calls, rank 0's).
  enum figure { compute, reduce, blocking, overlapped };
  double waited = 0;
  std::int64_t waits = 0;
  auto clock_wait = [&](auto&& wait) {
    const auto t0 = std::chrono::steady_clock::now();
    wait();
    waited += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ++waits;
  };
  auto time_ours = [&](figure f) {
    return time_strategy(s, opts, [&](auto& r) {
      auto& m = models[0];
      return [&r, &m, &backward, &clock_wait, f] {
        if (f == compute) backward([](std::size_t) {});
        if (f == reduce) r.all_reduce_gradients(m);
        if (f == blocking) {
          backward([](std::size_t) {});
          r.all_reduce_gradients(m);
        }
        if (f == overlapped) {
          auto sync = r.overlap_gradients();
          sync.add(m);
          backward([&](std::size_t i) {
            one_gradient layer{&m.grads[i]};
            r.gradients_ready(layer);
          });
          clock_wait([&] { sync.wait(); });
        }
      };
    });
  };
  std::vector<MPI_Request> requests(tensors.size(), MPI_REQUEST_NULL);
  auto start = [&](std::size_t i) {
    MPI_Iallreduce(MPI_IN_PLACE, raw[i].data(), static_cast<int>(raw[i].size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                   &requests[i]);
  };
  auto time_mpi = [&](figure f) {
    return time_in_group(
        rank == 0, opts,
        [&] {
          if (f == compute) backward([](std::size_t) {});
          if (f == reduce || f == blocking) {
            if (f == blocking) backward([](std::size_t) {});
            for (std::size_t i = tensors.size(); i-- > 0;) start(i);
            MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE);
          }
          if (f == overlapped) {
            backward([&](std::size_t i) {
              start(i);
              int done = 0;
              MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE);
            });
            clock_wait([&] { MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE); });
          }
        },
        [] { MPI_Barrier(MPI_COMM_WORLD); },
        [](std::int64_t v) {
          MPI_Bcast(&v, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
          return v;
        });
  };
  // Figures of one way: [0..3] the step times above, [4] the overlapped step's wait.
  std::vector<double> ours[5], mpi[5];
  auto with_wait = [&](auto&& timed, std::vector<double>* into, int f) {
    waited = 0;
    waits = 0;
    into[f].push_back(timed(static_cast<figure>(f)));
    if (f == overlapped) into[4].push_back(waits ? waited / static_cast<double>(waits) : 0.0);
  };
  for (int round = 0; round < rounds; ++round)
    for (int f = 0; f < 4; ++f) {
      with_wait(time_ours, ours, f);
      with_wait(time_mpi, mpi, f);
    }
  if (rank != 0) return;
  struct way {
    const char* name;
    std::vector<double>* t;
  };
  std::string json;
  for (const way w : {way{"ours", ours}, way{"MPI", mpi}}) {
    double m[5];
    for (int f = 0; f < 5; ++f) m[f] = bench::median(w.t[f]);
    const double hidden = 1 - m[4] / m[reduce];
    std::printf("%5s  %10.1f  %12.1f  %11.1f  %14.1f  %9.1f  %6.0f%%\n", w.name, m[compute] * 1e3, m[reduce] * 1e3,
                m[blocking] * 1e3, m[overlapped] * 1e3, m[4] * 1e3, hidden * 100);
    char line[512];
    std::snprintf(
        line, sizeof line,
        "{\"bench\":\"allreduce_overlap\",\"way\":\"%s\",\"set\":\"%s\",\"workers\":%d,\"compute_seconds\":%.6f,"
        "\"allreduce_seconds\":%.6f,\"blocking_seconds\":%.6f,\"overlapped_seconds\":%.6f,"
        "\"waited_seconds\":%.6f,\"hidden\":%.4f}\n",
        w.name, opts.set.c_str(), workers, m[compute], m[reduce], m[blocking], m[overlapped], m[4], hidden);
    json += line;
  }
  std::printf("\n%s", json.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  dist::comm::mpi_runtime::instance(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  options opts;
  try {
    opts = parse_options(argc, argv);
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "bench_allreduce_mpi: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }

  try {
    if (opts.what == mode::multi_worker) {
      multi_worker(rank, size, opts);
    } else if (opts.what == mode::gradients) {
      gradients(rank, size, opts);
    } else if (opts.what == mode::overlap) {
      overlap(rank, size, opts);
    } else {
      for (const std::size_t bytes : opts.sizes) {
        const double seconds = time_raw_mpi(bytes, rank, opts);
        if (rank == 0) {
          std::printf("{\"bytes\":%zu,\"seconds_per_iter\":%.9g}\n", bytes, seconds);
          std::fflush(stdout);
        }
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce_mpi: %s\n", e.what());
    return 1;
  }
  return 0;
}
