// A convolution's weight gradient as the CPU engine computes it in pieces
// (engine/detail/dnnl_weight_pieces.hpp), side by side in one run with
//   - the cut of channels-last passes over their output channels (`cut_channels_last`, which the
//     engine leaves off), where oneDNN's kernel reads channels last;
//   - the peer: the same pass as one oneDNN primitive on the same threads (what the engine runs where
//     it does not cut, and what PyTorch's CPU backend runs for it);
//   - the bound: that primitive on one thread, divided by the count of threads (the kernel's own
//     speed, scaled perfectly; no cut of it can do better).
// Shapes: the CycleGAN's at paper size, batch 1 and 4, in bfloat16 where the CPU has bfloat16 units
// (on AMX oneDNN takes channels-last layouts there) and float32. The four run in interleaved rounds;
// each figure is the median over the rounds of a median of 3 repetitions of at least 50 ms. See
// docs/benchmarks.md.
//
//   bench_weight_pieces [--quick] [--rounds N]

#include <distribute/detail/hardware.hpp>
#include <distribute/engine/detail/arena.hpp>
#include <distribute/engine/detail/dnnl_conv.hpp>
#include <distribute/engine/detail/openmp.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace dist = distribute;
using dist::conv_geometry;
using conv = dist::detail::dnnl_conv;

namespace {

std::vector<float> values(std::int64_t n, std::uint32_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint32_t s = seed;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>(s >> 8) / 16777216.0f - 0.5f;
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  double min_seconds = 0.05;
  int rounds = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") {
      min_seconds = 0.01, rounds = 1;
    } else if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: bench_weight_pieces [--quick] [--rounds N]\n");
      return arg == "--help" ? 0 : 2;
    }
  }
  const int n = distribute::detail::openmp_threads();
  std::printf("# bench_weight_pieces %s, %s, %d threads, load average %s, oneDNN %s on %s\n", bench::utc_now().c_str(),
              bench::cpu_model().c_str(), n, bench::load_average().c_str(), conv::library().c_str(),
              conv::isa().c_str());
  if (n < 2) {
    std::printf("one thread: the engine computes every weight gradient as one primitive; nothing to compare\n");
    return 0;
  }
  std::vector<bool> precisions;
  if (dist::detail::cpu_has_bf16_units()) precisions.push_back(true);
  precisions.push_back(false);
  const std::vector<conv_geometry> shapes{
      conv_geometry::of(1, 256, 66, 66, 256, 3, 1, 0),  // a residual block's (reflection-padded)
      conv_geometry::of(1, 128, 130, 130, 256, 3, 2, 0), conv_geometry::of(1, 64, 262, 262, 64, 7, 1, 0),
      conv_geometry::of(1, 128, 128, 128, 256, 4, 2, 1),  // a PatchGAN's
      conv_geometry::of(4, 256, 66, 66, 256, 3, 1, 0)};
  std::printf("%-58s %5s %-28s %9s %9s %9s %9s %8s %8s\n", "weight gradient", "type", "kernel", "engine ms", "cut ms",
              "whole ms", "bound ms", "whole/e", "whole/c");
  // "runs x input blocks x output blocks" of a plan, or "one primitive".
  const auto describe = [](conv& d, const conv_geometry& g, bool half, bool wino) {
    if (!d.in_pieces(g, true, half, wino)) return std::string("one primitive");
    const auto s = d.weight_grid(g, true, half, wino);
    return std::to_string(s.runs) + "x" + std::to_string(s.in_blocks) + "x" + std::to_string(s.out_blocks) +
           (s.channels_last ? " nhwc" : "");
  };
  for (const bool half : precisions)
    for (const auto& g : shapes) {
      const bool wino = conv::winograd_pays(g) && conv::library_has_winograd() && !half;
      if (conv::swaps_sides(g)) continue;
      conv ours{n}, cut{n, true}, whole{1}, alone{1};  // alone: plans made for one thread (below)
      dist::detail::arena a_ours, a_cut, a_whole, a_alone;
      const auto x = values(g.input_size(), 1), dy = values(g.output_size(), 2);
      std::vector<float> dw(static_cast<std::size_t>(g.weight_size())), db(static_cast<std::size_t>(g.out_channels));
      const auto pass = [&](conv& d, dist::detail::arena& a) {
        return d.backward_weights(g, x.data(), dy.data(), dw.data(), db.data(), a, half);
      };
      if (!pass(ours, a_ours)) continue;
      // The cut where it applies: oneDNN's kernel reads channels last, and the grid has enough pieces.
      const bool cuts = pass(cut, a_cut) && cut.weight_grid(g, true, half, wino).channels_last;
      const std::string kernel = cut.implementation(conv::pass::backward_weights, g, true, half, wino);
      std::vector<double> ours_s, cut_s, whole_s, bound_s;
      for (int r = 0; r < rounds; ++r) {
        ours_s.push_back(bench::seconds_per_call([&] { pass(ours, a_ours); }, min_seconds, 3));
        if (cuts) cut_s.push_back(bench::seconds_per_call([&] { pass(cut, a_cut); }, min_seconds, 3));
        whole_s.push_back(bench::seconds_per_call([&] { pass(whole, a_whole); }, min_seconds, 3));
        const dist::detail::openmp_thread_count one{1};
        bound_s.push_back(bench::seconds_per_call([&] { pass(alone, a_alone); }, min_seconds, 3) / n);
      }
      const double e = bench::median(ours_s), c = cuts ? bench::median(cut_s) : 0.0, w = bench::median(whole_s),
                   b = bench::median(bound_s);
      char cut_ms[16] = "-", cut_ratio[16] = "-";
      if (cuts) {
        std::snprintf(cut_ms, sizeof cut_ms, "%.2f", c * 1e3);
        std::snprintf(cut_ratio, sizeof cut_ratio, "%.2f", w / c);
      }
      std::printf("%-58s %5s %-28s %9.2f %9s %9.2f %9.2f %8.2f %8s\n", g.to_string().c_str(), half ? "bf16" : "f32",
                  kernel.c_str(), e * 1e3, cut_ms, w * 1e3, b * 1e3, w / e, cut_ratio);
      std::printf("  engine: %s%s%s\n", describe(ours, g, half, wino).c_str(), cuts ? "; cut: " : "",
                  cuts ? describe(cut, g, half, wino).c_str() : "");
      std::printf(
          "{\"bench\":\"weight_pieces\",\"geometry\":\"%s\",\"precision\":\"%s\",\"kernel\":\"%s\",\"threads\":%d,"
          "\"engine_ms\":%.4f,\"cut_ms\":%.4f,\"whole_ms\":%.4f,\"bound_ms\":%.4f}\n",
          g.to_string().c_str(), half ? "bf16" : "f32", kernel.c_str(), n, e * 1e3, c * 1e3, w * 1e3, b * 1e3);
    }
  return 0;
}
