// The fixed cost of one step: `strategy.run` of an empty step, side by side in one run with
//   - the bound: a round trip between the calling thread and N-1 spinning threads through one atomic
//     counter each way, the least any hand-off of work to other threads can cost here;
//   - the peer: a thread per call (start N-1 std::threads, run, join), what a strategy without
//     persistent replica threads pays.
// A training step that is short (small models, small per-replica batches) feels this cost on every
// step, so it must stay near the bound. See docs/benchmarks.md.
//
//   bench_step [--replicas 1,2,4]

#include <distribute/distribute.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace dist = distribute;

namespace {

using clock_type = std::chrono::steady_clock;

// Microseconds per call of `f`, the median of 5 repetitions of at least 50 ms each.
template <class F>
double micros_per_call(F&& f) {
  for (int i = 0; i < 100; ++i) f();  // warm-up: threads started, caches and branch predictors warm
  long iters = 1;
  for (;;) {
    const auto t0 = clock_type::now();
    for (long i = 0; i < iters; ++i) f();
    if (clock_type::now() - t0 >= std::chrono::milliseconds(50)) break;
    iters *= 2;
  }
  std::vector<double> reps;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = clock_type::now();
    for (long i = 0; i < iters; ++i) f();
    reps.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - t0).count() /
                   static_cast<double>(iters));
  }
  return bench::median(reps);
}

// The bound: n-1 threads spin on a generation counter, do nothing, and count down.
double handoff_bound(int n) {
  std::atomic<long> generation{0};
  std::atomic<int> pending{0};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 1; t < n; ++t)
    threads.emplace_back([&] {
      long seen = 0;
      while (!stop.load(std::memory_order_acquire)) {
        const long g = generation.load(std::memory_order_acquire);
        if (g == seen) continue;
        seen = g;
        pending.fetch_sub(1, std::memory_order_acq_rel);
      }
    });
  const double us = micros_per_call([&] {
    pending.store(n - 1, std::memory_order_relaxed);
    generation.fetch_add(1, std::memory_order_release);
    while (pending.load(std::memory_order_acquire) != 0) {}
  });
  stop.store(true);
  for (auto& t : threads) t.join();
  return us;
}

double thread_per_call(int n) {
  return micros_per_call([&] {
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(n - 1));
    for (int t = 1; t < n; ++t) threads.emplace_back([] {});
    for (auto& t : threads) t.join();
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> replica_counts{1, 2, 4};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--replicas" && i + 1 < argc) {
      replica_counts = bench::parse_int_list(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: bench_step [--replicas 1,2,4]\n");
      return arg == "--help" ? 0 : 2;
    }
  }
  std::printf("# bench_step  %s\n# machine: %u usable hardware threads, %s; load average before the run: %s\n",
              bench::utc_now().c_str(), dist::detail::usable_hardware_threads(), bench::cpu_model().c_str(),
              bench::load_average().c_str());
  std::printf("# compiler: %s; microseconds per empty step, median of 5 repetitions of >= 50 ms\n", bench::compiler());
  {
    dist::one_device_strategy<> one;
    volatile int sink = 0;
    const double us = micros_per_call([&] { sink = sink + one.run([](auto& r) { return r.replica_id(); })[0]; });
    std::printf("one_device_strategy: %.4f us per step\n\n", us);
    std::printf("{\"bench\":\"step\",\"strategy\":\"one_device\",\"replicas\":1,\"ours_us\":%.4f}\n\n", us);
  }
  std::printf("replicas  mirrored us  bound us  thread-per-call us  ours/bound  peer/ours\n");
  std::vector<std::string> json;
  for (int n : replica_counts) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    const double ours = micros_per_call([&] { s.run([](auto&) {}); });
    const double bound =
        n > 1 && static_cast<unsigned>(n) <= dist::detail::usable_hardware_threads() ? handoff_bound(n) : 0.0;
    const double peer = thread_per_call(n);
    if (bound > 0)
      std::printf("%8d  %11.2f  %8.2f  %18.2f  %9.1fx  %8.1fx\n", n, ours, bound, peer, ours / bound, peer / ours);
    else std::printf("%8d  %11.2f  %8s  %18.2f  %10s  %8.1fx\n", n, ours, "n/a", peer, "n/a", peer / ours);
    char line[256];
    std::snprintf(line, sizeof line,
                  "{\"bench\":\"step\",\"strategy\":\"mirrored\",\"replicas\":%d,\"ours_us\":%.4f,\"bound_us\":%s,"
                  "\"thread_per_call_us\":%.4f}",
                  n, ours, bound > 0 ? std::to_string(bound).c_str() : "null", peer);
    json.emplace_back(line);
  }
  std::printf(
      "(bound: n/a for one replica, which hands nothing off, and where replicas outnumber hardware\n"
      " threads, since spinning threads would starve each other)\n\n");
  for (const auto& j : json) std::printf("%s\n", j.c_str());
  return EXIT_SUCCESS;
}
