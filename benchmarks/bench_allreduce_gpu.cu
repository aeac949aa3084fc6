// Float all-reduce (sum) on the GPUs of one machine, side by side in one run. What each section
// measures, and what it cannot:
//   - NCCL with ONE rank: for one rank and an in-place buffer NCCL moves no data (it returns at
//     once), so no bandwidth can be measured. What is measured is the time per call of our NCCL path
//     (a replica of mirrored_strategy<cuda> calling r.all_reduce on a device tensor, through the
//     host-side meeting, the communicator and the deadline polling) against raw ncclAllReduce +
//     cudaStreamSynchronize: our layer's per-call overhead, in microseconds.
//   - NCCL across every GPU, when there are two or more: ours (mirrored_strategy<cuda>, one replica
//     per GPU) against raw ncclAllReduce on communicators from ncclCommInitAll, issued in one group
//     call from one thread; algbw, and busbw = algbw * 2(n-1)/n as nccl-tests defines it.
//   - cuda_peer with 2 and 4 logical replicas sharing one GPU, against the device-to-device copy
//     bound: an all-reduce of n in-place buffers of S bytes reads n*S and writes n*S bytes, which is
//     n copies of S bytes, so the bound is the device copy's algbw divided by n, measured here and now
//     with cudaMemcpyAsync.
// Figures are medians of several repetitions, each long enough to read a steady clock reliably; a
// repetition is one strategy.run whose replicas loop over the all-reduce, so the step's own cost is
// spread over the iterations. algbw = bytes per replica / seconds per operation (GB = 1e9 bytes).
// The first all-reduce of each size is checked. Every JSON line says what it measured ("measures":
// "per_call_overhead" or "bandwidth"). Without a GPU the program says so and exits 77.
//
//   bench_allreduce_gpu [--replicas 2,4] [--max-bytes 256M] [--quick] [--device 0]

#include <distribute/cuda/comm/nccl.cuh>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/strategy/mirrored_strategy.cuh>
#include <distribute/cuda/tensor/tensor.cuh>

#include "bench_common.hpp"

#include <nccl.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace dist = distribute;

namespace {

constexpr std::size_t kib = 1024, mib = 1024 * kib;

struct options {
  std::vector<int> replicas{2, 4};
  std::size_t max_bytes = 256 * mib;
  double min_seconds = 0.05;
  int repetitions = 5;
  int device = 0;
};

std::size_t parse_bytes(const std::string& text) {
  std::size_t end = 0;
  const std::size_t value = std::stoull(text, &end);
  const std::string suffix = text.substr(end);
  if (suffix.empty()) return value;
  if (suffix == "K" || suffix == "k") return value * kib;
  if (suffix == "M" || suffix == "m") return value * mib;
  if (suffix == "G" || suffix == "g") return value * 1024 * mib;
  throw std::invalid_argument("bad size '" + text + "' (a number of bytes, or with K, M or G)");
}

options parse_options(int argc, char** argv) {
  options o;
  bool max_given = false, quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(std::string(a) + " needs a value");
      return argv[++i];
    };
    if (a == "--replicas") o.replicas = bench::parse_int_list(value());
    else if (a == "--max-bytes") o.max_bytes = parse_bytes(value()), max_given = true;
    else if (a == "--device") o.device = std::stoi(value());
    else if (a == "--quick") quick = true;
    else throw std::invalid_argument("unknown option " + std::string(a));
  }
  if (quick) {
    o.min_seconds = 0.01;
    o.repetitions = 3;
    if (!max_given) o.max_bytes = 64 * mib;
  }
  for (int n : o.replicas)
    if (n < 1 || n > dist::comm::detail::max_peer_replicas) throw std::invalid_argument("replica counts are 1..32");
  return o;
}

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(rc));
}

// Seconds per operation of `run(iters)` (which runs `iters` operations and returns when they are
// complete): iterations grown until a repetition is long enough, then the median of the repetitions.
double seconds_per_op(const options& o, const std::function<void(long)>& run) {
  run(2);  // warm-up: first-touch, NCCL's lazy connection set-up, kernel loading
  long iters = 1;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    run(iters);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const long next = static_cast<long>(bench::next_iterations(iters, s, o.min_seconds));
    if (next == iters) break;
    iters = next;
  }
  std::vector<double> reps;
  for (int r = 0; r < o.repetitions; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    run(iters);
    reps.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                   static_cast<double>(iters));
  }
  return bench::median(reps);
}

// The first all-reduce of each size is checked: replica r contributes r + 1 everywhere, so every
// element of every replica must hold n(n+1)/2. The buffers are zeroed again for the timed runs.
template <class S>
void check_sum(S& s, dist::mirrored<dist::tensor<float, dist::cuda>>& bufs, const char* what) {
  const int n = s.num_replicas_in_sync();
  auto ok = s.run(
      [](auto& r, dist::tensor<float, dist::cuda>& t) {
        t.copy_from_host(std::vector<float>(t.size(), static_cast<float>(r.replica_id() + 1)));
        r.all_reduce(dist::reduce_op::sum, t.values());
        const auto v = t.to_vector();
        const float want = static_cast<float>(r.num_replicas() * (r.num_replicas() + 1) / 2);
        int good = 1;  // not bool: per_replica<bool> would be a std::vector<bool>
        for (float x : v) good = good && x == want;
        t.fill_zero();
        return good;
      },
      bufs);
  for (int r = 0; r < n; ++r)
    if (!ok[static_cast<std::size_t>(r)])
      throw std::runtime_error(std::string(what) + ": wrong all-reduce result on replica " + std::to_string(r));
}

double gbs(std::size_t bytes, double seconds) { return static_cast<double>(bytes) / seconds / 1e9; }

std::string human(std::size_t b) {
  char buf[32];
  if (b >= mib) std::snprintf(buf, sizeof buf, "%zuM", b / mib);
  else std::snprintf(buf, sizeof buf, "%zuK", b / kib);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  try {
    o = parse_options(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr,
                 "bench_allreduce_gpu: %s\nusage: bench_allreduce_gpu [--replicas 2,4] [--max-bytes 256M] [--quick] "
                 "[--device 0]\n",
                 e.what());
    return 2;
  }
  int visible = 0;
  try {
    visible = dist::cuda_device_count();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce_gpu: %s\n", e.what());
    return 1;
  }
  if (visible <= o.device) {
    std::fprintf(stderr, "bench_allreduce_gpu: no CUDA device %d is visible; nothing to measure\n", o.device);
    return 77;
  }
  try {
    cudaDeviceProp prop{};
    dist::detail::cuda_check(cudaGetDeviceProperties(&prop, o.device), "cudaGetDeviceProperties", o.device);
    const std::string gpu = prop.name;
    int nccl_version = 0;
    check_nccl(ncclGetVersion(&nccl_version), "ncclGetVersion");
    std::printf("# bench_allreduce_gpu  %s\n", bench::utc_now().c_str());
    std::printf("# device: cuda:%d %s (%d SMs); NCCL %d; host: %s; load average before the run: %s\n", o.device,
                gpu.c_str(), prop.multiProcessorCount, nccl_version, bench::cpu_model().c_str(),
                bench::load_average().c_str());
    std::printf("# timing: median of %d repetitions of >= %.0f ms each; algbw in GB/s (1e9 bytes)\n", o.repetitions,
                o.min_seconds * 1e3);

    std::vector<std::size_t> sizes;
    for (std::size_t b = 4 * kib; b <= o.max_bytes; b *= 4) sizes.push_back(b);

    const dist::detail::device_guard current(o.device);
    dist::detail::owned_stream raw_stream(o.device);
    ncclComm_t raw = nullptr;
    {
      ncclUniqueId id;
      check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
      check_nccl(ncclCommInitRank(&raw, 1, id, 0), "ncclCommInitRank");
    }
    dist::mirrored_strategy<dist::cuda> ours{{dist::cuda{o.device}}, {}, dist::cuda_collective_engine::nccl};

    std::printf(
        "\n# NCCL, one rank: time per call (one rank in place moves no data: this is per-call overhead, not "
        "bandwidth)\n");
    std::printf("%8s  %10s  %10s  %12s\n", "bytes", "ours us", "raw us", "overhead us");
    for (const std::size_t bytes : sizes) {
      const std::size_t n = bytes / sizeof(float);
      dist::tensor<float, dist::cuda> raw_buf(dist::shape{static_cast<std::int64_t>(n)},
                                              dist::cuda{o.device}.on(raw_stream.get()));
      const double raw_s = seconds_per_op(o, [&](long iters) {
        for (long i = 0; i < iters; ++i) {
          check_nccl(ncclAllReduce(raw_buf.data(), raw_buf.data(), n, ncclFloat32, ncclSum, raw, raw_stream.get()),
                     "ncclAllReduce");
          dist::detail::cuda_check(cudaStreamSynchronize(raw_stream.get()), "cudaStreamSynchronize");
        }
      });
      auto bufs = ours.mirror(
          [&](auto& d) { return dist::tensor<float, dist::cuda>(dist::shape{static_cast<std::int64_t>(n)}, d); });
      check_sum(ours, bufs, "nccl");
      const double ours_s = seconds_per_op(o, [&](long iters) {
        ours.run(
            [&](auto& r, dist::tensor<float, dist::cuda>& t) {
              for (long i = 0; i < iters; ++i) r.all_reduce(dist::reduce_op::sum, t.values());
            },
            bufs);
      });
      const double a = ours_s * 1e6, b = raw_s * 1e6;
      std::printf("%8s  %10.2f  %10.2f  %12.2f\n", human(bytes).c_str(), a, b, a - b);
      std::printf(
          "{\"bench\":\"allreduce\",\"device\":\"cuda\",\"gpu\":\"%s\",\"engine\":\"nccl\",\"replicas\":1,"
          "\"measures\":\"per_call_overhead\",\"bytes\":%zu,\"ours_us\":%.3f,\"raw_nccl_us\":%.3f,\"overhead_us\":%.3f}"
          "\n",
          gpu.c_str(), bytes, a, b, a - b);
      std::fflush(stdout);
    }
    check_nccl(ncclCommDestroy(raw), "ncclCommDestroy");

    const int gpus = dist::cuda_device_count();
    if (gpus < 2) {
      std::printf("\n# NCCL bandwidth needs two or more GPUs; %d visible: not measured\n", gpus);
    } else {
      std::printf("\n# NCCL across %d GPUs: ours vs raw ncclAllReduce (busbw = algbw * 2(n-1)/n, as nccl-tests)\n",
                  gpus);
      std::printf("%8s  %10s  %10s  %10s  %10s  %8s\n", "bytes", "ours alg", "ours bus", "raw alg", "raw bus",
                  "ours/raw");
      std::vector<int> ordinals(static_cast<std::size_t>(gpus));
      for (int g = 0; g < gpus; ++g) ordinals[static_cast<std::size_t>(g)] = g;
      std::vector<ncclComm_t> comms(static_cast<std::size_t>(gpus));
      check_nccl(ncclCommInitAll(comms.data(), gpus, ordinals.data()), "ncclCommInitAll");
      std::vector<dist::detail::owned_stream> streams;
      for (int g = 0; g < gpus; ++g) streams.emplace_back(g);
      dist::mirrored_strategy<dist::cuda> all{dist::all_cuda_devices(), {}, dist::cuda_collective_engine::nccl};
      const double bus = 2.0 * (gpus - 1) / gpus;
      for (const std::size_t bytes : sizes) {
        const std::size_t n = bytes / sizeof(float);
        std::vector<dist::tensor<float, dist::cuda>> raw_bufs;
        for (int g = 0; g < gpus; ++g)
          raw_bufs.emplace_back(dist::shape{static_cast<std::int64_t>(n)},
                                dist::cuda{g}.on(streams[static_cast<std::size_t>(g)].get()));
        const double raw_s = seconds_per_op(o, [&](long iters) {
          for (long i = 0; i < iters; ++i) {
            check_nccl(ncclGroupStart(), "ncclGroupStart");
            for (int g = 0; g < gpus; ++g) {
              const auto k = static_cast<std::size_t>(g);
              check_nccl(ncclAllReduce(raw_bufs[k].data(), raw_bufs[k].data(), n, ncclFloat32, ncclSum, comms[k],
                                       streams[k].get()),
                         "ncclAllReduce");
            }
            check_nccl(ncclGroupEnd(), "ncclGroupEnd");
            for (int g = 0; g < gpus; ++g) {
              const dist::detail::device_guard on(g);
              dist::detail::cuda_check(cudaStreamSynchronize(streams[static_cast<std::size_t>(g)].get()),
                                       "cudaStreamSynchronize", g);
            }
          }
        });
        raw_bufs.clear();
        auto bufs = all.mirror(
            [&](auto& d) { return dist::tensor<float, dist::cuda>(dist::shape{static_cast<std::int64_t>(n)}, d); });
        check_sum(all, bufs, "nccl across GPUs");
        const double ours_s = seconds_per_op(o, [&](long iters) {
          all.run(
              [&](auto& r, dist::tensor<float, dist::cuda>& t) {
                for (long i = 0; i < iters; ++i) r.all_reduce(dist::reduce_op::sum, t.values());
              },
              bufs);
        });
        const double a = gbs(bytes, ours_s), b = gbs(bytes, raw_s);
        std::printf("%8s  %10.2f  %10.2f  %10.2f  %10.2f  %7.3fx\n", human(bytes).c_str(), a, a * bus, b, b * bus,
                    a / b);
        std::printf(
            "{\"bench\":\"allreduce\",\"device\":\"cuda\",\"gpu\":\"%s\",\"engine\":\"nccl\",\"replicas\":%d,"
            "\"measures\":\"bandwidth\",\"bytes\":%zu,\"algbw_gbs\":%.4f,\"busbw_gbs\":%.4f,\"raw_nccl_algbw_gbs\":%."
            "4f,"
            "\"raw_nccl_busbw_gbs\":%.4f,\"ratio\":%.4f}\n",
            gpu.c_str(), gpus, bytes, a, a * bus, b, b * bus, a / b);
        std::fflush(stdout);
      }
      for (auto c : comms) check_nccl(ncclCommDestroy(c), "ncclCommDestroy");
    }

    std::printf("\n# cuda_peer, logical replicas on one GPU: ours vs the device-copy bound (copy algbw / replicas)\n");
    std::printf("%8s  %8s  %10s  %10s  %9s\n", "replicas", "bytes", "ours", "bound", "of bound");
    for (const int replicas : o.replicas) {
      dist::mirrored_strategy<dist::cuda> peer{dist::cuda_replicas(replicas, o.device)};
      for (const std::size_t bytes : sizes) {
        const std::size_t n = bytes / sizeof(float);
        dist::tensor<float, dist::cuda> src(dist::shape{static_cast<std::int64_t>(n)},
                                            dist::cuda{o.device}.on(raw_stream.get()));
        dist::tensor<float, dist::cuda> dst(dist::shape{static_cast<std::int64_t>(n)},
                                            dist::cuda{o.device}.on(raw_stream.get()));
        const double copy_s = seconds_per_op(o, [&](long iters) {
          for (long i = 0; i < iters; ++i)
            dist::detail::cuda_check(
                cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, raw_stream.get()),
                "cudaMemcpyAsync");
          dist::detail::cuda_check(cudaStreamSynchronize(raw_stream.get()), "cudaStreamSynchronize");
        });
        auto bufs = peer.mirror(
            [&](auto& d) { return dist::tensor<float, dist::cuda>(dist::shape{static_cast<std::int64_t>(n)}, d); });
        check_sum(peer, bufs, "cuda_peer");
        const double ours_s = seconds_per_op(o, [&](long iters) {
          peer.run(
              [&](auto& r, dist::tensor<float, dist::cuda>& t) {
                for (long i = 0; i < iters; ++i) r.all_reduce(dist::reduce_op::sum, t.values());
              },
              bufs);
        });
        const double a = gbs(bytes, ours_s), bound = gbs(bytes, copy_s) / replicas;
        std::printf("%8d  %8s  %10.2f  %10.2f  %8.1f%%\n", replicas, human(bytes).c_str(), a, bound, 100 * a / bound);
        std::printf(
            "{\"bench\":\"allreduce\",\"device\":\"cuda\",\"gpu\":\"%s\",\"engine\":\"cuda_peer\",\"replicas\":%d,"
            "\"measures\":\"bandwidth\",\"bytes\":%zu,\"algbw_gbs\":%.4f,\"bound_algbw_gbs\":%.4f}\n",
            gpu.c_str(), replicas, bytes, a, bound);
        std::fflush(stdout);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_allreduce_gpu: %s\n", e.what());
    return 1;
  }
  return 0;
}
