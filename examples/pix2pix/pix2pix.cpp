// pix2pix as a denoiser: a U-Net generator with skip connections learns to give back a clean
// Fashion-MNIST image from one with Gaussian noise and an occluding patch, judged by a conditional
// PatchGAN discriminator (it sees the noisy image beside the clean or the generated one) with sync
// batch norm and LeakyReLU. The generator's loss is the GAN's plus 100 x L1 to the clean image, the
// pix2pix recipe. Mirrored over two CPU replicas by default; one line picks another strategy.
//
// The models are graphs, not chains (the U-Net's skips, D applied to fake and to real, G's gradient
// through D), so the step records them on an nn::tape and lets it route the gradients: no gradient
// is wired by hand here. At the end it reports the test L1 of the denoised images against the noisy
// inputs' own, and draws the first eight test images in --out DIR/denoised.png: the noisy inputs,
// the generator's outputs and the clean images, a row each.
//
//   pix2pix [--steps N] [--minutes M] [--batch B] [--channels C] [--lr LR] [--d-lr LR] [--l1-weight W]
//           [--replicas R] [--one-device] [--test N] [--data DIR] [--checkpoint-dir DIR [--stop-at S]]
//           [--out DIR]
//
// With --checkpoint-dir a run continues from the latest checkpoint there, and a signal (SIGTERM,
// SIGINT, SIGUSR1) stops it after the step it lands in, with a checkpoint. --stop-at S stops it the
// same way after S steps, as a job's time slice would: run again with the same flags (less --stop-at)
// to continue. The learning rate decays over --steps (and --minutes), so a run to be continued keeps
// its --steps; with --minutes far off, a continued run computes what one run without the stop would.
#include "../common/gan_checkpoint.hpp"

#include <distribute/distribute.hpp>
#include <distribute/nn.hpp>
#include <distribute/nn/tape.hpp>
#include <distribute/optim/adam.hpp>
#include <distribute/summary/png_grid.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace data = distribute::data;
using dist::shape;

constexpr std::int64_t side = 28, pixels = side * side;

// --- the models ------------------------------------------------------------------------------------

// U-Net: 28 -> 14 -> 7 -> 14 (+ skip) -> 28 (+ skip, + the noisy image) -> 28. The decoder sees the
// encoder's features of the same size beside its own (concat along the channels), and the last layer
// the input itself, so the fine detail need not pass through the 7x7 bottleneck. Its parameters,
// zero_grad, set_training and state-dict names ("e1.weight", ...) come from nn::module and the one
// list of members (the activations hold no state).
template <class D>
struct generator : nn::module<generator<D>, float, D> {
  template <class Tape>
  using var = typename Tape::variable;

  generator(const D& device, std::uint64_t seed, std::int64_t c = 16)
      : e1{{.in_channels = 1, .out_channels = c, .kernel = 3, .stride = 1, .padding = 1}, seed, device},
        e2{{.in_channels = c, .out_channels = 2 * c, .kernel = 4, .stride = 2, .padding = 1}, seed + 1, device},
        e3{{.in_channels = 2 * c, .out_channels = 4 * c, .kernel = 4, .stride = 2, .padding = 1}, seed + 2, device},
        d3{{.in_channels = 4 * c, .out_channels = 2 * c, .kernel = 4, .stride = 2, .padding = 1, .output_padding = 0},
           seed + 3,
           device},
        d2{{.in_channels = 4 * c, .out_channels = c, .kernel = 4, .stride = 2, .padding = 1, .output_padding = 0},
           seed + 4,
           device},
        out{{.in_channels = 2 * c + 1, .out_channels = 1, .kernel = 3, .stride = 1, .padding = 1}, seed + 5, device} {
    // He's initialisation, N(0, 2 / fan-in), instead of the layers' DCGAN N(0, 0.02): with no
    // normalisation in the generator, that keeps the activations' scale through the layers and
    // trains the denoiser several times faster.
    he_init(e1.weight(), 1 * 9, seed + 10, device);
    he_init(e2.weight(), c * 16, seed + 11, device);
    he_init(e3.weight(), 2 * c * 16, seed + 12, device);
    he_init(d3.weight(), 4 * c * 4, seed + 13, device);  // a transposed convolution's: Cin x (k / s)^2
    he_init(d2.weight(), 4 * c * 4, seed + 14, device);
    he_init(out.weight(), (2 * c + 1) * 9, seed + 15, device);
  }
  static void he_init(nn::parameter<float, D>& w, std::int64_t fan_in, std::uint64_t seed, const D& device) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, std::sqrt(2.0f / static_cast<float>(fan_in)));
    std::vector<float> host(w.value.size());
    for (auto& v : host) v = normal(rng);
    w.value = dist::tensor<float, D>::from_host(w.value.shape(), std::span<const float>(host), device);
  }

  template <class Tape>
  var<Tape> operator()(Tape& t, var<Tape> noisy) {
    const auto h1 = t(act1, t(e1, noisy));
    const auto h2 = t(act2, t(e2, h1));
    const auto h3 = t(act3, t(e3, h2));
    const auto u2 = t(up3, t(d3, h3));
    const auto u1 = t(up2, t(d2, t.concat(u2, h2)));
    return t(squash, t(out, t.concat(t.concat(u1, h1), noisy)));
  }

  auto members() { return nn::members("e1", e1, "e2", e2, "e3", e3, "d3", d3, "d2", d2, "out", out); }

  nn::conv2d<float, D> e1, e2, e3;
  nn::conv_transpose2d<float, D> d3, d2;
  nn::conv2d<float, D> out;
  nn::leaky_relu<float, D> act1, act2, act3;
  nn::relu<float, D> up3, up2;
  nn::tanh<float, D> squash;
};

// Conditional PatchGAN: [noisy | image] -> 14x14 -> 7x7 (sync batch norm) -> one score per 7x7 patch
// position. Its batch statistics are the global batch's under any strategy.
template <class D>
auto make_discriminator(const D& device, std::uint64_t seed, std::int64_t c = 32) {
  return nn::sequential{
      nn::conv2d<float, D>{{.in_channels = 2, .out_channels = c, .kernel = 4, .stride = 2, .padding = 1}, seed, device},
      nn::leaky_relu<float, D>{0.2f},
      nn::conv2d<float, D>{
          {.in_channels = c, .out_channels = 2 * c, .kernel = 4, .stride = 2, .padding = 1, .bias = false},
          seed + 1,
          device},
      nn::sync_batch_norm<float, D>{{.channels = 2 * c}, seed + 2, device},
      nn::leaky_relu<float, D>{0.2f},
      nn::conv2d<float, D>{
          {.in_channels = 2 * c, .out_channels = 1, .kernel = 3, .stride = 1, .padding = 1}, seed + 3, device}};
}

// --- the data ----------------------------------------------------------------------------------------

// Clean images in [-1, 1], and their noisy copies: Gaussian noise (sigma 0.5) and one occluding patch
// of 4 to 8 pixels a side, filled with one random grey; clipped to [-1, 1].
struct pairs {
  std::vector<float> clean, noisy;
};
pairs corrupt(std::span<const std::uint8_t> images, const std::vector<std::size_t>& which, std::mt19937_64& rng) {
  pairs p;
  p.clean.resize(which.size() * pixels);
  p.noisy.resize(which.size() * pixels);
  std::normal_distribution<float> noise(0.0f, 0.5f);
  std::uniform_int_distribution<int> size(4, 8);
  std::uniform_real_distribution<float> grey(-1.0f, 1.0f);
  for (std::size_t k = 0; k < which.size(); ++k) {
    float* c = &p.clean[k * pixels];
    float* n = &p.noisy[k * pixels];
    for (std::int64_t i = 0; i < pixels; ++i) {
      c[i] = static_cast<float>(images[which[k] * pixels + static_cast<std::size_t>(i)]) * (2.0f / 255.0f) - 1.0f;
      n[i] = std::clamp(c[i] + noise(rng), -1.0f, 1.0f);
    }
    const int h = size(rng), w = size(rng);
    const int top = std::uniform_int_distribution<int>(0, side - h)(rng),
              left = std::uniform_int_distribution<int>(0, side - w)(rng);
    const float g = grey(rng);
    for (int y = top; y < top + h; ++y)
      for (int x = left; x < left + w; ++x) n[y * side + x] = g;
  }
  return p;
}

double mean_abs_difference(std::span<const float> a, std::span<const float> b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += std::abs(static_cast<double>(a[i]) - b[i]);
  return a.empty() ? 0.0 : s / static_cast<double>(a.size());
}

struct options {
  int steps = 100000;
  double minutes = 1.9;        // training stops here even if steps remain
  std::int64_t batch = 16;     // the global batch
  std::int64_t channels = 16;  // the generator's first layer's; it doubles going down
  double lr = 4e-3;            // the generator's
  double d_lr = 1e-4;          // the discriminator's (a slower one leaves L1 the larger share)
  float l1_weight = 100;       // the L1 loss's weight beside the GAN loss's 1 (pix2pix's lambda)
  int replicas = 2;
  bool one_device = false;
  std::size_t test = 2000;
  std::string data_dir{data::fashion_mnist_default_dir};
  std::string checkpoint_dir;       // with one: resumes from it, and a signal stops the run with a checkpoint
  int stop_at = 0;                  // with checkpoint_dir: stop after this many steps, as a signal would (0: no)
  std::string out = "pix2pix_out";  // denoised.png goes here
};

// --- training ------------------------------------------------------------------------------------------

template <dist::strategy S>
int train(S& strategy, const options& o) {
  using device = typename S::device_type;
  const auto train_set = data::fashion_mnist(data::split::train, o.data_dir);
  const auto test_set = data::fashion_mnist(data::split::test, o.data_dir);
  const std::int64_t global = o.batch;

  auto gens = strategy.mirror([&](auto& d) { return generator<device>{d, 1, o.channels}; });
  auto discs = strategy.mirror([](auto& d) { return make_discriminator(d, 100); });
  auto g_opts = strategy.mirror([&](auto&) { return dist::optim::adam<float>{{.lr = o.lr, .beta1 = 0.5}}; });
  auto d_opts = strategy.mirror([&](auto&) { return dist::optim::adam<float>{{.lr = o.d_lr, .beta1 = 0.5}}; });

  std::mt19937_64 rng(7);
  std::uniform_int_distribution<std::size_t> pick(0, train_set.size() - 1);
  const auto start = std::chrono::steady_clock::now();
  double before = 0;  // training seconds of the runs this one continues
  auto elapsed = [&] {
    return before + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  int step = 0;
  // With --checkpoint-dir: the run continues from the latest checkpoint there, and SIGTERM, SIGINT
  // (Ctrl-C) or SIGUSR1 stop it after the step they land in, with a checkpoint of it. What a restart
  // needs: the networks, their optimisers, the data's random engine, the time spent.
  const examples::gan_checkpoint state{strategy, gens, discs, g_opts, d_opts, rng, elapsed, before};
  std::optional<dist::preemption_checkpoint<S>> preemption;
  if (!o.checkpoint_dir.empty()) preemption.emplace(strategy, o.checkpoint_dir, state.saver(), state.restorer());
  if (preemption && preemption->resumed()) {
    step = static_cast<int>(preemption->first_step());
    std::printf("resumed from %s at step %d (%.1f s trained)\n", preemption->restored_from()->string().c_str(), step,
                before);
  }
  for (; step < o.steps && elapsed() < 60 * o.minutes; ++step) {
    std::vector<std::size_t> which(static_cast<std::size_t>(global));
    for (auto& i : which) i = pick(rng);
    const pairs batch = corrupt(train_set.pixels(), which, rng);
    // Constant for the first half of the run (in steps or in time, whichever ends first), then down
    // linearly to zero: the last steps refine instead of jumping around the minimum.
    const double progress = std::max(static_cast<double>(step) / o.steps, elapsed() / (60 * o.minutes));
    const double decay = std::min(1.0, 2.0 * (1.0 - progress));
    const auto noisy = strategy.scatter(batch.noisy, pixels);
    const auto clean = strategy.scatter(batch.clean, pixels);
    auto losses = strategy.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, generator<device>& g,
            auto& d, dist::optim::adam<float>& og, dist::optim::adam<float>& od) {
          using tensor = dist::tensor<float, device>;
          const auto n = static_cast<std::int64_t>(xl.size()) / pixels;
          const tensor x = tensor::from_host(shape::nchw(n, 1, side, side), std::span<const float>(xl), r.device());
          const tensor y = tensor::from_host(shape::nchw(n, 1, side, side), std::span<const float>(yl), r.device());
          tensor ones{shape::nchw(n, 1, 7, 7), r.device()}, zeros{shape::nchw(n, 1, 7, 7), r.device()};
          ones.fill(1.0f);
          g.zero_grad();
          d.zero_grad();
          nn::tape t{r};
          const auto cond = t.constant(x);
          const auto fake = t(g, cond);
          // G: 100 x L1 to the clean image, and fooling D (whose parameters this leaves untouched).
          const auto l1 = t.loss(fake, [&](const tensor& v) { return nn::l1(r, v, y, global); }, o.l1_weight);
          const auto fooled = t.loss(t(d, t.concat(cond, fake), nn::frozen),
                                     [&](const tensor& s) { return nn::mse(r, s, ones, global); });
          // D: the generated image (detached: D's loss does not train G) scores 0, the clean one 1.
          const auto on_fake = t.loss(
              t(d, t.concat(cond, t.stop_gradient(fake))),
              [&](const tensor& s) { return nn::mse(r, s, zeros, global); }, 0.5f);
          const auto on_real = t.loss(
              t(d, t.concat(cond, t.constant(y))), [&](const tensor& s) { return nn::mse(r, s, ones, global); }, 0.5f);
          t.backward();
          r.all_reduce_gradients(g);
          r.all_reduce_gradients(d);
          og.set_lr(o.lr * decay);
          od.set_lr(o.d_lr * decay);
          og.step(r, g);
          od.step(r, d);
          return std::vector<double>{l1.value, fooled.value, 0.5 * (on_fake.value + on_real.value)};
        },
        noisy, clean, gens, discs, g_opts, d_opts);
    if (step % 100 == 0 || step + 1 == o.steps) {
      double l1 = 0, gan = 0, disc = 0;
      for (const auto& v : strategy.local_results(losses)) {
        l1 += v[0];
        gan += v[1];
        disc += v[2];
      }
      std::printf("step %4d  %6.1f s  train L1 %.4f  G gan %.4f  D %.4f\n", step, elapsed(), l1, gan, disc);
      std::fflush(stdout);
    }
    if (preemption && preemption->after_step(step)) {
      std::printf("stopped by %s; run again with the same --checkpoint-dir to continue\n",
                  preemption->describe().c_str());
      return preemption->exit_code();
    }
    if (preemption && step + 1 == o.stop_at && step + 1 < o.steps) {
      preemption->save(step);
      std::printf(
          "stopped after %d steps (--stop-at); run again with the same --steps and --checkpoint-dir to "
          "continue\n",
          step + 1);
      return 0;
    }
  }
  if (preemption && step > 0) preemption->save(step - 1);
  const double train_seconds = elapsed();
  strategy.verify_mirrored(gens);

  // Test: the primary's generator on held-out images with their own noise.
  std::vector<std::size_t> which(std::min(o.test, test_set.size()));
  for (std::size_t i = 0; i < which.size(); ++i) which[i] = i;
  std::mt19937_64 test_rng(12345);
  const pairs test = corrupt(test_set.pixels(), which, test_rng);
  std::vector<float> denoised;
  denoised.reserve(test.clean.size());
  for (std::size_t first = 0; first < which.size(); first += 250) {
    const std::size_t count = std::min<std::size_t>(250, which.size() - first);
    const std::span<const float> part(test.noisy.data() + first * pixels, count * pixels);
    strategy.run_on_primary(
        [&](auto& r, generator<device>& g) {
          using tensor = dist::tensor<float, device>;
          nn::tape t{r};
          const auto y = g(t, t.constant(tensor::from_host(shape::nchw(static_cast<std::int64_t>(count), 1, side, side),
                                                           part, r.device())));
          std::vector<float> host(y.value().size());
          if constexpr (requires { y.value().copy_to_host(std::span<float>(host)); })
            y.value().copy_to_host(std::span<float>(host));
          else std::copy(y.value().begin(), y.value().end(), host.begin());
          denoised.insert(denoised.end(), host.begin(), host.end());
        },
        gens);
  }
  const double l1_denoised = mean_abs_difference(denoised, test.clean),
               l1_noisy = mean_abs_difference(test.noisy, test.clean);
  // The first test images, noisy, denoised and clean: a row each.
  if (const auto shown = static_cast<std::int64_t>(std::min<std::size_t>(8, which.size())); shown > 0) {
    std::vector<float> rows;
    const std::array<const std::vector<float>*, 3> sources{&test.noisy, &denoised, &test.clean};
    for (const std::vector<float>* images : sources)
      rows.insert(rows.end(), images->begin(), images->begin() + shown * pixels);
    const auto picture = std::filesystem::path(o.out) / "denoised.png";
    std::filesystem::create_directories(picture.parent_path());
    dist::summary::write_png_grid(picture, dist::tensor<float>{shape::nchw(3 * shown, 1, side, side), rows}, 3,
                                  {.range = dist::summary::value_range::minus_one_to_one});
    std::printf("wrote %s: noisy inputs, denoised, clean (a row each)\n", picture.string().c_str());
  }
  std::printf("%d steps of %lld images on %d replica(s) in %.1f s\n", step, static_cast<long long>(global),
              strategy.num_replicas_in_sync(), train_seconds);
  std::printf("test L1 (%zu images, pixels in [-1, 1]): denoised %.4f, noisy input %.4f\n", which.size(), l1_denoised,
              l1_noisy);
  return l1_denoised < l1_noisy ? 0 : 1;
}

int main(int argc, char** argv) {
  options o;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view flag = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(std::string(flag) + " needs a value");
        return argv[++i];
      };
      if (flag == "--steps") o.steps = std::stoi(value());
      else if (flag == "--minutes") o.minutes = std::stod(value());
      else if (flag == "--batch") o.batch = std::stoll(value());
      else if (flag == "--channels") o.channels = std::stoll(value());
      else if (flag == "--lr") o.lr = std::stod(value());
      else if (flag == "--d-lr") o.d_lr = std::stod(value());
      else if (flag == "--l1-weight") o.l1_weight = std::stof(value());
      else if (flag == "--replicas") o.replicas = std::stoi(value());
      else if (flag == "--one-device") o.one_device = true;
      else if (flag == "--test") o.test = std::stoull(value());
      else if (flag == "--data") o.data_dir = value();
      else if (flag == "--checkpoint-dir") o.checkpoint_dir = value();
      else if (flag == "--stop-at") o.stop_at = std::stoi(value());
      else if (flag == "--out") o.out = value();
      else {
        std::puts(
            "usage: pix2pix [--steps N] [--minutes M] [--batch B] [--channels C] [--lr LR] [--d-lr LR] [--l1-weight W] "
            "[--replicas R] [--one-device] [--test N] [--data DIR] [--checkpoint-dir DIR [--stop-at S]] [--out DIR]");
        return flag == "--help" ? 0 : 1;
      }
    }
    if (o.stop_at < 0)
      throw std::invalid_argument("--stop-at " + std::to_string(o.stop_at) + ": a count of steps, >= 1");
    if (o.stop_at > 0 && o.checkpoint_dir.empty())
      throw std::invalid_argument("--stop-at needs --checkpoint-dir: a stopped run continues from its checkpoint");
    const auto images = std::filesystem::path(o.data_dir) / "train-images-idx3-ubyte.gz";
    if (!std::filesystem::exists(images) &&
        !std::filesystem::exists(std::filesystem::path(o.data_dir) / "train-images-idx3-ubyte")) {
      std::printf(
          "pix2pix: no Fashion-MNIST in %s (Debian: apt install dataset-fashion-mnist; or --data DIR); skipped\n",
          o.data_dir.c_str());
      return 77;
    }
    if (o.one_device) {
      dist::one_device_strategy<dist::cpu> strategy;
      return train(strategy, o);
    }
    dist::mirrored_strategy<dist::cpu> strategy{dist::cpu_replicas(o.replicas)};
    return train(strategy, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pix2pix: error: %s\n", e.what());
    return 1;
  }
}
