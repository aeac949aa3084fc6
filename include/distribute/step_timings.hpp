#pragma once
// Where a training loop's time goes, measured by the strategy and the library (no timers in user
// code): `strategy.timings()` returns the totals since the strategy was made; the difference of two
// of them is the breakdown of the steps between.
//
//   auto before = strategy.timings();
//   ... one or more steps ...
//   const distribute::step_timings t = strategy.timings() - before;
//   t.compute / t.wall, t.collective / t.wall, t.input_wait / t.wall, ...
//
// - compute: time inside `run` and `run_on_primary` less the collective time, on average over this
//   process's replicas: the layers, the losses, the optimiser.
// - collective: time inside the replicas' collectives and point-to-point calls (waiting for the other
//   replicas and moving the data), on average over this process's replicas. Zero under one device.
// - input_wait: time this process waited for the next element of a dataset pass (`for (auto& b :
//   ds.epoch(e))`, range-for over a dataset or over `strategy.distribute(...)`); with prefetching it
//   is only the part the pipeline did not hide.
// - checkpoint: time this process spent saving and loading checkpoints (checkpoint::save/load and
//   checkpoint::directory).
// - other(): the rest of the wall time: the loop's own work between steps (logging, pictures).
//
// Input wait and checkpoint time are the process's, seen by every strategy of the process. Read
// `timings()` between steps, from the thread that runs them.

#include <algorithm>
#include <cstdint>

namespace distribute {

struct step_timings {
  double wall = 0;        // seconds
  double compute = 0;     // seconds
  double collective = 0;  // seconds
  double input_wait = 0;  // seconds
  double checkpoint = 0;  // seconds
  std::int64_t runs = 0;  // `run` and `run_on_primary` calls

  // The wall time not accounted for by the others (never negative).
  double other() const noexcept { return std::max(0.0, wall - compute - collective - input_wait - checkpoint); }
  // `part` as a share of the wall time (0 when no time passed).
  double share(double part) const noexcept { return wall > 0 ? part / wall : 0.0; }

  friend step_timings operator-(const step_timings& a, const step_timings& b) noexcept {
    return {a.wall - b.wall,
            a.compute - b.compute,
            a.collective - b.collective,
            a.input_wait - b.input_wait,
            a.checkpoint - b.checkpoint,
            a.runs - b.runs};
  }
  friend step_timings operator+(const step_timings& a, const step_timings& b) noexcept {
    return {a.wall + b.wall,
            a.compute + b.compute,
            a.collective + b.collective,
            a.input_wait + b.input_wait,
            a.checkpoint + b.checkpoint,
            a.runs + b.runs};
  }
};

}  // namespace distribute
