#pragma once
// Which of cuDNN's convolution engines the GPU engine may use, from its options and the call's
// precision (cuda/engine/detail/cudnn_conv.cuh applies it to each graph it builds). A plain header, so
// the choice is tested without cuDNN or a GPU.
//
// cuDNN ranks the engines for a graph by its heuristics (mode A, then its fallback list); from that
// ranking the GPU engine removes:
//   - under float32, engines that compute in TF32 (the TENSOR_CORE and DOWN_CONVERT_INPUTS numerical
//     notes): float32 asked for is float32 computed, matching the CPU to float rounding;
//   - under `deterministic`, engines with the NONDETERMINISTIC note (sums finished with atomics);
//   - engines whose workspace exceeds `conv_workspace_limit`.
// Then it keeps the first engine that builds, or, with conv_autotune, builds every one left and
// times them. Where the workspace limit leaves no engine, the graph is built again without it (a
// convolution that runs beats one that fails), and the plan says so.
//
// Under `deterministic` with deterministic_conv_slowdown above 0, every deterministic engine left
// is built and timed (the fastest kept), and, where the slowdown is finite, a rival graph is built
// with the same filter but any engine allowed (cuDNN's first choice); the two are timed against
// each other and keeps_deterministic() decides.

#include <distribute/engine/engine.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>

namespace distribute::detail {

struct conv_engine_filter {
  bool exclude_tf32 = true;
  bool exclude_nondeterministic = true;
  std::int64_t workspace_limit = 0;  // bytes; 0: none
  bool build_all = false;            // every engine left (timed), or the heuristics' first that builds
  // The deterministic engine is timed against cuDNN's first choice among all engines (rival()) and
  // kept unless it takes more than `slowdown` times as long. 0: no rival.
  double slowdown = 0;

  // The same filter with no workspace limit: the retry where the limit left no engine.
  constexpr conv_engine_filter without_workspace_limit() const noexcept {
    conv_engine_filter f = *this;
    f.workspace_limit = 0;
    return f;
  }
  // The rival's filter: the same precision and workspace limit, any engine, cuDNN's first choice.
  constexpr conv_engine_filter rival() const noexcept {
    conv_engine_filter f = *this;
    f.exclude_nondeterministic = false;
    f.build_all = false;
    f.slowdown = 0;
    return f;
  }
  friend constexpr bool operator==(const conv_engine_filter&, const conv_engine_filter&) = default;
};

// Whether a convolution keeps its fastest deterministic engine, timed at `deterministic_ms`, against
// the rival's `rival_ms`: unless it takes more than `slowdown` times as long. A time that could
// not be taken (NaN, or not above 0) keeps the deterministic engine.
constexpr bool keeps_deterministic(double deterministic_ms, double rival_ms, double slowdown) noexcept {
  if (!(deterministic_ms > 0) || !(rival_ms > 0)) return true;
  return !(deterministic_ms > slowdown * rival_ms);
}

// The filter for a convolution computed in `precision` (the call's: a 16-bit precision keeps
// TF32 and tensor cores allowed, as its engines are tensor-core ones) by an engine with `o`.
constexpr conv_engine_filter conv_engine_filter_for(compute_precision precision, const compute_options& o) noexcept {
  conv_engine_filter f;
  f.exclude_tf32 = precision == compute_precision::float32;
  f.exclude_nondeterministic = o.deterministic;
  constexpr std::size_t most = static_cast<std::size_t>(INT64_MAX);
  f.workspace_limit = static_cast<std::int64_t>(o.conv_workspace_limit < most ? o.conv_workspace_limit : most);
  const bool timed = o.deterministic && o.deterministic_conv_slowdown > 0;
  f.build_all = o.conv_autotune || timed;
  // Infinity: always deterministic, so no rival to time.
  f.slowdown =
      timed && o.deterministic_conv_slowdown <= std::numeric_limits<double>::max() ? o.deterministic_conv_slowdown : 0;
  return f;
}

}  // namespace distribute::detail
