// The CycleGAN generator cut into two pipeline stages (the encoder with the first half of the residual
// blocks, then the rest and the decoder) and trained on a denoising task, four ways with the same
// model code: on one device, as data parallelism over 2 replicas, as a pipeline of 2 stages over
// micro-batches, and as the hybrid of 2 stages x 2 copies.
//
//   pipeline_generator [--steps N] [--batch N] [--micro-batches N] [--schedule gpipe|1f1b]
//                      [--size N] [--filters N] [--blocks N] [--modes one_device,data,pipeline,hybrid]
//                      [--exact]
//
// With --exact every mode computes with the split-independent reference engine on one thread per
// replica, and the program checks that the pipeline's losses are the one-device run's bit for bit
// (and the others' to float rounding); it exits 1 if they are not.

#include "../cyclegan/models.hpp"

#include <distribute/distribute.hpp>
#include <distribute/optim/adam.hpp>
#include <distribute/pipeline.hpp>
#include <distribute/tensor/micro_batches.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <span>
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace dist = distribute;
namespace nn = distribute::nn;
using cyclegan::residual;
using cyclegan::sub;
using tensor = dist::tensor<float>;

struct flags {
  int steps = 6;
  std::int64_t batch = 8;
  int micro_batches = 4;
  dist::pipeline_schedule schedule = dist::pipeline_schedule::one_f_one_b;
  std::int64_t size = 16;
  std::int64_t filters = 8;
  int blocks = 2;
  std::vector<std::string> modes{"one_device", "data", "pipeline", "hybrid"};
  bool exact = false;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "pipeline_generator: %s\n"
               "usage: pipeline_generator [--steps N] [--batch N] [--micro-batches N] [--schedule gpipe|1f1b]\n"
               "                          [--size N] [--filters N] [--blocks N] [--modes "
               "one_device,data,pipeline,hybrid] [--exact]\n",
               why.c_str());
  std::exit(2);
}

long long number(const char* name, const char* text, long long lo, long long hi) {
  char* end = nullptr;
  const long long v = std::strtoll(text, &end, 10);
  if (!*text || *end || v < lo || v > hi)
    usage(std::string(name) + " needs a whole number from " + std::to_string(lo) + " to " + std::to_string(hi) +
          ", got '" + text + "'");
  return v;
}

flags parse(int argc, char** argv) {
  flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--steps") f.steps = static_cast<int>(number("--steps", value(), 1, 100000));
    else if (a == "--batch") f.batch = number("--batch", value(), 1, 4096);
    else if (a == "--micro-batches") f.micro_batches = static_cast<int>(number("--micro-batches", value(), 1, 4096));
    else if (a == "--size") f.size = number("--size", value(), 8, 512);
    else if (a == "--filters") f.filters = number("--filters", value(), 1, 256);
    else if (a == "--blocks") f.blocks = static_cast<int>(number("--blocks", value(), 0, 64));
    else if (a == "--exact") f.exact = true;
    else if (a == "--schedule") {
      const std::string s = value();
      if (s == "gpipe") f.schedule = dist::pipeline_schedule::gpipe;
      else if (s == "1f1b") f.schedule = dist::pipeline_schedule::one_f_one_b;
      else usage("--schedule is gpipe or 1f1b, got '" + s + "'");
    } else if (a == "--modes") {
      f.modes.clear();
      std::stringstream list(value());
      for (std::string m; std::getline(list, m, ',');) {
        if (m != "one_device" && m != "data" && m != "pipeline" && m != "hybrid")
          usage("--modes takes one_device, data, pipeline, hybrid; got '" + m + "'");
        f.modes.push_back(m);
      }
    } else {
      usage("unknown flag '" + a + "'");
    }
  }
  if (f.size % 4 != 0) usage("--size must be a multiple of 4 (the generator halves it twice)");
  return f;
}

// Stage 0: c7s1-f, d2f, d4f and the first half of the residual blocks. Stage 1: the other residual
// blocks, u2f, uf, c7s1-1 and tanh. Seeds as in cyclegan::make_generator.
auto make_encoder(const flags& f, std::uint64_t seed) {
  using conv2d = nn::conv2d<float>;
  const std::int64_t k = f.filters;
  std::vector<residual<>> blocks;
  for (int i = 0; i < f.blocks / 2; ++i) blocks.emplace_back(4 * k, sub(seed, 100 + static_cast<std::uint64_t>(i)));
  auto in = [&](std::int64_t ch, std::uint64_t i) { return nn::instance_norm<float>{{.channels = ch}, sub(seed, i)}; };
  return nn::sequential{
      conv2d{{.in_channels = 1,
              .out_channels = k,
              .kernel = 7,
              .stride = 1,
              .padding = 3,
              .pad_mode = nn::padding_mode::reflect,
              .bias = false},
             sub(seed, 1)},
      in(k, 2),
      nn::relu<float>{},
      conv2d{{.in_channels = k, .out_channels = 2 * k, .kernel = 3, .stride = 2, .padding = 1, .bias = false},
             sub(seed, 3)},
      in(2 * k, 4),
      nn::relu<float>{},
      conv2d{{.in_channels = 2 * k, .out_channels = 4 * k, .kernel = 3, .stride = 2, .padding = 1, .bias = false},
             sub(seed, 5)},
      in(4 * k, 6),
      nn::relu<float>{},
      cyclegan::repeated<residual<>>{std::move(blocks)}};
}
auto make_decoder(const flags& f, std::uint64_t seed) {
  using conv2d = nn::conv2d<float>;
  using conv_transpose2d = nn::conv_transpose2d<float>;
  const std::int64_t k = f.filters;
  std::vector<residual<>> blocks;
  for (int i = f.blocks / 2; i < f.blocks; ++i)
    blocks.emplace_back(4 * k, sub(seed, 100 + static_cast<std::uint64_t>(i)));
  auto in = [&](std::int64_t ch, std::uint64_t i) { return nn::instance_norm<float>{{.channels = ch}, sub(seed, i)}; };
  return nn::sequential{cyclegan::repeated<residual<>>{std::move(blocks)},
                        conv_transpose2d{{.in_channels = 4 * k,
                                          .out_channels = 2 * k,
                                          .kernel = 3,
                                          .stride = 2,
                                          .padding = 1,
                                          .output_padding = 1,
                                          .bias = false},
                                         sub(seed, 7)},
                        in(2 * k, 8),
                        nn::relu<float>{},
                        conv_transpose2d{{.in_channels = 2 * k,
                                          .out_channels = k,
                                          .kernel = 3,
                                          .stride = 2,
                                          .padding = 1,
                                          .output_padding = 1,
                                          .bias = false},
                                         sub(seed, 9)},
                        in(k, 10),
                        nn::relu<float>{},
                        conv2d{{.in_channels = k,
                                .out_channels = 1,
                                .kernel = 7,
                                .stride = 1,
                                .padding = 3,
                                .pad_mode = nn::padding_mode::reflect},
                               sub(seed, 11)},
                        nn::tanh<float>{}};
}

// Step t's batch: clean images of soft blobs in [-1, 1] (targets) and the same with noise (inputs).
struct batch {
  tensor noisy, clean;
};
batch make_batch(const flags& f, int step) {
  std::mt19937_64 rng(1234 + static_cast<std::uint64_t>(step));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  const auto n = f.batch, s = f.size;
  batch b{tensor{dist::shape::nchw(n, 1, s, s)}, tensor{dist::shape::nchw(n, 1, s, s)}};
  for (std::int64_t e = 0; e < n; ++e) {
    const double cx = u(rng) * s, cy = u(rng) * s, r = 2 + u(rng) * s / 3;
    for (std::int64_t y = 0; y < s; ++y)
      for (std::int64_t x = 0; x < s; ++x) {
        const double d2 = ((x - cx) * (x - cx) + (y - cy) * (y - cy)) / (r * r);
        const auto v = static_cast<float>(2.0 * std::exp(-d2) - 1.0);
        b.clean(e, 0, y, x) = v;
        b.noisy(e, 0, y, x) = v + noise(rng);
      }
  }
  return b;
}

struct l1_loss {
  template <class R>
  nn::loss_result<float> operator()(R& r, const tensor& y, const tensor& t, std::int64_t global) const {
    return nn::l1(r, y, t, global);
  }
};

dist::compute_options engine_of(const flags& f) {
  if (!f.exact) return {};
  return {.threads = 1, .split_independent = true, .reference = true};
}

struct run {
  std::string mode;
  std::vector<double> losses;
  double seconds = 0;
  double wait_share = 0;          // the pipeline's: time waiting for the neighbouring stage / step time
  std::vector<float> parameters;  // copy 0's, stage by stage
};

// `replicas` replicas; each copy (of `copies`) trains on its share of every batch.
template <class S>
run train(S& strategy, const flags& f, const std::string& mode, int copies, int micro_batches) {
  strategy.set_compute_options(engine_of(f));
  const std::uint64_t seed = 7;
  dist::pipeline model(
      strategy, {.micro_batches = micro_batches, .schedule = f.schedule, .copies = copies},
      [&](const dist::cpu&) { return make_encoder(f, seed); }, [&](const dist::cpu&) { return make_decoder(f, seed); });
  auto opts = strategy.values_from_function([](int) { return dist::optim::adam<>({.lr = 2e-3, .beta1 = 0.5}); });
  run out{mode, {}, 0, 0, {}};
  double waited = 0, stepped = 0;
  const auto started = std::chrono::steady_clock::now();
  for (int t = 0; t < f.steps; ++t) {
    const batch b = make_batch(f, t);
    auto results = strategy.run(
        [&](auto& r, dist::optim::adam<>& opt) {
          const int c = model.copy_of(r.replica_id());
          const std::int64_t lo = f.batch * c / copies, hi = f.batch * (c + 1) / copies;
          auto result = model.train_step(r, dist::batch_slice(b.noisy, lo, hi - lo),
                                         dist::batch_slice(b.clean, lo, hi - lo), l1_loss{}, f.batch);
          opt.step(r, model.local(r));
          return result;
        },
        opts);
    double loss = 0;
    for (const auto& result : strategy.local_results(results)) {
      loss += result.loss;
      waited += result.wait_seconds;
      stepped += result.step_seconds;
    }
    out.losses.push_back(loss);
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  out.wait_share = stepped > 0 ? waited / stepped : 0;
  auto params = strategy.run([&](auto& r) {
    std::vector<float> v;
    model.local(r).for_each_parameter(
        [&](std::span<float> p, std::span<float>) { v.insert(v.end(), p.begin(), p.end()); });
    return v;
  });
  for (int k = 0; k < model.positions(); ++k) {
    const auto& v = strategy.local_results(params)[static_cast<std::size_t>(k)];
    out.parameters.insert(out.parameters.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  const flags f = parse(argc, argv);
  std::printf(
      "the CycleGAN generator (filters %lld, %d residual blocks) on %lldx%lld denoising, batch %lld, %d steps\n",
      static_cast<long long>(f.filters), f.blocks, static_cast<long long>(f.size), static_cast<long long>(f.size),
      static_cast<long long>(f.batch), f.steps);
  std::printf("pipeline: 2 stages, %d micro-batches, %s schedule%s\n\n", f.micro_batches, dist::to_string(f.schedule),
              f.exact ? "; reference engine, one thread per replica (--exact)" : "");
  std::vector<run> runs;
  for (const auto& mode : f.modes) {
    if (mode == "one_device") {
      dist::one_device_strategy<> s;
      runs.push_back(train(s, f, "one device", 1, 1));
    } else if (mode == "data") {
      dist::mirrored_strategy<> s(dist::cpu_replicas(2));
      runs.push_back(train(s, f, "data parallel, 2 copies", 2, 1));
    } else if (mode == "pipeline") {
      dist::mirrored_strategy<> s(dist::cpu_replicas(2));
      runs.push_back(train(s, f, "pipeline, 2 stages", 1, f.micro_batches));
    } else {
      dist::mirrored_strategy<> s(dist::cpu_replicas(4));
      runs.push_back(train(s, f, "hybrid, 2 stages x 2 copies", 2, f.micro_batches));
    }
  }
  std::printf("%-30s %10s %10s %12s %12s\n", "mode", "s/step", "wait", "first loss", "last loss");
  for (const auto& r : runs)
    std::printf("%-30s %10.4f %9.0f%% %12.6f %12.6f\n", r.mode.c_str(), r.seconds / f.steps, 100 * r.wait_share,
                r.losses.front(), r.losses.back());

  if (!f.exact) return 0;
  // The check: the pipeline's parameters are the one-device run's bit for bit; data parallel and the
  // hybrid (whose copies' gradients are summed in another grouping) agree to float rounding, as do
  // the losses (the pipeline sums its micro-batches' shares).
  const run* one = nullptr;
  for (const auto& r : runs)
    if (r.mode == "one device") one = &r;
  if (!one) return 0;
  bool ok = true;
  for (const auto& r : runs) {
    const bool pipelined = r.mode.rfind("pipeline", 0) == 0;
    double worst = 0;
    for (std::size_t i = 0; i < r.parameters.size() && i < one->parameters.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(r.parameters[i]) - one->parameters[i]) /
                                  std::max(1e-2, std::abs(static_cast<double>(one->parameters[i]))));
    const bool same_bits = r.parameters == one->parameters;
    if (r.parameters.size() != one->parameters.size() || (pipelined ? !same_bits : worst > 1e-4)) {
      std::printf("MISMATCH: %s's parameters differ from one device's (largest relative difference %.3g)\n",
                  r.mode.c_str(), worst);
      ok = false;
    }
    for (std::size_t t = 0; t < r.losses.size(); ++t)
      if (std::abs(r.losses[t] - one->losses[t]) > 1e-5 * std::abs(one->losses[t])) {
        std::printf("MISMATCH: %s step %zu loss %.9g, one device %.9g\n", r.mode.c_str(), t, r.losses[t],
                    one->losses[t]);
        ok = false;
      }
  }
  std::printf("\n%s\n", ok ? "the pipeline matches one device bit for bit; data parallel and hybrid to float rounding"
                           : "the modes disagree");
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "pipeline_generator: %s\n", e.what());
  return 1;
}
