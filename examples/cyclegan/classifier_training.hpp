#pragma once
// Training and scoring the Fashion-MNIST classifier under any strategy: global batches from the input
// pipeline, split per replica by strategy.distribute, nn::softmax_cross_entropy by the global-batch
// loss rule, summed gradients, Adam with a learning rate that decays linearly to zero.

#include "classifier.hpp"
#include "data.hpp"
#include "flags.hpp"

#include <distribute/checkpoint.hpp>
#include <distribute/data/to_tensor.hpp>
#include <distribute/distribute.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <vector>

namespace cyclegan {

namespace optim = distribute::optim;

struct classifier_options {
  int batch = 64;  // per replica
  int epochs = 4;
  double lr = 4e-3;
  double decay_fraction = 1.0;  // the learning rate falls linearly to zero over this last share of the steps
  classifier_shape shape{};
  std::uint64_t seed = 7;
  std::size_t train_limit = 0;  // at most this many training images (0: all 60,000)
  bool quiet = false;
};

// fmnist_classifier's command line.
struct classifier_settings {
  classifier_options options;
  std::filesystem::path out = "fmnist_classifier.dck";
  std::filesystem::path dir = std::string(distribute::data::fashion_mnist_default_dir);
  int replicas = 2;
  bool eval_each_epoch = false;
  std::filesystem::path export_dir;  // also write the network as .safetensors and .onnx (empty: not)
};

inline const char* classifier_usage =
    "usage: fmnist_classifier [--out FILE] [--epochs N] [--batch N] [--replicas N] [--lr X] [--decay-fraction X]\n"
    "                         [--seed N] [--train-limit N] [--fmnist-dir DIR] [--eval-each-epoch] [--export DIR] "
    "[--quiet]\n"
    "  --epochs N          passes over the 60,000 training images (4)\n"
    "  --batch N           examples per replica and step (64)\n"
    "  --lr X              Adam's learning rate at the start (0.004)\n"
    "  --decay-fraction X  the rate falls linearly to zero over this last share of the steps (1: all of them)\n"
    "  --eval-each-epoch   print the test accuracy after every epoch\n"
    "  --export DIR        also write the network as DIR/classifier.safetensors and DIR/classifier.onnx\n";

// Returns false for --help; throws std::invalid_argument naming the flag, its value and its range.
inline bool parse_classifier_arguments(classifier_settings& st, int argc, const char* const* argv) {
  auto& o = st.options;
  flags::parser p;
  p.path("--out", st.out)
      .integer("--epochs", o.epochs, 1, 10'000)
      .integer("--batch", o.batch, 1, 4096)
      .integer("--replicas", st.replicas, 1, 256)
      .real("--lr", o.lr, 0.0, 1.0, /*lo_open=*/true)
      .real("--decay-fraction", o.decay_fraction, 0.0, 1.0)
      .integer("--seed", o.seed, std::uint64_t{0}, std::numeric_limits<std::uint64_t>::max())
      .integer("--train-limit", o.train_limit, std::size_t{0}, std::size_t{1} << 40)
      .path("--fmnist-dir", st.dir)
      .toggle("--eval-each-epoch", st.eval_each_epoch)
      .path("--export", st.export_dir)
      .toggle("--quiet", o.quiet);
  return p.parse(argc, argv);
}

// The learning rate of step `step` (from 0) of `total`: constant, then linear decay to zero over the
// last `decay_fraction` of the steps.
inline double classifier_lr(const classifier_options& o, std::int64_t step, std::int64_t total) {
  const double decay_steps = o.decay_fraction * static_cast<double>(total);
  const double left = static_cast<double>(total - step);
  return decay_steps > 0 && left < decay_steps ? o.lr * left / decay_steps : o.lr;
}

// What one epoch of training gave.
struct classifier_epoch {
  int epoch = 0;                               // from 1
  double loss = 0, accuracy = 0, seconds = 0;  // mean training loss and accuracy (dropout on)
};

// Trains a fresh classifier on the given examples and returns the primary's copy. `on_epoch` (when
// set) sees each epoch's figures and the primary's copy.
template <distribute::strategy S>
classifier train_classifier(S& s, const std::vector<example>& train, const classifier_options& o,
                            const std::function<void(const classifier_epoch&, classifier&)>& on_epoch = {}) {
  auto net = s.mirror([&](auto&) { return make_classifier(o.seed, o.shape); });
  auto opt = s.mirror([&](auto&) { return optim::adam<float>{{.lr = o.lr}}; });
  const std::size_t global = static_cast<std::size_t>(o.batch) * static_cast<std::size_t>(s.num_replicas_in_sync());
  const auto ds = data::from_vector(train).shuffle(train.size(), o.seed).batch(global, data::drop_remainder);
  auto inputs = s.distribute(ds);
  const auto steps = static_cast<std::int64_t>(train.size() / global);
  std::int64_t done = 0;
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    const auto start = std::chrono::steady_clock::now();
    double loss_sum = 0, hits = 0;
    std::int64_t step = 0;
    for (auto& batch : inputs) {  // each loop is the next epoch
      const double lr = classifier_lr(o, done++, steps * o.epochs);
      auto results = s.run(
          [lr](auto& r, data::batch<std::uint8_t>& local, classifier& c, optim::adam<float>& a) {
            c.zero_grad();
            std::vector<double> t{0.0, 0.0};  // this replica's share of the loss, its correct predictions
            if (!local.empty()) {
              const tensor logits = c.forward(r, data::to_tensor(local, data::pixels::symmetric));
              const auto l =
                  nn::softmax_cross_entropy(r, logits, local.labels, static_cast<std::int64_t>(local.global_size));
              c.backward(r, l.grad, nn::no_input_gradient);
              t = {static_cast<double>(l.value), static_cast<double>(nn::accuracy(r, logits, local.labels))};
            }
            r.all_reduce_gradients(c);
            a.set_lr(lr);
            a.step(r, c);
            return t;
          },
          batch, net, opt);
      const std::vector<double> t = s.reduce(distribute::reduce_op::sum, results);
      loss_sum += t[0], hits += t[1];
      if (!o.quiet && ++step % 200 == 0)
        std::fprintf(stderr, "epoch %d/%d step %lld/%lld loss %.4f\n", epoch + 1, o.epochs,
                     static_cast<long long>(step), static_cast<long long>(steps), loss_sum / static_cast<double>(step));
    }
    classifier_epoch e{
        .epoch = epoch + 1,
        .loss = loss_sum / static_cast<double>(std::max<std::int64_t>(1, steps)),
        .accuracy = hits / static_cast<double>(std::max<std::int64_t>(1, steps) * static_cast<std::int64_t>(global)),
        .seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
    if (on_epoch) {
      classifier copy = net.primary();
      on_epoch(e, copy);
    }
  }
  return net.primary();
}

// Accuracy over `test`, and per class.
struct accuracy {
  double overall = 0;
  std::array<double, classes> per_class{};
};

inline accuracy score_classifier(classifier& c, const std::vector<example>& test) {
  auto r = nn::local();
  std::array<std::int64_t, classes> hits{}, counts{};
  std::int64_t total_hits = 0;
  for (std::size_t first = 0; first < test.size(); first += 200) {
    const std::size_t n = std::min<std::size_t>(200, test.size() - first);
    const auto pred = predict(r, c, stack(test, first, n, 1));
    for (std::size_t i = 0; i < n; ++i) {
      const auto y = test[first + i].label;
      ++counts[static_cast<std::size_t>(y)];
      if (pred[i] == y) ++hits[static_cast<std::size_t>(y)], ++total_hits;
    }
  }
  accuracy a;
  a.overall = test.empty() ? 0 : static_cast<double>(total_hits) / static_cast<double>(test.size());
  for (std::size_t k = 0; k < classes; ++k)
    a.per_class[k] = counts[k] ? static_cast<double>(hits[k]) / static_cast<double>(counts[k]) : 0;
  return a;
}

inline std::vector<example> all_examples(const data::idx_dataset& ds, std::size_t limit = 0) {
  std::vector<example> out;
  for (auto&& e : ds.epoch(0)) {
    if (limit && out.size() == limit) break;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace cyclegan
