#pragma once
// Training and scoring the Fashion-MNIST classifier under any strategy: global batches from the input
// pipeline, split per replica by strategy.distribute, softmax cross-entropy by the loss rule, summed
// gradients, Adam.

#include "classifier.hpp"
#include "data.hpp"
#include "flags.hpp"

#include <distribute/checkpoint.hpp>
#include <distribute/distribute.hpp>

#include <array>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <vector>

namespace cyclegan {

namespace optim = distribute::optim;

struct classifier_options {
  int batch = 32;      // per replica
  int epochs = 2;
  double lr = 1e-3;
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
};

inline const char* classifier_usage =
    "usage: fmnist_classifier [--out FILE] [--epochs N] [--batch N] [--replicas N] [--lr X] [--seed N]\n"
    "                         [--train-limit N] [--fmnist-dir DIR] [--quiet]\n";

// Returns false for --help; throws std::invalid_argument naming the flag, its value and its range.
inline bool parse_classifier_arguments(classifier_settings& st, int argc, const char* const* argv) {
  auto& o = st.options;
  flags::parser p;
  p.path("--out", st.out)
      .integer("--epochs", o.epochs, 1, 10'000)
      .integer("--batch", o.batch, 1, 4096)
      .integer("--replicas", st.replicas, 1, 256)
      .real("--lr", o.lr, 0.0, 1.0, /*lo_open=*/true)
      .integer("--seed", o.seed, std::uint64_t{0}, std::numeric_limits<std::uint64_t>::max())
      .integer("--train-limit", o.train_limit, std::size_t{0}, std::size_t{1} << 40)
      .path("--fmnist-dir", st.dir)
      .toggle("--quiet", o.quiet);
  return p.parse(argc, argv);
}

// Trains a fresh classifier on the given examples and returns the primary's copy.
template <distribute::strategy S>
classifier train_classifier(S& s, const std::vector<example>& train, const classifier_options& o) {
  auto net = s.mirror([&](auto&) { return make_classifier(o.seed); });
  auto opt = s.mirror([&](auto&) { return optim::adam<float>{{.lr = o.lr}}; });
  const std::size_t global = static_cast<std::size_t>(o.batch) * static_cast<std::size_t>(s.num_replicas_in_sync());
  const auto ds = data::from_vector(train).shuffle(train.size(), o.seed).batch(global, data::drop_remainder).map(data::to_float{});
  auto inputs = s.distribute(ds);
  const auto steps = static_cast<std::int64_t>(train.size() / global);
  for (int epoch = 0; epoch < o.epochs; ++epoch) {
    double loss_sum = 0;
    std::int64_t step = 0;
    for (auto& batch : inputs) {  // each loop is the next epoch
      auto losses = s.run([](auto& r, data::batch<float>& local, classifier& c, optim::adam<float>& a) {
        c.zero_grad();
        float value = 0;
        if (!local.empty()) {
          const tensor x = to_nchw(local.images, 1);
          const auto l = softmax_cross_entropy(c.forward(r, x), local.labels, static_cast<std::int64_t>(local.global_size));
          c.backward(r, l.grad);
          value = l.value;
        }
        r.all_reduce_gradients(c);
        a.step(c);
        return value;
      }, batch, net, opt);
      loss_sum += s.reduce(distribute::reduce_op::sum, losses);
      if (!o.quiet && ++step % 200 == 0)
        std::fprintf(stderr, "epoch %d/%d step %lld/%lld loss %.4f\n", epoch + 1, o.epochs, static_cast<long long>(step),
                     static_cast<long long>(steps), loss_sum / static_cast<double>(step));
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
  for (std::size_t k = 0; k < classes; ++k) a.per_class[k] = counts[k] ? static_cast<double>(hits[k]) / static_cast<double>(counts[k]) : 0;
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
