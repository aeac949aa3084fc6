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

#include <distribute/engine/engine.hpp>

#include <cstddef>
#include <cstdint>

namespace distribute::detail {

struct conv_engine_filter {
  bool exclude_tf32 = true;
  bool exclude_nondeterministic = true;
  std::int64_t workspace_limit = 0;  // bytes; 0: none
  bool build_all = false;            // every engine left (autotune), or the heuristics' first that builds

  // The same filter with no workspace limit: the retry where the limit left no engine.
  constexpr conv_engine_filter without_workspace_limit() const noexcept {
    conv_engine_filter f = *this;
    f.workspace_limit = 0;
    return f;
  }
  friend constexpr bool operator==(const conv_engine_filter&, const conv_engine_filter&) = default;
};

// The filter for a convolution computed in `precision` (the call's: a 16-bit precision keeps
// TF32 and tensor cores allowed, as its engines are tensor-core ones) by an engine with `o`.
constexpr conv_engine_filter conv_engine_filter_for(compute_precision precision, const compute_options& o) noexcept {
  conv_engine_filter f;
  f.exclude_tf32 = precision == compute_precision::float32;
  f.exclude_nondeterministic = o.deterministic;
  constexpr std::size_t most = static_cast<std::size_t>(INT64_MAX);
  f.workspace_limit = static_cast<std::int64_t>(o.conv_workspace_limit < most ? o.conv_workspace_limit : most);
  f.build_all = o.conv_autotune;
  return f;
}

}  // namespace distribute::detail
