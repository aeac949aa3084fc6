// A class-conditional GAN on Fashion-MNIST: a generator of 28x28 images from noise and a class, and
// a projection discriminator (Miyato & Koyama 2018) with spectral norm, trained with the hinge loss,
// two Adam optimisers (the discriminator's the faster) and a lazy R1 penalty on the real images
// (every 16 steps, StyleGAN2's). Mirrored over two CPU replicas by default; one line picks another
// strategy.
//
// The discriminator is a model written for a tape, its layers called one by one, so that R1 can take
// the gradient of its score with respect to its input with nn::create_graph and back-propagate the
// penalty into its parameters (each layer has a recorded backward: docs/nn.md, "Gradient penalties"). At the end the program writes
// a grid of 10 classes x 10 samples, and scores 1,000 generated images (100 per class) with the
// Fashion-MNIST classifier of the CycleGAN example (examples/common/fmnist_classifier.hpp): the share
// that lands in the class asked for.
//
//   conditional_gan [--steps N] [--minutes M] [--batch B] [--g-lr LR] [--d-lr LR] [--r1 GAMMA] ...
//   (--help lists them all)
#include "../common/fmnist_classifier.hpp"
#include "../common/gan_checkpoint.hpp"
#include "../cyclegan/export.hpp"
#include "../cyclegan/flags.hpp"

#include <distribute/checkpoint.hpp>
#include <distribute/distribute.hpp>
#include <distribute/nn.hpp>
#include <distribute/nn/tape.hpp>
#include <distribute/optim/adam.hpp>
#include <distribute/preemption.hpp>
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
#include <type_traits>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace data = distribute::data;
namespace fs = std::filesystem;
using dist::shape;

constexpr std::int64_t side = 28, pixels = side * side, classes = fmnist::classes;

inline std::uint64_t sub(std::uint64_t seed, std::uint64_t i) { return nn::detail::sub_seed(seed, i); }

// A replica's tensor on the host (a copy down from a GPU).
template <class T>
std::vector<float> host_values(const T& t) {
  if constexpr (std::is_same_v<T, dist::tensor<float>>) return std::vector<float>(t.begin(), t.end());
  else return t.to_vector();
}

struct model_options {
  std::int64_t noise = 64;       // the length of z
  std::int64_t g_channels = 16;  // the generator's last convolution's; x2 and x4 before it
  std::int64_t d_channels = 32;  // the discriminator's first convolution's; x2 and x4 after it
};

// --- the models ------------------------------------------------------------------------------------

// z [N, noise] and classes [N] -> images [N, 1, 28, 28] in [-1, 1]:
//   [z | embed(y)] -> linear -> [4c, 7, 7] -> up x2, conv3x3 2c -> up x2, conv3x3 c -> conv3x3 1, tanh
// each convolution but the last followed by sync batch norm (the global batch's statistics, so the
// replicas' running statistics stay identical) and ReLU: DCGAN's generator, with nearest up-sampling
// and a 3x3 convolution in place of its transposed convolutions (no checkerboard artefacts).
template <class D>
struct generator : nn::module<generator<D>, float, D> {
  template <class Tape>
  using var = typename Tape::variable;

  generator(const D& device, std::uint64_t seed, const model_options& o)
      : noise{o.noise},
        c{o.g_channels},
        embed{{.num_embeddings = classes, .embedding_dim = o.noise}, sub(seed, 0), device},
        dense{{.in_features = 2 * o.noise, .out_features = 4 * c * 7 * 7, .bias = false}, sub(seed, 1), device},
        bn0{{.channels = 4 * c}, sub(seed, 2), device},
        conv1{{.in_channels = 4 * c, .out_channels = 2 * c, .kernel = 3, .padding = 1, .bias = false},
              sub(seed, 3),
              device},
        bn1{{.channels = 2 * c}, sub(seed, 4), device},
        conv2{
            {.in_channels = 2 * c, .out_channels = c, .kernel = 3, .padding = 1, .bias = false}, sub(seed, 5), device},
        bn2{{.channels = c}, sub(seed, 6), device},
        out{{.in_channels = c, .out_channels = 1, .kernel = 3, .padding = 1}, sub(seed, 7), device} {}

  template <class Tape>
  var<Tape> operator()(Tape& t, var<Tape> z, var<Tape> labels) {
    auto h = t(dense, t.concat(z, t(embed, labels)));
    h = t(act0, t(bn0, nn::reshape(t, h, {-1, 4 * c, 7, 7})));
    h = t(act1, t(bn1, t(conv1, t(up, h))));
    h = t(act2, t(bn2, t(conv2, t(up, h))));
    return t(squash, t(out, h));
  }

  // ONNX has one input here: [N, noise + 1], z with the class (0 to 9) as its last column. The graph
  // cuts it apart (Slice, Squeeze) and continues as the tape's call does.
  template <class G>
  typename G::value to_onnx(G& g, const typename G::value& x) {
    const std::int64_t n = x.shape[0];
    auto ints = [&](const char* hint, std::vector<std::int64_t> v) {
      return g.template initializer<std::int64_t>(hint, {static_cast<std::int64_t>(v.size())},
                                                  std::span<const std::int64_t>(v));
    };
    const std::string axis1 = ints("axis1", {1});
    const auto z = g.node("Slice", {x.name, ints("z_begin", {0}), ints("z_end", {noise}), axis1}, shape{n, noise});
    const auto column =
        g.node("Slice", {x.name, ints("y_begin", {noise}), ints("y_end", {noise + 1}), axis1}, shape{n, 1});
    const auto y = g.node("Squeeze", {column.name, axis1}, shape{n});
    const auto e = this->onnx_member(g, embed, y);
    const auto joined = g.node("Concat", {z.name, e.name}, shape{n, 2 * noise}, {{"axis", std::int64_t{1}}});
    const auto flat = this->onnx_member(g, dense, joined);
    auto h = g.node("Reshape", {flat.name, ints("maps", {-1, 4 * c, 7, 7})}, shape::nchw(n, 4 * c, 7, 7));
    h = g.layer(act0, this->onnx_member(g, bn0, h));
    h = g.layer(act1, this->onnx_member(g, bn1, this->onnx_member(g, conv1, g.layer(up, h))));
    h = g.layer(act2, this->onnx_member(g, bn2, this->onnx_member(g, conv2, g.layer(up, h))));
    return g.layer(squash, this->onnx_member(g, out, h));
  }

  auto members() {
    return nn::members("embed", embed, "dense", dense, "bn0", bn0, "conv1", conv1, "bn1", bn1, "conv2", conv2, "bn2",
                       bn2, "out", out);
  }

  std::int64_t noise, c;
  nn::embedding<float, D> embed;
  nn::linear<float, D> dense;
  nn::sync_batch_norm<float, D> bn0;
  nn::conv2d<float, D> conv1;
  nn::sync_batch_norm<float, D> bn1;
  nn::conv2d<float, D> conv2;
  nn::sync_batch_norm<float, D> bn2;
  nn::conv2d<float, D> out;
  nn::upsample<float, D> up{{.scale_factor = 2}};
  nn::relu<float, D> act0, act1, act2;
  nn::tanh<float, D> squash;
};

// Images [N, 1, 28, 28] and classes [N] -> scores [N, 1]: the projection discriminator,
//   h = sum over positions of the features (SNGAN's global sum pooling)   [N, 4c]
//   score = linear(h) + <embed(y), h>
// with spectral norm on its convolutions and on the linear head. Every layer it calls has a recorded
// backward, so R1 can differentiate its input gradient.
template <class D>
struct discriminator : nn::module<discriminator<D>, float, D> {
  template <class Tape>
  using var = typename Tape::variable;
  using sn_conv = nn::spectral_norm<nn::conv2d<float, D>>;
  using sn_linear = nn::spectral_norm<nn::linear<float, D>>;

  discriminator(const D& device, std::uint64_t seed, const model_options& o)
      : c{o.d_channels},
        conv1{nn::conv2d<float, D>{
                  {.in_channels = 1, .out_channels = c, .kernel = 4, .stride = 2, .padding = 1}, sub(seed, 0), device},
              {},
              sub(seed, 1)},
        conv2{nn::conv2d<float, D>{{.in_channels = c, .out_channels = 2 * c, .kernel = 4, .stride = 2, .padding = 1},
                                   sub(seed, 2),
                                   device},
              {},
              sub(seed, 3)},
        conv3{nn::conv2d<float, D>{
                  {.in_channels = 2 * c, .out_channels = 4 * c, .kernel = 3, .padding = 1}, sub(seed, 4), device},
              {},
              sub(seed, 5)},
        head{nn::linear<float, D>{{.in_features = 4 * c, .out_features = 1}, sub(seed, 6), device}, {}, sub(seed, 7)},
        embed{{.num_embeddings = classes, .embedding_dim = 4 * c}, sub(seed, 8), device} {
    // The class embedding has no spectral norm (the library's wraps linear and conv2d only); drawn
    // N(0, 1) as PyTorch's, its projection would dwarf the head's score at the start, so it starts
    // at the scale of a spectrally normalised row: standard deviation 1 / sqrt(4c).
    auto& w = embed.weight().value;
    std::vector<float> host = host_values(w);
    for (auto& v : host) v /= std::sqrt(static_cast<float>(4 * c));
    w = dist::tensor<float, D>::from_host(w.shape(), std::span<const float>(host), device);
  }

  template <class Tape>
  var<Tape> operator()(Tape& t, var<Tape> x, var<Tape> labels) {
    auto h = t(act1, t(conv1, x));                                                          // 14x14
    h = t(act2, t(conv2, h));                                                               // 7x7
    h = t(act3, t(conv3, h));                                                               // 7x7
    const auto features = nn::sum(t, h, {2, 3});                                            // [N, 4c]
    const auto projection = nn::sum(t, nn::mul(t, t(embed, labels), features), {1}, true);  // [N, 1]
    return nn::add(t, t(head, features), projection);
  }

  auto members() { return nn::members("conv1", conv1, "conv2", conv2, "conv3", conv3, "head", head, "embed", embed); }

  std::int64_t c;
  sn_conv conv1, conv2, conv3;
  sn_linear head;
  nn::embedding<float, D> embed;
  nn::leaky_relu<float, D> act1{0.2f}, act2{0.2f}, act3{0.2f};
};

// --- the command line ------------------------------------------------------------------------------

struct options {
  std::int64_t steps = 100000;
  double minutes = 4.5;     // training stops here even if steps remain
  std::int64_t batch = 32;  // the global batch
  // Two time scales: the discriminator learns four times faster. At 4e-4 the generator gave each
  // class one image whatever the noise (90% scored, every sample of a row alike); at 2e-4 its samples
  // vary within a class at about the same score (89.5%).
  double g_lr = 2e-4;
  double d_lr = 8e-4;
  double beta1 = 0.0;          // Adam's, both optimisers'
  double r1 = 0.1;             // R1's gamma
  std::int64_t r1_every = 16;  // lazy regularisation
  model_options model{};
  int replicas = 2;
  std::uint64_t seed = 1;
  std::int64_t log_every = 100;
  fs::path data_dir = std::string(data::fashion_mnist_default_dir);
  fs::path out_dir = "conditional_gan_out";
  // Where scripts/demo.sh leaves the classifier that fmnist_classifier trains (run from the
  // repository's root); absent, the score is skipped.
  fs::path classifier = "demo_out/fmnist_classifier_bn3.dck";
  fs::path checkpoint_dir;
  std::int64_t checkpoint_every = 500;
  bool resume = false;
  fs::path export_dir;
};

const char* usage = R"(usage: conditional_gan [flags]
training
  --steps N              at most N steps (default 100000)
  --minutes M            and at most M minutes of training (default 4.5)
  --batch N              the global batch, split over the replicas (default 32)
  --g-lr X --d-lr X      Adam's learning rates (default 2e-4 and 8e-4)
  --beta1 X              Adam's beta1 (default 0; beta2 is 0.9)
  --r1 GAMMA             the R1 penalty's weight on real images (default 0.1; 0: none)
  --r1-every N           lazy R1: every N steps, weighted by N (default 16)
  --noise N              the length of z (default 64)
  --g-channels N --d-channels N   the models' widths (default 16, 32)
  --replicas N           CPU replicas of the mirrored strategy (default 2)
  --seed N               initialisation, data order and noise (default 1)
  --log-every N          a progress line every N steps (default 100)
files
  --data DIR             Fashion-MNIST (default /usr/share/datasets/fashion-mnist)
  --out DIR              the picture of 10 classes x 10 samples (default conditional_gan_out)
  --classifier FILE      fmnist_classifier's checkpoint, to score the classes of the generated images
                         (default demo_out/fmnist_classifier_bn3.dck, where scripts/demo.sh puts it)
  --checkpoint-dir DIR   checkpoints every --checkpoint-every steps (500), at the end, and on SIGTERM,
                         SIGINT or SIGUSR1 (the run then stops)
  --resume               continue from the latest checkpoint in --checkpoint-dir
  --export DIR           the generator as DIR/generator.safetensors and DIR/generator.onnx (the ONNX
                         input is [N, noise + 1]: z, then the class as a number)
)";

bool parse(options& o, int argc, const char* const* argv) {
  cyclegan::flags::parser p;
  p.integer("--steps", o.steps, std::int64_t{1}, std::int64_t{1'000'000'000})
      .real("--minutes", o.minutes, 0.0, 1e6, true)
      .integer("--batch", o.batch, std::int64_t{1}, std::int64_t{4096})
      .real("--g-lr", o.g_lr, 0.0, 1.0, true)
      .real("--d-lr", o.d_lr, 0.0, 1.0, true)
      .real("--beta1", o.beta1, 0.0, 0.999)
      .real("--r1", o.r1, 0.0, 1e4)
      .integer("--r1-every", o.r1_every, std::int64_t{1}, std::int64_t{1'000'000})
      .integer("--noise", o.model.noise, std::int64_t{1}, std::int64_t{4096})
      .integer("--g-channels", o.model.g_channels, std::int64_t{1}, std::int64_t{1024})
      .integer("--d-channels", o.model.d_channels, std::int64_t{1}, std::int64_t{1024})
      .integer("--replicas", o.replicas, 1, 256)
      .integer("--seed", o.seed, std::uint64_t{0}, std::numeric_limits<std::uint64_t>::max())
      .integer("--log-every", o.log_every, std::int64_t{1}, std::int64_t{1'000'000'000})
      .path("--data", o.data_dir)
      .path("--out", o.out_dir)
      .path("--classifier", o.classifier)
      .path("--checkpoint-dir", o.checkpoint_dir)
      .integer("--checkpoint-every", o.checkpoint_every, std::int64_t{0}, std::int64_t{1'000'000'000})
      .toggle("--resume", o.resume)
      .path("--export", o.export_dir);
  if (!p.parse(argc, argv)) return false;
  if (o.resume && o.checkpoint_dir.empty()) throw std::invalid_argument("--resume needs --checkpoint-dir");
  if (o.batch < o.replicas)
    throw std::invalid_argument("--batch " + std::to_string(o.batch) + " is smaller than the " +
                                std::to_string(o.replicas) + " replicas");
  return true;
}

// --- training ------------------------------------------------------------------------------------------

// One step's host data: real images in [-1, 1] with their classes, and noise with the classes asked
// of the generator (drawn uniformly).
struct batch_data {
  std::vector<float> real, real_labels, z, fake_labels;
};

batch_data draw(const data::idx_dataset& set, std::int64_t n, std::int64_t noise, std::mt19937_64& rng) {
  batch_data b;
  std::uniform_int_distribution<std::size_t> pick(0, set.size() - 1);
  std::uniform_int_distribution<int> cls(0, classes - 1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const auto images = set.pixels();
  const auto labels = set.labels();
  b.real.reserve(static_cast<std::size_t>(n * pixels));
  for (std::int64_t i = 0; i < n; ++i) {
    const std::size_t k = pick(rng);
    for (std::int64_t p = 0; p < pixels; ++p)
      b.real.push_back(static_cast<float>(images[k * pixels + static_cast<std::size_t>(p)]) * (2.0f / 255.0f) - 1.0f);
    b.real_labels.push_back(static_cast<float>(labels[k]));
    b.fake_labels.push_back(static_cast<float>(cls(rng)));
  }
  b.z.resize(static_cast<std::size_t>(n * noise));
  for (auto& v : b.z) v = normal(rng);
  return b;
}

template <dist::strategy S>
int train(S& strategy, const options& o) {
  using device = typename S::device_type;
  using tensor = dist::tensor<float, device>;
  const auto train_set = data::fashion_mnist(data::split::train, o.data_dir);
  const std::int64_t global = o.batch, noise = o.model.noise;

  auto gens = strategy.mirror([&](auto& d) { return generator<device>{d, sub(o.seed, 1), o.model}; });
  auto discs = strategy.mirror([&](auto& d) { return discriminator<device>{d, sub(o.seed, 2), o.model}; });
  // beta1 0 (the default) and beta2 0.9: the usual pair for hinge-loss GANs with spectral norm (SNGAN,
  // BigGAN).
  auto g_opts =
      strategy.mirror([&](auto&) { return dist::optim::adam<float>{{.lr = o.g_lr, .beta1 = o.beta1, .beta2 = 0.9}}; });
  auto d_opts =
      strategy.mirror([&](auto&) { return dist::optim::adam<float>{{.lr = o.d_lr, .beta1 = o.beta1, .beta2 = 0.9}}; });
  std::int64_t g_params = 0, d_params = 0;
  gens[0].for_each_parameter([&](auto v, auto) { g_params += static_cast<std::int64_t>(v.size()); });
  discs[0].for_each_parameter([&](auto v, auto) { d_params += static_cast<std::int64_t>(v.size()); });
  std::printf(
      "conditional GAN on Fashion-MNIST: %d replica(s), global batch %lld, generator %lld parameters, "
      "discriminator %lld; lr G %g D %g, R1 gamma %g every %lld steps; at most %lld steps or %.1f minutes\n",
      strategy.num_replicas_in_sync(), static_cast<long long>(global), static_cast<long long>(g_params),
      static_cast<long long>(d_params), o.g_lr, o.d_lr, o.r1, static_cast<long long>(o.r1_every),
      static_cast<long long>(o.steps), o.minutes);
  std::fflush(stdout);

  std::mt19937_64 rng(o.seed);
  const auto start = std::chrono::steady_clock::now();
  double before = 0;  // training seconds of the runs this one continues
  auto elapsed = [&] {
    return before + std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  std::int64_t step = 0;
  // With --checkpoint-dir: checkpoints every --checkpoint-every steps and at the end, and SIGTERM,
  // SIGINT or SIGUSR1 stop the run after the step they land in, with a checkpoint of it. What a
  // restart needs: the networks (with spectral norm's u and v, batch norm's running statistics), their
  // optimisers, the data's and noise's random engine, the time spent.
  const examples::gan_checkpoint state{strategy, gens, discs, g_opts, d_opts, rng, elapsed, before};
  std::optional<dist::preemption_checkpoint<S>> preemption;
  if (!o.checkpoint_dir.empty()) {
    if (!o.resume && dist::checkpoint::directory(o.checkpoint_dir).load_latest())
      throw std::invalid_argument("--checkpoint-dir " + o.checkpoint_dir.string() +
                                  " holds checkpoints of an earlier run: add --resume to continue it, or give "
                                  "another directory");
    preemption.emplace(strategy, o.checkpoint_dir, state.saver(), state.restorer(),
                       dist::preemption_options{.save_every = o.checkpoint_every});
    if (preemption->resumed()) {
      step = preemption->first_step();
      std::printf("resumed from %s at step %lld (%.1f s trained)\n", preemption->restored_from()->string().c_str(),
                  static_cast<long long>(step), before);
    }
  }

  const nn::penalty_options r1{.weight = o.r1, .every = o.r1_every, .global_batch = global};
  const std::int64_t first = step;
  double last_report = elapsed();  // the images/s of a progress line: since the line before
  std::int64_t last_report_step = step;
  bool finite = true;
  std::vector<double> last{0, 0, 0};
  for (; step < o.steps && elapsed() < 60 * o.minutes; ++step) {
    const batch_data b = draw(train_set, global, noise, rng);
    const auto real = strategy.scatter(b.real, pixels);
    const auto real_labels = strategy.scatter(b.real_labels);
    const auto z = strategy.scatter(b.z, static_cast<std::size_t>(noise));
    const auto fake_labels = strategy.scatter(b.fake_labels);
    auto losses = strategy.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl,
            const std::vector<float>& zl, const std::vector<float>& fl, generator<device>& g, discriminator<device>& d,
            dist::optim::adam<float>& og, dist::optim::adam<float>& od) {
          const auto n = static_cast<std::int64_t>(yl.size());
          auto upload = [&](const std::vector<float>& v, const shape& s) {
            return tensor::from_host(s, std::span<const float>(v), r.device());
          };
          const tensor x = upload(xl, shape::nchw(n, 1, side, side));
          tensor one = upload(std::vector<float>{1.0f}, shape{1});
          g.zero_grad();
          d.zero_grad();
          nn::tape t{r};
          const auto y_real = t.constant(upload(yl, shape{n}));
          const auto y_fake = t.constant(upload(fl, shape{n}));
          const auto fake = t(g, t.constant(upload(zl, shape{n, noise})), y_fake);
          // Hinge: D pushes real scores above 1 and fake ones below -1 (the fake detached: D's loss
          // does not train G); G raises D's score of its images (D frozen: G's loss does not train D).
          // Sums over this replica's examples over the global batch: the all-reduced gradients are
          // those of the global batch's mean.
          const float big = 1e30f, per = 1.0f / static_cast<float>(global);
          const auto ones = t.constant(one);
          const auto real_score = t(d, t.constant(x), y_real);
          const auto fake_score = t(d, t.stop_gradient(fake), y_fake);
          const auto d_loss = nn::scale(t,
                                        nn::add(t, nn::sum(t, nn::clamp(t, nn::sub(t, ones, real_score), 0.0f, big)),
                                                nn::sum(t, nn::clamp(t, nn::add(t, ones, fake_score), 0.0f, big))),
                                        per);
          const auto g_loss = nn::scale(t, nn::sum(t, t(d, fake, y_fake, nn::frozen)), -per);
          // R1 on the real images with their classes, every r1_every-th step (a zero constant between).
          const auto penalty = o.r1 > 0 ? nn::r1_penalty(
                                              t, x, [&](auto v) { return t(d, v, y_real); }, r1, step)
                                        : t.constant(tensor{shape{}, r.device()});
          t.backward(nn::add(t, nn::add(t, d_loss, g_loss), penalty));
          r.all_reduce_gradients(g);
          r.all_reduce_gradients(d);
          og.step(r, g);
          od.step(r, d);
          return std::vector<double>{host_values(d_loss.value())[0], host_values(g_loss.value())[0],
                                     host_values(penalty.value())[0]};
        },
        real, real_labels, z, fake_labels, gens, discs, g_opts, d_opts);
    std::vector<double> sums{0, 0, 0};
    for (const auto& v : strategy.local_results(losses))
      for (std::size_t i = 0; i < 3; ++i) sums[i] += v[i];
    for (double v : sums) finite = finite && std::isfinite(v);
    if (sums[2] != 0) last[2] = sums[2];
    last[0] = sums[0], last[1] = sums[1];
    if (step % o.log_every == 0 || step + 1 == o.steps) {
      const double now = elapsed();
      const double images = static_cast<double>((step + 1 - last_report_step) * global);
      std::printf("step %5lld  %6.1f s  %6.1f images/s  D hinge %.4f  G %.4f  R1 %.4f\n", static_cast<long long>(step),
                  now, now > last_report ? images / (now - last_report) : 0.0, last[0], last[1], last[2]);
      std::fflush(stdout);
      last_report = now;
      last_report_step = step + 1;
    }
    if (preemption && preemption->after_step(step)) {
      std::printf("stopped by %s; run again with --resume to continue\n", preemption->describe().c_str());
      return preemption->exit_code();
    }
  }
  if (preemption && step > first) preemption->save(step - 1);
  const double train_seconds = elapsed();
  strategy.verify_mirrored(gens);
  strategy.verify_mirrored(discs);
  const std::int64_t run_steps = step - first;
  std::printf("trained %lld steps of %lld images in %.1f s (%.1f images/s; %lld steps in all)\n",
              static_cast<long long>(run_steps), static_cast<long long>(global), train_seconds - before,
              train_seconds > before ? static_cast<double>(run_steps * global) / (train_seconds - before) : 0.0,
              static_cast<long long>(step));
  if (!finite) {
    std::fprintf(stderr, "conditional_gan: a loss was not finite\n");
    return 1;
  }

  // 1,000 images, 100 per class, from fixed noise: 10 batches of 10 classes x 10 samples (class k in
  // row k), generated by the primary's generator with its batch norms' running statistics.
  std::mt19937_64 eval_rng(12345);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::optional<fmnist::classifier> loaded;
  std::optional<dist::checkpoint::archive> scorer;
  if (fs::exists(o.classifier)) scorer = dist::checkpoint::load(o.classifier);
  std::array<std::int64_t, classes> hits{};
  const std::int64_t per_batch = classes * 10, batches = 10;
  fs::create_directories(o.out_dir);
  const fs::path grid = o.out_dir / "samples.png";
  strategy.run_on_primary(
      [&](auto& r, generator<device>& g) {
        g.set_training(false);
        std::optional<fmnist::classifier_on<device>> clf;
        if (scorer) {
          clf.emplace(fmnist::make_classifier(0, {}, r.device()));
          scorer->get_model("classifier", *clf);
        }
        std::vector<float> labels(static_cast<std::size_t>(per_batch)), z(static_cast<std::size_t>(per_batch * noise));
        for (std::int64_t i = 0; i < per_batch; ++i) labels[static_cast<std::size_t>(i)] = static_cast<float>(i / 10);
        for (std::int64_t k = 0; k < batches; ++k) {
          for (auto& v : z) v = normal(eval_rng);
          nn::tape t{r};
          const auto images =
              g(t, t.constant(tensor::from_host(shape{per_batch, noise}, std::span<const float>(z), r.device())),
                t.constant(tensor::from_host(shape{per_batch}, std::span<const float>(labels), r.device())));
          if (k == 0) {
            const std::vector<float> host = host_values(images.value());
            dist::summary::write_png_grid(grid, dist::tensor<float>{images.shape(), host}, static_cast<int>(classes),
                                          {.range = dist::summary::value_range::minus_one_to_one});
          }
          if (clf) {
            const auto predicted = fmnist::predict(r, *clf, images.value());
            for (std::int64_t i = 0; i < per_batch; ++i)
              if (predicted[static_cast<std::size_t>(i)] == i / 10) ++hits[static_cast<std::size_t>(i / 10)];
          }
        }
        g.set_training(true);
      },
      gens);
  std::printf("wrote %s: a row per class, from T-shirt/top (0) to ankle boot (9)\n", grid.string().c_str());
  if (scorer) {
    std::int64_t total = 0;
    std::string per_class;
    for (std::int64_t k = 0; k < classes; ++k) {
      total += hits[static_cast<std::size_t>(k)];
      char part[64];
      std::snprintf(part, sizeof part, "%s%s %lld", k ? ", " : "",
                    std::string(data::fashion_mnist_classes[static_cast<std::size_t>(k)]).c_str(),
                    static_cast<long long>(hits[static_cast<std::size_t>(k)]));
      per_class += part;
    }
    std::printf("conditional accuracy: %.1f%% of %lld generated images in the class asked for (of 100 per class: %s)\n",
                100.0 * static_cast<double>(total) / static_cast<double>(per_batch * batches),
                static_cast<long long>(per_batch * batches), per_class.c_str());
  } else {
    std::printf(
        "no classifier at %s: the conditional accuracy is skipped (scripts/demo.sh trains one there; or "
        "fmnist_classifier --out FILE, then --classifier FILE)\n",
        o.classifier.string().c_str());
  }
  if (!o.export_dir.empty())
    for (const auto& f : cyclegan::export_network(gens[0], "generator", shape{1, noise + 1}, o.export_dir))
      std::printf("exported %s\n", f.string().c_str());
  return 0;
}

int main(int argc, char** argv) {
  options o;
  try {
    if (!parse(o, argc, argv)) {
      std::fputs(usage, stdout);
      return 0;
    }
    cyclegan::check_export_available(o.export_dir);
    if (!fs::exists(o.data_dir / "train-images-idx3-ubyte.gz") && !fs::exists(o.data_dir / "train-images-idx3-ubyte")) {
      std::printf(
          "conditional_gan: no Fashion-MNIST in %s (Debian: apt install dataset-fashion-mnist; or --data DIR); "
          "skipped\n",
          o.data_dir.string().c_str());
      return 77;
    }
    // The strategy: one line. dist::one_device_strategy<dist::cpu> strategy; trains on one device.
    dist::mirrored_strategy<dist::cpu> strategy{dist::cpu_replicas(o.replicas)};
    return train(strategy, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "conditional_gan: error: %s\n", e.what());
    return 1;
  }
}
