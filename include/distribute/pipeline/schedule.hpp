#pragma once
// The order in which a pipeline stage runs the forward and backward passes of a step's micro-batches.
//
// `gpipe` (Huang et al., 2019): every forward, then every backward. A stage keeps the input of every
// micro-batch until its backward: m of them.
// `one_f_one_b` (PipeDream-Flush, Narayanan et al., 2021): stage s of p runs min(p - 1 - s, m)
// forwards to fill the pipeline, then alternates one forward and one backward, then drains the
// backwards. It keeps at most p - s micro-batch inputs, and finishes in the same time.
//
// Both run the backwards in micro-batch order (0, 1, ..., m - 1), so gradients accumulate in the
// order the examples come in the batch: the order one device sums them in.
//
// With equal forward and backward times on every stage, both leave each stage idle for a fraction
// (p - 1) / (m + p - 1) of the step: the pipeline's bubble (`ideal_bubble`).

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute {

enum class pipeline_schedule : std::uint8_t { gpipe, one_f_one_b };

inline const char* to_string(pipeline_schedule s) noexcept { return s == pipeline_schedule::gpipe ? "gpipe" : "1f1b"; }

struct pipeline_op {
  enum class pass : std::uint8_t { forward, backward };
  pass kind;
  int micro_batch;
  friend bool operator==(const pipeline_op&, const pipeline_op&) = default;
};

// The passes stage `stage` of `stages` runs over `micro_batches`, in order.
inline std::vector<pipeline_op> schedule_of(pipeline_schedule schedule, int stage, int stages, int micro_batches) {
  if (stages < 1 || stage < 0 || stage >= stages || micro_batches < 0)
    throw std::invalid_argument("distribute: no pipeline schedule for stage " + std::to_string(stage) + " of " +
                                std::to_string(stages) + " over " + std::to_string(micro_batches) + " micro-batches");
  using pass = pipeline_op::pass;
  std::vector<pipeline_op> ops;
  ops.reserve(2 * static_cast<std::size_t>(micro_batches));
  const int m = micro_batches;
  if (schedule == pipeline_schedule::gpipe) {
    for (int j = 0; j < m; ++j) ops.push_back({pass::forward, j});
    for (int j = 0; j < m; ++j) ops.push_back({pass::backward, j});
    return ops;
  }
  const int warmup = std::min(stages - 1 - stage, m);
  for (int j = 0; j < warmup; ++j) ops.push_back({pass::forward, j});
  for (int j = 0; j + warmup < m; ++j) {
    ops.push_back({pass::forward, j + warmup});
    ops.push_back({pass::backward, j});
  }
  for (int j = m - warmup; j < m; ++j) ops.push_back({pass::backward, j});
  return ops;
}

// The idle fraction of each stage with equal pass times: (p - 1) / (m + p - 1).
inline double ideal_bubble(int stages, int micro_batches) {
  if (stages < 1 || micro_batches < 1) return 0.0;
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
}

}  // namespace distribute
