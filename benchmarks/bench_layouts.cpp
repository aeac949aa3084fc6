// The CPU engine's layout conversions around oneDNN's convolutions (engine/detail/dnnl_memory.hpp),
// side by side in one run with
//   - oneDNN's reorder between the same two layouts (what the engine would run otherwise);
//   - the bound: a copy of the same bytes on the same threads (memcpy split between them).
// The case: a convolution's float32 output that oneDNN writes channels last (nhwc; its bfloat16 and
// AMX kernels do) and the caller reads as planes (nchw), at the CycleGAN's sizes, among them planes
// whose size is not a multiple of 16 (a residual block's padded 66x66, the first layer's 262x262).
// Each figure is the median of 5 repetitions of at least 50 ms. See docs/benchmarks.md.
//
//   bench_layouts [--quick]

#include <distribute/engine/detail/dnnl_memory.hpp>

#include "bench_common.hpp"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#if defined(_OPENMP)
#  include <omp.h>
#endif

namespace {

struct exposed : distribute::detail::dnnl_memory {
  using dnnl_memory::check;
  using dnnl_memory::make_reorder;
  using dnnl_memory::md;
  using dnnl_memory::planes_from_channels_last;
};

// to = from, `bytes` of them, split evenly between the OpenMP threads.
void parallel_copy(const float* from, float* to, std::int64_t count) {
#if defined(_OPENMP)
#  pragma omp parallel
  {
    const std::int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    const std::int64_t begin = count * t / n, end = count * (t + 1) / n;
    std::memcpy(to + begin, from + begin, static_cast<std::size_t>(end - begin) * sizeof(float));
  }
#else
  std::memcpy(to, from, static_cast<std::size_t>(count) * sizeof(float));
#endif
}

}  // namespace

int main(int argc, char** argv) {
  double min_seconds = 0.05;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      min_seconds = 0.01;
    } else {
      std::fprintf(stderr, "usage: bench_layouts [--quick]\n");
      return arg == "--help" ? 0 : 2;
    }
  }
  dnnl_engine_t engine = nullptr;
  dnnl_stream_t stream = nullptr;
  exposed::check(dnnl_engine_create(&engine, dnnl_cpu, 0), "dnnl_engine_create");
  exposed::check(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags), "dnnl_stream_create");
  std::printf("# bench_layouts %s, %s, %d threads, load average %s, oneDNN %d.%d\n", bench::utc_now().c_str(),
              bench::cpu_model().c_str(), distribute::detail::openmp_threads(), bench::load_average().c_str(),
              DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR);
  std::printf("%-16s %14s %14s %14s %10s %10s\n", "nhwc -> nchw", "copy GB/s", "oneDNN GB/s", "ours GB/s", "ours/copy",
              "ours/oneDNN");
  const std::vector<std::vector<dnnl_dim_t>> cases{{1, 256, 66, 66},  {1, 64, 262, 262},  {1, 256, 64, 64},
                                                   {1, 64, 256, 256}, {1, 128, 128, 128}, {1, 512, 31, 31},
                                                   {4, 256, 66, 66},  {1, 3, 262, 262}};
  for (const auto& dims : cases) {
    const std::int64_t count = dims[0] * dims[1] * dims[2] * dims[3];
    std::vector<float> from(static_cast<std::size_t>(count)), to(from.size()), expected(from.size());
    for (std::int64_t i = 0; i < count; ++i) from[static_cast<std::size_t>(i)] = static_cast<float>(i % 65521);
    const auto nchw = exposed::md(dims, dnnl_nchw), nhwc = exposed::md(dims, dnnl_nhwc);
    const auto reorder = exposed::make_reorder(engine, nhwc.get(), nchw.get(), false);
    dnnl_memory_t src = nullptr, dst = nullptr;
    exposed::check(dnnl_memory_create(&src, nhwc.get(), engine, from.data()), "dnnl_memory_create");
    exposed::check(dnnl_memory_create(&dst, nchw.get(), engine, expected.data()), "dnnl_memory_create");
    const dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}};
    const double bytes = 2.0 * static_cast<double>(count) * sizeof(float);
    const double copy = bench::seconds_per_call([&] { parallel_copy(from.data(), to.data(), count); }, min_seconds, 5);
    const double theirs = bench::seconds_per_call(
        [&] {
          exposed::check(dnnl_primitive_execute(reorder.get(), stream, 2, args), "reorder");
          exposed::check(dnnl_stream_wait(stream), "dnnl_stream_wait");
        },
        min_seconds, 5);
    const double ours = bench::seconds_per_call(
        [&] { exposed::planes_from_channels_last(from.data(), to.data(), dims[0], dims[1], dims[2] * dims[3]); },
        min_seconds, 5);
    const bool same = to == expected;
    dnnl_memory_destroy(src);
    dnnl_memory_destroy(dst);
    const std::string name = std::to_string(dims[0]) + "x" + std::to_string(dims[1]) + "x" + std::to_string(dims[2]) +
                             "x" + std::to_string(dims[3]);
    std::printf("%-16s %14.1f %14.1f %14.1f %10.2f %10.2f%s\n", name.c_str(), bytes / copy / 1e9, bytes / theirs / 1e9,
                bytes / ours / 1e9, copy / ours, theirs / ours, same ? "" : "  DIFFERENT VALUES");
    std::printf(
        "{\"bench\":\"layouts\",\"case\":\"nhwc_to_nchw\",\"dims\":\"%s\",\"threads\":%d,\"copy_ms\":%.4f,"
        "\"onednn_ms\":%.4f,\"ours_ms\":%.4f,\"same\":%s}\n",
        name.c_str(), distribute::detail::openmp_threads(), copy * 1e3, theirs * 1e3, ours * 1e3,
        same ? "true" : "false");
    if (!same) return 1;
  }
  dnnl_stream_destroy(stream);
  dnnl_engine_destroy(engine);
  return 0;
}
