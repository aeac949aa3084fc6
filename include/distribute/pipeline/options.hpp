#pragma once
// What a pipeline (pipeline.hpp) is made with: its micro-batches per step, schedule and data-parallel
// copies; and what one replica reports of one step.

#include <distribute/comm/gradient_buckets.hpp>
#include <distribute/pipeline/schedule.hpp>

#include <cstddef>

namespace distribute {

struct pipeline_options {
  // Micro-batches per step; a batch of fewer examples has one per example.
  int micro_batches = 4;
  pipeline_schedule schedule = pipeline_schedule::one_f_one_b;
  // Data-parallel copies of the pipeline: the strategy's replicas are stages x copies.
  int copies = 1;
  // How each stage's gradients are combined over its copies.
  gradient_reduction reduction{};
};

// What one replica did in one step.
struct pipeline_step_result {
  // This replica's share of the mean loss over the global batch: the last stage's; 0 on the others.
  // The sum over every replica (strategy.reduce(sum, ...)) is the mean over the global batch.
  double loss = 0;
  int micro_batches = 0;
  double step_seconds = 0;     // the whole step on this replica
  double compute_seconds = 0;  // forward, backward and loss passes
  // Waiting for activations and gradients from the neighbouring stages. A stage's idle time after
  // its last pass (while the others drain) is not in it: the bubble is larger than wait / step.
  double wait_seconds = 0;
  // The most bytes kept at once for the backward passes of micro-batches in flight: their inputs
  // (for the forward's re-run), or a stashable stage's stashes (when a stash is a tensor or says its
  // `bytes()`), and on the last stage the loss gradients. What the schedule decides; the layers' own
  // state of one forward comes on top.
  std::size_t peak_kept_bytes = 0;
  int recomputed = 0;  // forwards run again before their backward (pipeline.hpp: Activations)
};

}  // namespace distribute
