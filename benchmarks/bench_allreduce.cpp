// Float all-reduce (sum) between the CPU replicas of one process, side by side in one run with
//   - the bound: the same number of threads each copying a buffer of the same size at once. Our
//     all-reduce moves exactly that much memory (each replica reads its slice of every replica's
//     buffer and writes the sum back into each: one buffer read and one buffer written per
//     replica), so memory bandwidth, measured here and now, is what it can at best reach;
//   - the peer: MPI_Allreduce between as many processes, run by the bench_allreduce_mpi helper under
//     mpiexec.
// Every figure is algbw = bytes per replica / seconds per operation (GB = 1e9 bytes), the median of
// several repetitions, each long enough to read a steady clock reliably. See docs/benchmarks.md.
//
//   bench_allreduce [--replicas 2,4] [--max-bytes 256M] [--quick] [--no-mpi] [--workers 2]
//
// With --workers W it then runs bench_allreduce_mpi under mpiexec -np W twice: the multi-worker
// all-reduce (W processes x 1 and x 2 replicas) against MPI_Allreduce at the same sizes, and the
// fused gradient all-reduce of a CycleGAN-sized parameter set against one MPI_Allreduce per tensor;
// their tables and JSON lines (with "workers") follow this program's.

#include <distribute/distribute.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <barrier>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <sys/wait.h>  // WEXITSTATUS of pclose

#if defined(__x86_64__) || defined(_M_X64)
#  include <emmintrin.h>
#endif

namespace dist = distribute;

namespace {

// How the mpiexec command line is built; CMake passes these when it found MPI (empty: no MPI).
#if defined(DISTRIBUTE_MPIEXEC) && defined(DISTRIBUTE_BENCH_MPI_HELPER)
constexpr const char* mpiexec_path = DISTRIBUTE_MPIEXEC;
constexpr const char* mpi_helper_path = DISTRIBUTE_BENCH_MPI_HELPER;
#else
constexpr const char* mpiexec_path = "";
constexpr const char* mpi_helper_path = "";
#endif
#if defined(DISTRIBUTE_MPIEXEC_PREFLAGS)
constexpr const char* mpiexec_preflags = DISTRIBUTE_MPIEXEC_PREFLAGS;
#else
constexpr const char* mpiexec_preflags = "";
#endif

constexpr std::size_t kib = 1024;
constexpr std::size_t mib = 1024 * kib;
constexpr std::size_t gib = 1024 * mib;
constexpr std::size_t min_bytes = 4 * kib;

struct timing_policy {
  double min_seconds = 0.05;  // each timed repetition runs at least this long
  int repetitions = 5;        // timed repetitions; the median is reported
};

struct options {
  std::vector<int> replicas{2, 4};
  std::size_t max_bytes = 256 * mib;
  timing_policy timing;
  bool mpi = true;
  int workers = 0;  // 0: no multi-worker figures
};

void print_usage(std::FILE* to) {
  std::fprintf(
      to,
      "usage: bench_allreduce [--replicas 2,4] [--max-bytes 256M] [--quick] [--no-mpi]\n"
      "  --replicas LIST   replica counts to measure (default 2,4)\n"
      "  --max-bytes SIZE  largest buffer per replica, K/M/G suffixes are KiB/MiB/GiB (default 256M);\n"
      "                    sizes are the powers of 4 from 4 KiB up to it\n"
      "  --quick           shorter repetitions, fewer of them, and at most 64 MiB unless --max-bytes says\n"
      "  --no-mpi          skip the MPI_Allreduce peer\n"
      "  --workers W       also measure multi_worker_mirrored_strategy with W processes (bench_allreduce_mpi)\n");
}

// A whole decimal number at the start of `text`; `rest` is what follows it.
std::size_t parse_number(std::string_view text, std::string_view& rest) {
  std::size_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc{}) throw std::invalid_argument("'" + std::string(text) + "' is not a number");
  rest = text.substr(static_cast<std::size_t>(end - text.data()));
  return value;
}

std::size_t parse_bytes(std::string_view text) {
  std::string_view suffix;
  const std::size_t value = parse_number(text, suffix);
  if (suffix.empty()) return value;
  if (suffix == "K" || suffix == "k") return value * kib;
  if (suffix == "M" || suffix == "m") return value * mib;
  if (suffix == "G" || suffix == "g") return value * gib;
  throw std::invalid_argument("bad size '" + std::string(text) + "' (a number of bytes, or with K, M or G)");
}

std::vector<int> parse_replicas(std::string_view list) {
  std::vector<int> out;
  for (;;) {
    std::string_view rest;
    const std::size_t n = parse_number(list, rest);
    if (n < 1 || n > 1024 || !(rest.empty() || rest.front() == ','))
      throw std::invalid_argument("bad replica list '" + std::string(list) + "' (counts from 1, separated by commas)");
    out.push_back(static_cast<int>(n));
    if (rest.empty()) return out;
    list = rest.substr(1);
  }
}

options parse_options(int argc, char** argv) {
  options opts;
  std::optional<std::size_t> max_bytes;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&]() -> std::string_view {
      if (i + 1 >= argc) throw std::invalid_argument("missing value after " + std::string(arg));
      return argv[++i];
    };
    if (arg == "--replicas") opts.replicas = parse_replicas(value());
    else if (arg == "--max-bytes") max_bytes = parse_bytes(value());
    else if (arg == "--quick") quick = true;
    else if (arg == "--no-mpi") opts.mpi = false;
    else if (arg == "--workers") {
      std::string_view rest;
      opts.workers = static_cast<int>(parse_number(value(), rest));
      if (opts.workers < 1 || !rest.empty()) throw std::invalid_argument("--workers needs a count of at least 1");
    } else if (arg == "--help" || arg == "-h") {
      print_usage(stdout);
      std::exit(0);
    } else {
      throw std::invalid_argument("unknown argument " + std::string(arg));
    }
  }
  if (quick) {
    opts.timing = {.min_seconds = 0.02, .repetitions = 3};
    opts.max_bytes = 64 * mib;
  }
  if (max_bytes) opts.max_bytes = *max_bytes;
  if (opts.max_bytes < min_bytes) throw std::invalid_argument("--max-bytes must be at least 4K");
  return opts;
}

std::vector<std::size_t> sizes_up_to(std::size_t max_bytes) {
  std::vector<std::size_t> sizes;
  for (std::size_t b = min_bytes; b <= max_bytes; b *= 4) sizes.push_back(b);
  return sizes;
}

std::string human_bytes(std::size_t b) {
  if (b >= gib && b % gib == 0) return std::to_string(b / gib) + " GiB";
  if (b >= mib && b % mib == 0) return std::to_string(b / mib) + " MiB";
  if (b >= kib && b % kib == 0) return std::to_string(b / kib) + " KiB";
  return std::to_string(b) + " B";
}

// Tells the optimiser that memory may be read here, so that a loop of identical memcpy calls is kept.
inline void clobber_memory() {
#if defined(__GNUC__)
  asm volatile("" ::: "memory");
#endif
}

// --- timing --------------------------------------------------------------------------------------

// Times `step` on one member (`rank`) of a group of threads that all call this together. `sync` is a
// barrier of the group and `share(v)` returns rank 0's `v` on every rank, so that the group agrees on
// the iteration count and the clock on rank 0, read between barriers, covers the slowest member.
// Returns the median seconds per step on rank 0 (meaningless elsewhere).
template <class Step, class Sync, class Share>
double time_in_group(int rank, const timing_policy& policy, Step step, Sync sync, Share share) {
  auto timed = [&](std::int64_t iters) {
    sync();
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) step();
    sync();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  step();  // warm-up
  // The calibration runs double as further warm-up.
  std::int64_t iters = 1;
  for (;;) {
    const double seconds = timed(iters);
    const std::int64_t next = share(rank == 0 ? bench::next_iterations(iters, seconds, policy.min_seconds) : 0);
    if (next == iters) break;
    iters = next;
  }
  std::vector<double> per_iter;
  for (int k = 0; k < policy.repetitions; ++k) per_iter.push_back(timed(iters) / static_cast<double>(iters));
  return bench::median(per_iter);
}

// --- the three figures ---------------------------------------------------------------------------

// Ours: every replica all-reduces its own buffer in place, inside one step.
double time_ours(dist::mirrored_strategy<dist::cpu>& strategy, std::size_t bytes, const timing_policy& policy) {
  const auto seconds = strategy.run([&](auto& r) {
    const int n = r.num_replicas();
    // Allocated and filled by the replica's own thread: pages are faulted in (first touch) before
    // any timing, where this replica would own them.
    std::vector<float> buf(bytes / sizeof(float), static_cast<float>(r.replica_id() + 1));
    // The first all-reduce doubles as a check of the result.
    r.all_reduce(dist::reduce_op::sum, buf);
    const float expected = static_cast<float>(n * (n + 1) / 2);
    if (!std::ranges::all_of(buf, [&](float x) { return x == expected; }))
      throw std::runtime_error("all_reduce gave a wrong sum on replica " + std::to_string(r.replica_id()));
    std::ranges::fill(buf, 0.0f);  // zeros keep the repeated in-place sums finite
    return time_in_group(
        r.replica_id(), policy, [&] { r.all_reduce(dist::reduce_op::sum, buf); }, [&] { r.barrier(); },
        [&](std::int64_t v) { return r.broadcast(v, 0); });
  });
  return seconds[0];
}

// A page-aligned, pre-faulted buffer. Page alignment keeps the source and destination of a copy at
// the same page offset: heap blocks allocated one after the other sit 16 bytes apart modulo 4 KiB,
// where `rep movsb` (glibc's memcpy from about 2 KiB up) runs over 10x slower on AMD Zen 3.
struct page_buffer {
  explicit page_buffer(std::size_t bytes, std::byte fill) : data{new(std::align_val_t{4096}) std::byte[bytes]} {
    std::memset(data.get(), static_cast<int>(fill), bytes);
  }
  struct deleter {
    void operator()(std::byte* p) const { ::operator delete[](p, std::align_val_t{4096}); }
  };
  std::unique_ptr<std::byte[], deleter> data;
};

#if defined(__x86_64__) || defined(_M_X64)
// Copies with non-temporal stores (SSE2, so no -march is needed): one read and one write of memory
// per byte. Below its non-temporal threshold glibc's memcpy writes through the cache, and a store
// that misses the cache first reads the line (read-for-ownership): 1.5x the traffic. The threshold
// follows the L3 size the machine reports (192 MiB under a hypervisor that reports 256 MiB), so on
// some machines memcpy alone undershoots memory bandwidth at every size measured here.
void streaming_copy(std::byte* dst, const std::byte* src, std::size_t bytes) {
  std::size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    const auto* s = reinterpret_cast<const __m128i*>(src + i);
    auto* d = reinterpret_cast<__m128i*>(dst + i);
    const __m128i a = _mm_load_si128(s), b = _mm_load_si128(s + 1), c = _mm_load_si128(s + 2),
                  e = _mm_load_si128(s + 3);
    _mm_stream_si128(d, a);
    _mm_stream_si128(d + 1, b);
    _mm_stream_si128(d + 2, c);
    _mm_stream_si128(d + 3, e);
  }
  _mm_sfence();
  std::memcpy(dst + i, src + i, bytes - i);
}
#endif

// The bound: `n` threads, started together, each copying its own buffer; the faster of memcpy and a
// streaming copy, so that the bound is what memory can do rather than what one copy routine does.
double time_bound(int n, std::size_t bytes, const timing_policy& policy) {
  std::barrier sync(n);
  std::int64_t shared = 0;
  double seconds = 0;
  std::vector<std::jthread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      const page_buffer src(bytes, std::byte{1}), dst(bytes, std::byte{0});
      auto time_copy = [&](auto copy) {
        return time_in_group(
            rank, policy,
            [&] {
              copy(dst.data.get(), src.data.get(), bytes);
              clobber_memory();
            },
            [&] { sync.arrive_and_wait(); },
            [&](std::int64_t v) {
              if (rank == 0) shared = v;
              sync.arrive_and_wait();
              const std::int64_t out = shared;
              sync.arrive_and_wait();  // nobody reads while rank 0 may write the next value
              return out;
            });
      };
      double best = time_copy([](std::byte* to, const std::byte* from, std::size_t b) { std::memcpy(to, from, b); });
#if defined(__x86_64__) || defined(_M_X64)
      best = std::min(best, time_copy(streaming_copy));
#endif
      if (rank == 0) seconds = best;
    });
  }
  threads.clear();  // joins
  return seconds;
}

std::string shell_quote(std::string_view s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Why the MPI peer cannot run here, or nothing if it can.
std::optional<std::string> mpi_unavailable() {
  if (*mpiexec_path == '\0') return "built without MPI (no mpiexec found at configure time)";
  for (const char* path : {mpiexec_path, mpi_helper_path})
    if (!std::filesystem::exists(path)) return std::string(path) + " does not exist";
  return std::nullopt;
}

// The peer: seconds per MPI_Allreduce by size, from one mpiexec launch of the helper; the sizes it
// did not report (after a note on stderr) are missing.
std::map<std::size_t, double> time_mpi(int n, const std::vector<std::size_t>& sizes, const timing_policy& policy) {
  std::string size_list;
  for (const std::size_t b : sizes) size_list += (size_list.empty() ? "" : ",") + std::to_string(b);
  std::string command = shell_quote(mpiexec_path);
  if (*mpiexec_preflags != '\0') command += std::string(" ") + mpiexec_preflags;
  command += " -np " + std::to_string(n) + " " + shell_quote(mpi_helper_path) + " --sizes " + size_list +
             " --min-seconds " + std::to_string(policy.min_seconds) + " --repetitions " +
             std::to_string(policy.repetitions);
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) {
    std::fprintf(stderr, "note: could not start %s; MPI figures are null\n", command.c_str());
    return {};
  }
  std::map<std::size_t, double> seconds;
  char line[256];
  while (std::fgets(line, sizeof line, pipe)) {
    unsigned long long bytes = 0;
    double s = 0;
    if (std::sscanf(line, "{\"bytes\":%llu,\"seconds_per_iter\":%lf}", &bytes, &s) == 2 && s > 0)
      seconds[static_cast<std::size_t>(bytes)] = s;
  }
  const int status = pclose(pipe);
  const int exit_code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (exit_code != 0 || seconds.size() != sizes.size())
    std::fprintf(stderr,
                 "note: the MPI peer failed (exit code %d, %zu of %zu sizes): %s; missing MPI figures are null\n",
                 exit_code, seconds.size(), sizes.size(), command.c_str());
  return seconds;
}

// The multi-worker figures: bench_allreduce_mpi in `mode` under mpiexec -np `workers`, its output
// relayed. Returns false if it could not run or failed.
bool run_multi_worker(int workers, const std::string& mode_args, const timing_policy& policy) {
  std::string command = shell_quote(mpiexec_path);
  if (*mpiexec_preflags != '\0') command += std::string(" ") + mpiexec_preflags;
  command += " -np " + std::to_string(workers) + " " + shell_quote(mpi_helper_path) + " " + mode_args +
             " --min-seconds " + std::to_string(policy.min_seconds) + " --repetitions " +
             std::to_string(policy.repetitions);
  std::printf("\n$ %s\n", command.c_str());
  std::fflush(stdout);
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return false;
  char line[1024];
  while (std::fgets(line, sizeof line, pipe)) {
    std::fputs(line, stdout);
    std::fflush(stdout);
  }
  const int status = pclose(pipe);
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

// --- output --------------------------------------------------------------------------------------

struct result {
  int replicas;
  std::size_t bytes;
  double algbw_gbs;
  double bound_algbw_gbs;
  std::optional<double> mpi_algbw_gbs;
};

double gbs(std::size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

void print_row(const result& r) {
  char mpi[16] = "n/a", vs_mpi[16] = "n/a";
  if (r.mpi_algbw_gbs) {
    std::snprintf(mpi, sizeof mpi, "%.2f", *r.mpi_algbw_gbs);
    std::snprintf(vs_mpi, sizeof vs_mpi, "%.2fx", r.algbw_gbs / *r.mpi_algbw_gbs);
  }
  std::printf("%8d  %8s  %9.2f  %10.2f  %10.1f%%  %8s  %8s\n", r.replicas, human_bytes(r.bytes).c_str(), r.algbw_gbs,
              r.bound_algbw_gbs, 100 * r.algbw_gbs / r.bound_algbw_gbs, mpi, vs_mpi);
  std::fflush(stdout);
}

void print_json(const result& r) {
  char mpi[32] = "null";
  if (r.mpi_algbw_gbs) std::snprintf(mpi, sizeof mpi, "%.4f", *r.mpi_algbw_gbs);
  std::printf(
      "{\"bench\":\"allreduce\",\"replicas\":%d,\"bytes\":%zu,\"algbw_gbs\":%.4f,\"bound_algbw_gbs\":%.4f,"
      "\"mpi_algbw_gbs\":%s}\n",
      r.replicas, r.bytes, r.algbw_gbs, r.bound_algbw_gbs, mpi);
}

}  // namespace

int main(int argc, char** argv) {
  options opts;
  try {
    opts = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
    print_usage(stderr);
    return 2;
  }
  const auto sizes = sizes_up_to(opts.max_bytes);
  if (opts.mpi) {
    if (const auto reason = mpi_unavailable()) {
      std::fprintf(stderr, "note: %s; MPI figures are null\n", reason->c_str());
      opts.mpi = false;
    }
  }

  std::printf("# bench_allreduce  %s\n", bench::utc_now().c_str());
  std::printf("# machine: %u hardware threads, %s; load average before the run: %s\n",
              std::thread::hardware_concurrency(), bench::cpu_model().c_str(), bench::load_average().c_str());
  std::printf("# compiler: %s; timing: median of %d repetitions of >= %.0f ms each\n", bench::compiler(),
              opts.timing.repetitions, opts.timing.min_seconds * 1e3);
  if (opts.mpi)
    std::printf("# peer: MPI_Allreduce under %s %s -np N %s\n", mpiexec_path, mpiexec_preflags, mpi_helper_path);
  std::printf(
      "# algbw = bytes per replica / time, GB = 1e9 bytes; bound = one copy per replica, all at once,\n"
      "# the faster of memcpy and a streaming copy\n\n");
  std::printf("%8s  %8s  %9s  %10s  %11s  %8s  %8s\n", "replicas", "size", "ours GB/s", "bound GB/s", "ours/bound",
              "MPI GB/s", "ours/MPI");
  std::fflush(stdout);

  std::vector<result> results;
  try {
    for (const int n : opts.replicas) {
      const auto mpi_seconds = opts.mpi ? time_mpi(n, sizes, opts.timing) : std::map<std::size_t, double>{};
      dist::mirrored_strategy<dist::cpu> strategy{dist::cpu_replicas(n)};
      for (const std::size_t bytes : sizes) {
        const double bound = time_bound(n, bytes, opts.timing);
        const double ours = time_ours(strategy, bytes, opts.timing);
        result r{n, bytes, gbs(bytes, ours), gbs(bytes, bound), std::nullopt};
        if (const auto it = mpi_seconds.find(bytes); it != mpi_seconds.end()) r.mpi_algbw_gbs = gbs(bytes, it->second);
        print_row(r);
        results.push_back(r);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce: %s\n", e.what());
    return 1;
  }

  std::printf("\n");
  for (const auto& r : results) print_json(r);

  if (opts.workers > 0) {
    if (const auto reason = mpi_unavailable()) {
      std::fprintf(stderr, "note: %s; no multi-worker figures\n", reason->c_str());
      return 0;
    }
    std::string size_list;
    for (const std::size_t b : sizes)
      if (b <= 64 * mib) size_list += (size_list.empty() ? "" : ",") + std::to_string(b);
    bool ok = run_multi_worker(opts.workers, "--multi-worker --replicas 1,2 --sizes " + size_list, opts.timing);
    ok = run_multi_worker(opts.workers, "--gradients --replicas 1,2", opts.timing) && ok;
    if (!ok) {
      std::fprintf(stderr, "bench_allreduce: the multi-worker benchmark failed\n");
      return 1;
    }
  }
  return 0;
}
