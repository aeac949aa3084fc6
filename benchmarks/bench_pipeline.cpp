// Pipeline parallelism (`distribute::pipeline`), side by side in one run:
//   1. the bubble: the idle share of each stage's step, measured on a mirrored_strategy of p replicas
//      (p = 2 and 4 stages, m = 1..16 micro-batches, GPipe and 1F1B), against the formula
//      `ideal_bubble(p, m)` = (p - 1) / (m + p - 1) and against the library's own schedule
//      (`schedule_of`) simulated with the same pass times and free messages. The stages are
//      synthetic: forward and backward SLEEP a fixed time per micro-batch (2 ms and 4 ms by default)
//      and pass a small tensor on ([mb, 1, 8, 8]), so that real messages move. Sleeping, not
//      spinning: 4 stage threads on a 2-core machine would otherwise share the cores and the figure
//      would be the CPU's, not the schedule's. The stage stashes its forward state
//      (`stashable_stage`), so nothing is run twice;
//   2. the inputs kept for the backward passes (`peak_kept_bytes`) under GPipe against 1F1B, p = 4,
//      m = 8 and 16: the synthetic stage, and a real stage (conv2d 3x3 + instance norm + leaky relu,
//      which the pipeline runs forward again before a backward: `recomputed`);
//   3. a real model's training step on this machine: 2 stages of 3 conv2d + instance norm + leaky relu
//      blocks at 32x32, batch 8, on one device (all cores), as a pipeline of 2 stages over 2 replicas
//      (GPipe and 1F1B, m = 2, 4, 8), and as data parallelism (2 replicas, each holding both stages);
//      the cases take turns, round after round, so that the machine's slow moments fall on all of them.
// See docs/benchmarks.md.
//
//   bench_pipeline [--forward-ms 2] [--backward-ms 4] [--steps 7] [--warmup 2] [--channels 16]
//                  [--parts 1,2,3] [--quick]

#include <distribute/distribute.hpp>
#include <distribute/nn.hpp>
#include <distribute/optim/adam.hpp>
#include <distribute/pipeline.hpp>
#include <distribute/tensor/micro_batches.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;

namespace {

using clock_type = std::chrono::steady_clock;
using tensor = dist::tensor<float>;

double seconds_since(clock_type::time_point t) { return std::chrono::duration<double>(clock_type::now() - t).count(); }

struct flags {
  double forward_ms = 2;
  double backward_ms = 4;
  int steps = 7;
  int warmup = 2;
  std::int64_t channels = 16;
  bool quick = false;
  std::vector<int> parts{1, 2, 3};
  bool part(int k) const { return std::find(parts.begin(), parts.end(), k) != parts.end(); }
};

struct mse_loss {
  template <class R>
  nn::loss_result<float> operator()(R& r, const tensor& y, const tensor& t, std::int64_t global) const {
    return nn::mse(r, y, t, global);
  }
};

tensor wave(dist::shape s, double phase) {
  tensor t{s};
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + phase));
  return t;
}

// ---- 1. the synthetic stage --------------------------------------------------------------------

// The time one stage spent in its passes; written by that stage's replica thread only, read between
// steps.
struct pass_clock {
  double busy = 0;
  int passes = 0;
};

// y = w x, with a forward and a backward that sleep a fixed time first. Its forward state (the input)
// can be stashed, so the pipeline never runs a forward twice.
class sleep_stage {
 public:
  using scalar_type = float;
  using device_type = dist::cpu;
  using tensor_type = tensor;

  sleep_stage(std::chrono::microseconds forward, std::chrono::microseconds backward, pass_clock* clock)
      : forward_{forward},
        backward_{backward},
        clock_{clock},
        w_{dist::shape{1}, std::vector<float>{0.5f}},
        g_{dist::shape{1}} {}

  template <class R>
  tensor_type forward(R&, const tensor_type& x) {
    const auto started = clock_type::now();
    std::this_thread::sleep_for(forward_);
    x_ = x;
    tensor_type y = x;
    for (auto& v : y) v *= w_[0];
    clock_->busy += seconds_since(started);
    ++clock_->passes;
    return y;
  }
  template <class R>
  tensor_type backward(R&, const tensor_type& dy) {
    const auto started = clock_type::now();
    std::this_thread::sleep_for(backward_);
    if (dy.shape() != x_.shape())
      throw std::logic_error("bench_pipeline: a backward met another micro-batch's forward state");
    tensor_type dx = dy;
    for (std::size_t i = 0; i < dy.size(); ++i) {
      g_[0] += dy[i] * x_[i];
      dx[i] *= w_[0];
    }
    clock_->busy += seconds_since(started);
    ++clock_->passes;
    return dx;
  }
  tensor_type stash() { return std::move(x_); }
  void restore(tensor_type x) { x_ = std::move(x); }
  template <class F>
  void for_each_parameter(F&& f) {
    f(w_.values(), g_.values());
  }
  void zero_grad() { g_.fill(0); }
  void set_training(bool) {}

 private:
  std::chrono::microseconds forward_, backward_;
  pass_clock* clock_;
  tensor_type w_, g_, x_;
};
static_assert(dist::stashable_stage<sleep_stage>);

// The library's schedule with forward `f` and backward `b` on every stage and messages that cost
// nothing: each pass starts once its stage is free and its input has arrived. Returns the step time.
double simulated_step(dist::pipeline_schedule schedule, int p, int m, double f, double b) {
  using pass = dist::pipeline_op::pass;
  std::vector<std::vector<dist::pipeline_op>> ops;
  for (int s = 0; s < p; ++s) ops.push_back(dist::schedule_of(schedule, s, p, m));
  // done[s][j]: when stage s finished micro-batch j's forward (fwd) or backward (bwd); < 0: not yet.
  std::vector<std::vector<double>> fwd(static_cast<std::size_t>(p),
                                       std::vector<double>(static_cast<std::size_t>(m), -1)),
      bwd = fwd;
  std::vector<std::size_t> next(static_cast<std::size_t>(p), 0);
  std::vector<double> free_at(static_cast<std::size_t>(p), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      const auto us = static_cast<std::size_t>(s);
      while (next[us] < ops[us].size()) {
        const auto op = ops[us][next[us]];
        const auto j = static_cast<std::size_t>(op.micro_batch);
        double ready = 0;
        if (op.kind == pass::forward) {
          if (s > 0 && fwd[us - 1][j] < 0) break;
          ready = s > 0 ? fwd[us - 1][j] : 0;
        } else {
          if (s + 1 < p && bwd[us + 1][j] < 0) break;
          ready = s + 1 < p ? bwd[us + 1][j] : fwd[us][j];
        }
        const double end = std::max(free_at[us], ready) + (op.kind == pass::forward ? f : b);
        (op.kind == pass::forward ? fwd : bwd)[us][j] = end;
        free_at[us] = end;
        ++next[us];
        progress = true;
      }
    }
  }
  return *std::max_element(free_at.begin(), free_at.end());
}

struct bubble_row {
  int p = 0, m = 0;
  dist::pipeline_schedule schedule{};
  double step_s = 0;          // median wall time of a step (strategy.run around train_step)
  double bubble = 0;          // 1 - sum of the stages' pass times / (p x step), median over the steps
  double bubble_compute = 0;  // the same from pipeline_step_result::compute_seconds
  double bubble_nominal = 0;  // the same with the configured sleep times as the pass times
  double simulated = 0;       // the library's schedule with the configured times, free messages
  double ideal = 0;           // ideal_bubble(p, m)
  double wait_share = 0;      // sum of wait_seconds / sum of step_seconds over the stages, median
  double overshoot_us = 0;    // a pass's time beyond its configured sleep, mean over the passes, median
  std::size_t peak_max = 0, peak_stage0 = 0;
  int recomputed = 0;  // summed over the stages, in one step
  std::int64_t batch = 0;
};

template <int P>
bubble_row measure_bubble(const flags& f, dist::pipeline_schedule schedule, int m) {
  const auto fwd = std::chrono::microseconds(static_cast<long>(f.forward_ms * 1000));
  const auto bwd = std::chrono::microseconds(static_cast<long>(f.backward_ms * 1000));
  dist::mirrored_strategy<> s(dist::cpu_replicas(P));
  std::vector<pass_clock> clocks(P);
  auto model = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return dist::pipeline(s, {.micro_batches = m, .schedule = schedule},
                          [&, k = I](const dist::cpu&) { return sleep_stage(fwd, bwd, &clocks[k]); }...);
  }(std::make_index_sequence<P>{});
  constexpr std::int64_t batch = 16;
  const tensor x = wave(dist::shape::nchw(batch, 1, 8, 8), 0), y = wave(dist::shape::nchw(batch, 1, 8, 8), 1);
  std::vector<double> steps, bubbles, compute_bubbles, waits, overshoots;
  bubble_row row{.p = P, .m = m, .schedule = schedule, .batch = batch};
  for (int t = 0; t < f.warmup + f.steps; ++t) {
    for (auto& c : clocks) c = {};
    const auto started = clock_type::now();
    auto results = s.run([&](auto& r) { return model.train_step(r, x, y, mse_loss{}, batch); });
    const double wall = seconds_since(started);
    if (t < f.warmup) continue;
    double busy = 0, compute = 0, waited = 0, stepped = 0;
    row.recomputed = 0;
    for (int k = 0; k < P; ++k) {
      const auto& res = results[static_cast<std::size_t>(k)];
      if (res.micro_batches != m || clocks[static_cast<std::size_t>(k)].passes != 2 * m)
        throw std::logic_error("bench_pipeline: stage " + std::to_string(k) + " ran " +
                               std::to_string(res.micro_batches) + " micro-batches, " +
                               std::to_string(clocks[static_cast<std::size_t>(k)].passes) + " passes");
      busy += clocks[static_cast<std::size_t>(k)].busy;
      compute += res.compute_seconds;
      waited += res.wait_seconds;
      stepped += res.step_seconds;
      row.peak_max = std::max(row.peak_max, res.peak_kept_bytes);
      row.recomputed += res.recomputed;
    }
    row.peak_stage0 = results[0].peak_kept_bytes;
    steps.push_back(wall);
    bubbles.push_back(1 - busy / (P * wall));
    compute_bubbles.push_back(1 - compute / (P * wall));
    waits.push_back(waited / stepped);
    overshoots.push_back(1e6 * (busy / (2 * m * P) - (f.forward_ms + f.backward_ms) / 2000));
  }
  row.step_s = bench::median(steps);
  row.bubble = bench::median(bubbles);
  row.bubble_compute = bench::median(compute_bubbles);
  row.bubble_nominal = 1 - m * (f.forward_ms + f.backward_ms) / 1000 / row.step_s;
  row.wait_share = bench::median(waits);
  row.overshoot_us = bench::median(overshoots);
  const double sim = simulated_step(schedule, P, m, f.forward_ms, f.backward_ms);
  row.simulated = 1 - m * (f.forward_ms + f.backward_ms) / sim;
  row.ideal = dist::ideal_bubble(P, m);
  return row;
}

// ---- 2 and 3. real stages ----------------------------------------------------------------------

// A 3x3 convolution (reflection padding, no bias: the norm removes it), instance norm with affine
// parameters, leaky relu.
using block = nn::sequential<nn::conv2d<float>, nn::instance_norm<float>, nn::leaky_relu<float>>;
block make_block(std::int64_t in, std::int64_t out, std::uint64_t seed) {
  return block{nn::conv2d<float>({.in_channels = in,
                                  .out_channels = out,
                                  .kernel = 3,
                                  .stride = 1,
                                  .padding = 1,
                                  .pad_mode = nn::padding_mode::reflect,
                                  .bias = false},
                                 seed),
               nn::instance_norm<float>({.channels = out, .affine = true}, seed + 1), nn::leaky_relu<float>()};
}
using three_blocks = nn::sequential<block, block, block>;

struct memory_row {
  int p = 0, m = 0;
  dist::pipeline_schedule schedule{};
  std::size_t peak_max = 0, peak_stage0 = 0;
  std::vector<int> recomputed;  // per stage
};

// p = 4 stages of one block each (channels -> channels) on 4 replicas, batch 16 at 32x32; the second
// step's figures (they are the same in every step).
memory_row measure_real_memory(const flags& f, dist::pipeline_schedule schedule, int m) {
  constexpr int P = 4;
  const std::int64_t c = f.channels;
  dist::mirrored_strategy<> s(dist::cpu_replicas(P));
  auto model = [&]<std::size_t... I>(std::index_sequence<I...>) {
    return dist::pipeline(s, {.micro_batches = m, .schedule = schedule},
                          [&, k = I](const dist::cpu&) { return make_block(c, c, 100 + 10 * k); }...);
  }(std::make_index_sequence<P>{});
  constexpr std::int64_t batch = 16;
  const tensor x = wave(dist::shape::nchw(batch, c, 32, 32), 0), y = wave(dist::shape::nchw(batch, c, 32, 32), 1);
  memory_row row;
  row.p = P, row.m = m, row.schedule = schedule;
  for (int t = 0; t < 2; ++t) {
    auto results = s.run([&](auto& r) { return model.train_step(r, x, y, mse_loss{}, batch); });
    row.peak_max = 0;
    row.recomputed.clear();
    for (int k = 0; k < P; ++k) {
      row.peak_max = std::max(row.peak_max, results[static_cast<std::size_t>(k)].peak_kept_bytes);
      row.recomputed.push_back(results[static_cast<std::size_t>(k)].recomputed);
    }
    row.peak_stage0 = results[0].peak_kept_bytes;
  }
  return row;
}

// The model: stage 0 takes 3 channels to `channels`, stage 1 brings them back to 3.
three_blocks make_stage0(std::int64_t c) {
  return three_blocks{make_block(3, c, 10), make_block(c, c, 20), make_block(c, c, 30)};
}
three_blocks make_stage1(std::int64_t c) {
  return three_blocks{make_block(c, c, 40), make_block(c, c, 50), make_block(c, 3, 60)};
}
constexpr std::int64_t model_batch = 8;

struct model_step {
  double wait_share = 0;  // wait_seconds / step_seconds summed over the replicas
  int recomputed = 0;     // summed over the replicas
  double loss = 0;        // summed over the replicas: the mean over the global batch
};

// One way of running the model (a strategy, its replicas' pipeline and optimisers), one step at a time.
struct model_case {
  std::string mode;      // one_device, pipeline, data_parallel
  std::string schedule;  // pipeline only
  int replicas = 0, m = 0;
  std::function<model_step(const tensor& x, const tensor& y)> step;
  // Filled by the measurement:
  std::vector<double> per_step;  // seconds per step, one figure per round
  std::vector<double> waits;
  model_step first;  // the first step after the warm-up: the same step in every case
};

template <class S>
struct model_state {
  S s;
  dist::pipeline<three_blocks, three_blocks> model;
  typename S::template per_replica_type<dist::optim::adam<>> opts;
  template <class... A>
  model_state(std::int64_t c, dist::pipeline_options o, A&&... strategy_args)
      : s(std::forward<A>(strategy_args)...),
        model(
            s, o, [c](const dist::cpu&) { return make_stage0(c); }, [c](const dist::cpu&) { return make_stage1(c); }),
        opts(s.values_from_function([](int) { return dist::optim::adam<>({.lr = 1e-3}); })) {}
};

template <class S, class... A>
model_case make_case(const flags& f, std::string mode, dist::pipeline_options o, A&&... strategy_args) {
  auto st = std::make_shared<model_state<S>>(f.channels, o, std::forward<A>(strategy_args)...);
  model_case c;
  c.mode = std::move(mode), c.replicas = st->s.num_replicas_in_sync(), c.m = o.micro_batches;
  if (st->model.positions() > 1) c.schedule = dist::to_string(o.schedule);
  c.step = [st, copies = o.copies](const tensor& x, const tensor& y) {
    auto results = st->s.run(
        [&](auto& r, dist::optim::adam<>& opt) {
          const int copy = st->model.copy_of(r.replica_id());
          const std::int64_t lo = model_batch * copy / copies, hi = model_batch * (copy + 1) / copies;
          auto result = st->model.train_step(r, dist::batch_slice(x, lo, hi - lo), dist::batch_slice(y, lo, hi - lo),
                                             mse_loss{}, model_batch);
          opt.step(r, st->model.local(r));
          return result;
        },
        st->opts);
    model_step out;
    double waited = 0, stepped = 0;
    for (const auto& res : st->s.local_results(results)) {
      waited += res.wait_seconds;
      stepped += res.step_seconds;
      out.loss += res.loss;
      out.recomputed += res.recomputed;
    }
    out.wait_share = stepped > 0 ? waited / stepped : 0;
    return out;
  };
  return c;
}

// Every case runs the same warm-up steps and one more (whose loss must agree between the cases), then
// the cases take turns, round after round, each round running one case for at least `round_seconds`;
// a case's figure is the median over the rounds of its seconds per step. Taking turns spreads the
// machine's slow moments over every case instead of one.
void time_models(std::vector<model_case>& cases, const flags& f) {
  constexpr double round_seconds = 0.2;
  std::vector<std::pair<tensor, tensor>> batches;
  const auto image = dist::shape::nchw(model_batch, 3, 32, 32);
  for (int b = 0; b < 4; ++b) batches.emplace_back(wave(image, 0.1 * b), wave(image, 1 + 0.1 * b));
  auto batch = [&](int t) -> const std::pair<tensor, tensor>& {
    return batches[static_cast<std::size_t>(t) % batches.size()];
  };
  std::vector<int> steps_per_round;
  for (auto& c : cases) {
    for (int t = 0; t < f.warmup; ++t) c.step(batch(t).first, batch(t).second);
    const auto& [x, y] = batch(f.warmup);
    const auto started = clock_type::now();
    c.first = c.step(x, y);
    steps_per_round.push_back(static_cast<int>(std::ceil(round_seconds / std::max(seconds_since(started), 1e-4))));
  }
  for (int round = 0; round < f.steps; ++round)
    for (std::size_t i = 0; i < cases.size(); ++i) {
      auto& c = cases[i];
      const int k = steps_per_round[i];
      const auto started = clock_type::now();
      for (int t = 0; t < k; ++t) {
        const auto& [x, y] = batch(t);
        c.waits.push_back(c.step(x, y).wait_share);
      }
      c.per_step.push_back(seconds_since(started) / k);
    }
}

std::string json_double(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

[[noreturn]] void usage(const std::string& why, int code = 2) {
  if (!why.empty()) std::fprintf(stderr, "bench_pipeline: %s\n", why.c_str());
  std::fprintf(code ? stderr : stdout,
               "usage: bench_pipeline [--forward-ms 2] [--backward-ms 4] [--steps 7] [--warmup 2] [--channels 16] "
               "[--parts 1,2,3] [--quick]\n");
  std::exit(code);
}

}  // namespace

int main(int argc, char** argv) try {
  flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--forward-ms") f.forward_ms = std::stod(value());
    else if (a == "--backward-ms") f.backward_ms = std::stod(value());
    else if (a == "--steps") f.steps = std::max(1, std::stoi(value()));
    else if (a == "--warmup") f.warmup = std::max(0, std::stoi(value()));
    else if (a == "--channels") f.channels = std::max(1, std::stoi(value()));
    else if (a == "--quick") f.quick = true;
    else if (a == "--parts") f.parts = bench::parse_int_list(value());
    else if (a == "--help") usage("", 0);
    else usage("unknown flag '" + a + "'");
  }
  if (f.quick) f.steps = 3, f.warmup = 1;
  if (!(f.forward_ms > 0) || !(f.backward_ms > 0)) usage("pass times must be positive");

  std::printf("# bench_pipeline  %s\n# machine: %u usable hardware threads, %s; load average before the run: %s\n",
              bench::utc_now().c_str(), dist::detail::usable_hardware_threads(), bench::cpu_model().c_str(),
              bench::load_average().c_str());
  std::printf("# compiler: %s; CPU engine: %s; median of %d steps after %d warm-up\n\n", bench::compiler(),
              dist::engine<dist::cpu>{{}}.name().c_str(), f.steps, f.warmup);

  std::vector<std::string> bubble_json, memory_json, model_json;

  // ---- 1 ----
  std::vector<bubble_row> rows;
  if (f.part(1) || f.part(2)) {
    if (f.part(1))
      std::printf(
          "1. Bubble: p stages on a mirrored_strategy of p replicas, batch 16 as [mb, 1, 8, 8], each pass SLEEPS\n"
          "   (forward %.1f ms, backward %.1f ms per micro-batch): sleeping stages do not compete for the 2 cores,\n"
          "   so the figure is the schedule's. Stashable stage: nothing recomputed.\n"
          "   bubble = 1 - sum over stages of the time in forward+backward / (p x step wall time), median;\n"
          "   compute: the same from compute_seconds (adds the loss on the last stage); nominal: with the\n"
          "   configured sleeps as pass times; schedule: schedule_of simulated with free messages; wait: the\n"
          "   stages' wait_seconds / step_seconds; +us: a pass's time beyond its sleep (sleep_for's overshoot).\n\n"
          " p  schedule   m  step ms  ideal ms  bubble  compute  nominal  schedule  formula  bubble-formula  wait  "
          "+us  micro-batch/s  examples/s\n",
          f.forward_ms, f.backward_ms);
    for (int p : {2, 4})
      for (auto schedule : {dist::pipeline_schedule::gpipe, dist::pipeline_schedule::one_f_one_b})
        for (int m : {1, 2, 4, 8, 16}) {
          if (!f.part(1) && (p != 4 || m < 8)) continue;  // part 2 alone: only what it reports
          const bubble_row r = p == 2 ? measure_bubble<2>(f, schedule, m) : measure_bubble<4>(f, schedule, m);
          rows.push_back(r);
          if (!f.part(1)) continue;
          std::printf(
              "%2d  %-8s %3d  %7.1f  %8.1f  %5.1f%%   %5.1f%%   %5.1f%%    %5.1f%%   %5.1f%%       %+6.1f pp  %3.0f%%  "
              "%3.0f  %13.1f  %10.1f\n",
              r.p, dist::to_string(r.schedule), r.m, 1000 * r.step_s, (r.m + r.p - 1) * (f.forward_ms + f.backward_ms),
              100 * r.bubble, 100 * r.bubble_compute, 100 * r.bubble_nominal, 100 * r.simulated, 100 * r.ideal,
              100 * (r.bubble - r.ideal), 100 * r.wait_share, r.overshoot_us, r.m / r.step_s,
              static_cast<double>(r.batch) / r.step_s);
          std::fflush(stdout);
          bubble_json.push_back(
              "{\"p\":" + std::to_string(r.p) + ",\"schedule\":\"" + dist::to_string(r.schedule) +
              "\",\"m\":" + std::to_string(r.m) + ",\"step_ms\":" + json_double(1000 * r.step_s) +
              ",\"bubble\":" + json_double(r.bubble) + ",\"bubble_compute\":" + json_double(r.bubble_compute) +
              ",\"bubble_nominal\":" + json_double(r.bubble_nominal) + ",\"schedule_sim\":" + json_double(r.simulated) +
              ",\"ideal\":" + json_double(r.ideal) + ",\"wait_share\":" + json_double(r.wait_share) +
              ",\"overshoot_us\":" + json_double(r.overshoot_us) +
              ",\"micro_batches_per_s\":" + json_double(r.m / r.step_s) +
              ",\"examples_per_s\":" + json_double(static_cast<double>(r.batch) / r.step_s) + "}");
        }
  }

  // ---- 2 ----
  if (f.part(2)) {
    std::printf(
        "\n2. Inputs kept for the backward passes (peak_kept_bytes; the last stage's include the loss gradients),\n"
        "   p = 4 on 4 replicas, batch 16: the synthetic stage above ([mb, 1, 8, 8]) and a real stage (conv2d 3x3\n"
        "   %lld -> %lld channels + instance norm + leaky relu at 32x32), whose forward is run again before its\n"
        "   backward where another micro-batch's forward came in between (recomputed, per stage 0/1/2/3).\n\n",
        static_cast<long long>(f.channels), static_cast<long long>(f.channels));
    std::printf("stage      schedule   m  max over stages     stage 0   recomputed\n");
    auto kib = [](std::size_t b) { return static_cast<double>(b) / 1024.0; };
    for (int m : {8, 16})
      for (auto schedule : {dist::pipeline_schedule::gpipe, dist::pipeline_schedule::one_f_one_b})
        for (const auto& r : rows)
          if (r.p == 4 && r.m == m && r.schedule == schedule) {
            std::printf("synthetic  %-8s %3d  %11.1f KiB  %6.1f KiB  %11d\n", dist::to_string(schedule), m,
                        kib(r.peak_max), kib(r.peak_stage0), r.recomputed);
            memory_json.push_back("{\"stage\":\"synthetic\",\"schedule\":\"" + std::string(dist::to_string(schedule)) +
                                  "\",\"m\":" + std::to_string(m) + ",\"peak_kept_max\":" + std::to_string(r.peak_max) +
                                  ",\"peak_kept_stage0\":" + std::to_string(r.peak_stage0) +
                                  ",\"recomputed\":" + std::to_string(r.recomputed) + "}");
          }
    for (int m : {8, 16})
      for (auto schedule : {dist::pipeline_schedule::gpipe, dist::pipeline_schedule::one_f_one_b}) {
        const memory_row r = measure_real_memory(f, schedule, m);
        std::string per_stage, per_stage_json;
        for (std::size_t k = 0; k < r.recomputed.size(); ++k) {
          per_stage += (k ? "/" : "") + std::to_string(r.recomputed[k]);
          per_stage_json += (k ? "," : "") + std::to_string(r.recomputed[k]);
        }
        std::printf("conv       %-8s %3d  %11.1f KiB  %6.1f KiB  %11s\n", dist::to_string(schedule), m, kib(r.peak_max),
                    kib(r.peak_stage0), per_stage.c_str());
        std::fflush(stdout);
        memory_json.push_back("{\"stage\":\"conv\",\"schedule\":\"" + std::string(dist::to_string(schedule)) +
                              "\",\"m\":" + std::to_string(m) + ",\"peak_kept_max\":" + std::to_string(r.peak_max) +
                              ",\"peak_kept_stage0\":" + std::to_string(r.peak_stage0) + ",\"recomputed\":[" +
                              per_stage_json + "]}");
      }
  }

  // ---- 3 ----
  if (f.part(3)) {
    std::printf(
        "\n3. A real model's training step (Adam included): 2 stages of 3 blocks (conv2d 3x3 + instance norm + leaky\n"
        "   relu), 3 -> %lld -> ... -> 3 channels at 32x32, global batch 8. Each replica's engine gets cores / "
        "replicas\n"
        "   threads. The cases take turns in %d rounds of >= 0.2 s each; ms/step: the median round, and the range.\n"
        "   recomputed and loss: the first step after the warm-up, the same step everywhere (the losses must agree).\n"
        "   On 2 cores, data parallelism keeps both cores busy with no bubble, so it is expected to win.\n\n",
        static_cast<long long>(f.channels), f.steps);
    std::printf(
        "mode                                   replicas   m  ms/step  rounds range   examples/s  wait  recomputed  "
        "loss\n");
    std::vector<model_case> cases;
    cases.push_back(make_case<dist::one_device_strategy<>>(f, "one_device", {.micro_batches = 1}));
    for (auto schedule : {dist::pipeline_schedule::gpipe, dist::pipeline_schedule::one_f_one_b})
      for (int m : {2, 4, 8})
        cases.push_back(make_case<dist::mirrored_strategy<>>(f, "pipeline", {.micro_batches = m, .schedule = schedule},
                                                             dist::cpu_replicas(2)));
    cases.push_back(make_case<dist::mirrored_strategy<>>(f, "data_parallel", {.micro_batches = 1, .copies = 2},
                                                         dist::cpu_replicas(2)));
    time_models(cases, f);
    for (const auto& c : cases) {
      const std::string name = c.mode == "pipeline"     ? "pipeline, 2 stages, " + c.schedule
                               : c.mode == "one_device" ? "one_device_strategy (all cores)"
                                                        : "data parallel, 2 copies x both stages";
      const double step_s = bench::median(c.per_step);
      const auto [lo, hi] = std::minmax_element(c.per_step.begin(), c.per_step.end());
      std::printf("%-38s %8d %3d  %7.2f  %5.2f - %-6.2f  %10.0f  %3.0f%%  %10d  %.6f\n", name.c_str(), c.replicas, c.m,
                  1000 * step_s, 1000 * *lo, 1000 * *hi, model_batch / step_s, 100 * bench::median(c.waits),
                  c.first.recomputed, c.first.loss);
      model_json.push_back(
          "{\"mode\":\"" + c.mode + "\",\"schedule\":\"" + c.schedule +
          "\",\"replicas\":" + std::to_string(c.replicas) + ",\"m\":" + std::to_string(c.m) +
          ",\"s_per_step\":" + json_double(step_s) + ",\"s_per_step_min\":" + json_double(*lo) +
          ",\"s_per_step_max\":" + json_double(*hi) + ",\"wait_share\":" + json_double(bench::median(c.waits)) +
          ",\"recomputed\":" + std::to_string(c.first.recomputed) + ",\"loss\":" + json_double(c.first.loss) + "}");
    }
  }

  auto join = [](const std::vector<std::string>& v) {
    std::string out;
    for (const auto& s : v) out += (out.empty() ? "" : ",") + s;
    return out;
  };
  const std::string load_after = bench::load_average();
  std::printf("\n# load average after the run: %s\n\n", load_after.c_str());
  std::printf(
      "{\"bench\":\"pipeline\",\"forward_ms\":%s,\"backward_ms\":%s,\"bubble\":[%s],\"memory\":[%s],\"model\":[%s],"
      "\"load_after\":%s}\n",
      json_double(f.forward_ms).c_str(), json_double(f.backward_ms).c_str(), join(bubble_json).c_str(),
      join(memory_json).c_str(), join(model_json).c_str(), load_after == "unknown" ? "null" : load_after.c_str());
  return EXIT_SUCCESS;
} catch (const std::exception& e) {
  std::fprintf(stderr, "bench_pipeline: %s\n", e.what());
  return 1;
}
