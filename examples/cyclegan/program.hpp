#pragma once
// cyclegan_train as a function: the command line's options, and a run that trains (or evaluates) and
// returns what it did. The program's main parses argv into `settings`; the tests call `run` directly.

#include "report.hpp"
#include "trainer.hpp"

#include <distribute/checkpoint.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace cyclegan {

struct settings {
  std::string strategy = "mirrored";
  int replicas = 2;
  train_options train{};
  int epochs = 1;
  std::int64_t steps = 0;         // 0: epochs x steps per epoch
  std::int64_t stop_at_step = 0;  // stop early (with a checkpoint), keeping the schedule of `steps`
  std::filesystem::path fmnist_dir = std::string(distribute::data::fashion_mnist_default_dir);
  std::filesystem::path data_dir;  // trainA/trainB folders instead of Fashion-MNIST
  int channels = 1, image_size = 28;
  std::size_t train_limit = 0;     // use at most this many training images per domain (tests)
  std::filesystem::path out_dir = "cyclegan_out";
  std::int64_t sample_every = 200;
  int samples = 6;                 // rows of the picture grid
  std::filesystem::path checkpoint_dir;
  std::int64_t checkpoint_every = 500;
  bool resume = false;
  std::filesystem::path classifier;  // fmnist_classifier's checkpoint: scores at the end / --evaluate
  bool evaluate = false;
  std::size_t eval_limit = 0;      // score at most this many test images per direction (0: all)
  std::int64_t verify_every = 0;   // check that mirrored copies are identical every N steps
  bool quiet = false;
};

struct summary {
  std::int64_t steps = 0;          // the step count reached
  std::int64_t steps_run = 0;      // steps run by this call
  double seconds = 0;              // training time of this call (steps only)
  double images_per_s = 0;         // global-batch images per second over this call
  step_losses last{};
  bool finite = true;              // every loss of every step was finite
  std::optional<scores> quality;
  std::vector<std::filesystem::path> pictures;
  std::optional<std::filesystem::path> checkpoint;
};

// The classes other than the target that the translations were given, largest first.
inline std::string elsewhere(const std::array<double, classes>& where, std::int32_t target) {
  std::vector<std::pair<double, std::size_t>> v;
  for (std::size_t k = 0; k < classes; ++k)
    if (static_cast<std::int32_t>(k) != target && where[k] >= 0.005) v.emplace_back(where[k], k);
  std::sort(v.rbegin(), v.rend());
  std::string s;
  for (const auto& [share, k] : v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%s %.1f%%", s.empty() ? "" : ", ", std::string(distribute::data::fashion_mnist_classes[k]).c_str(),
                  100 * share);
    s += buf;
  }
  return s.empty() ? "none" : s;
}

inline void print_scores(const scores& q, const domains& d) {
  std::printf("evaluation on %lld + %lld test images:\n", static_cast<long long>(q.count_a), static_cast<long long>(q.count_b));
  std::printf("  %s -> %s: %.1f%% classified as %s (untranslated: %.1f%%), cycle L1 %.4f; elsewhere: %s\n", d.name_a.c_str(),
              d.name_b.c_str(), 100 * q.a_to_b, d.name_b.c_str(), 100 * q.baseline_a, q.cycle_l1_a,
              elsewhere(q.classes_ab, ankle_boot).c_str());
  std::printf("  %s -> %s: %.1f%% classified as %s (untranslated: %.1f%%), cycle L1 %.4f; elsewhere: %s\n", d.name_b.c_str(),
              d.name_a.c_str(), 100 * q.b_to_a, d.name_a.c_str(), 100 * q.baseline_b, q.cycle_l1_b,
              elsewhere(q.classes_ba, sneaker).c_str());
}

template <distribute::strategy S>
summary run_with(S& strategy, settings st) {
  namespace fs = std::filesystem;
  summary sum;
  domains d = st.data_dir.empty() ? load_fashion_mnist(st.fmnist_dir) : load_folders(st.data_dir, st.channels, st.image_size);
  if (st.train_limit) {
    d.a.resize(std::min(d.a.size(), st.train_limit));
    d.b.resize(std::min(d.b.size(), st.train_limit));
  }
  if (st.eval_limit) {
    d.test_a.resize(std::min(d.test_a.size(), st.eval_limit));
    d.test_b.resize(std::min(d.test_b.size(), st.eval_limit));
  }
  st.train.gen.channels = st.train.disc.channels = d.channels;
  if (!st.classifier.empty() && !st.data_dir.empty())
    throw std::invalid_argument("--classifier scores Fashion-MNIST sneakers and ankle boots; it cannot score --data-dir images");
  const std::int64_t global = static_cast<std::int64_t>(st.train.batch) * strategy.num_replicas_in_sync();
  const std::int64_t per_epoch = static_cast<std::int64_t>(std::min(d.a.size(), d.b.size())) / global;
  if (per_epoch < 1) throw std::invalid_argument("the global batch of " + std::to_string(global) + " is larger than the data");
  st.train.total_steps = st.steps ? st.steps : per_epoch * st.epochs;
  const int epochs = static_cast<int>((st.train.total_steps + per_epoch - 1) / per_epoch);
  trainer<S> tr(strategy, st.train, d.channels, d.height, d.width);

  std::optional<distribute::checkpoint::directory> ckdir;
  if (!st.checkpoint_dir.empty()) ckdir.emplace(st.checkpoint_dir);

  if (st.evaluate) {
    if (!ckdir) throw std::invalid_argument("--evaluate needs --checkpoint-dir (the trained networks)");
    auto ar = ckdir->load_latest();
    if (!ar) throw std::invalid_argument("--evaluate: no checkpoint in " + st.checkpoint_dir.string());
    tr.load_networks(*ar);
    sum.steps = ar->template get<std::int64_t>("step");
  } else if (st.resume && ckdir) {
    if (auto ar = ckdir->load_latest()) {
      tr.load(*ar);
      if (!st.quiet)
        std::printf("resumed from %s at step %lld\n", ckdir->latest()->string().c_str(), static_cast<long long>(tr.steps_done()));
    } else if (!st.quiet) {
      std::printf("no checkpoint in %s: starting from step 0\n", st.checkpoint_dir.string().c_str());
    }
  }

  const int samples = static_cast<int>(std::min<std::size_t>({static_cast<std::size_t>(st.samples), d.test_a.size(), d.test_b.size()}));
  const tensor sample_a = stack(d.test_a, 0, static_cast<std::size_t>(samples), d.channels);
  const tensor sample_b = stack(d.test_b, 0, static_cast<std::size_t>(samples), d.channels);
  auto write_grid = [&](const fs::path& file) {
    const auto t = tr.translate_samples(sample_a, sample_b);
    const auto per = static_cast<std::size_t>(d.channels * d.height * d.width);
    std::vector<std::span<const float>> tiles;
    for (std::size_t i = 0; i < static_cast<std::size_t>(samples); ++i)
      for (const tensor* x : {&sample_a, &t.fake_b, &t.rec_a, &sample_b, &t.fake_a, &t.rec_b})
        tiles.emplace_back(x->data() + i * per, per);
    make_grid(tiles, 6, d.channels, d.height, d.width, d.height <= 32 ? 3 : 1).write_png(file);
    sum.pictures.push_back(file);
  };

  if (!st.evaluate) {
    fs::create_directories(st.out_dir);
    const fs::path csv = st.out_dir / "losses.csv";
    std::vector<csv_row> rows = tr.steps_done() > 0 ? read_csv(csv, tr.steps_done()) : std::vector<csv_row>{};
    const std::int64_t stop = st.stop_at_step ? std::min(st.stop_at_step, st.train.total_steps) : st.train.total_steps;
    if (!st.quiet)
      std::printf("training %s -> %s on %d %s replica(s), placement %s, global batch %lld, %lld steps (%lld per epoch)\n",
                  d.name_a.c_str(), d.name_b.c_str(), strategy.num_replicas_in_sync(), st.strategy.c_str(),
                  name_of(st.train.place), static_cast<long long>(global), static_cast<long long>(st.train.total_steps),
                  static_cast<long long>(per_epoch));
    if (!st.quiet)
      std::printf("generators: %lld parameters each (filters %lld, %d residual blocks); discriminators: %lld (filters %lld, %d layers, %s norm)\n",
                  static_cast<long long>(parameter_count(tr.g_ab().primary())), static_cast<long long>(st.train.gen.filters),
                  st.train.gen.blocks, static_cast<long long>(parameter_count(tr.d_a().primary())),
                  static_cast<long long>(st.train.disc.filters), st.train.disc.layers, name_of(st.train.disc.norm));
    std::fflush(stdout);  // before the progress bar on stderr
    const auto pipeline = make_pipeline(d, static_cast<std::size_t>(global), st.train.seed);
    progress_bar bar(st.train.total_steps, tr.steps_done(), st.quiet);
    double window_images = 0, window_seconds = 0;
    auto save_checkpoint = [&] {
      if (!ckdir) return;
      distribute::checkpoint::archive ar;
      tr.save(ar);
      sum.checkpoint = ckdir->save(tr.steps_done(), ar);
      write_csv(csv, rows);
    };
    while (tr.steps_done() < stop) {
      const std::int64_t epoch = tr.steps_done() / per_epoch;
      std::int64_t skip = tr.steps_done() % per_epoch;  // the data position inside the epoch
      for (auto&& [ba, bb] : pipeline.epoch(static_cast<std::uint64_t>(epoch))) {
        if (skip > 0) {
          --skip;
          continue;
        }
        const tensor a = to_nchw(ba.images, d.channels), b = to_nchw(bb.images, d.channels);
        const double lr = tr.learning_rate(tr.steps_done());
        const auto t0 = std::chrono::steady_clock::now();
        const step_losses l = tr.step(a, b);
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        sum.seconds += dt;
        ++sum.steps_run;
        window_images = 0.9 * window_images + static_cast<double>(global);
        window_seconds = 0.9 * window_seconds + dt;
        for (double v : {l.d_a, l.d_b, l.gan_ab, l.gan_ba, l.cycle, l.identity}) sum.finite = sum.finite && std::isfinite(v);
        sum.last = l;
        const std::int64_t s = tr.steps_done();
        rows.push_back({s, static_cast<int>(epoch), lr, l, window_images / window_seconds});
        bar.update(s, static_cast<int>(epoch), epochs, window_images / window_seconds, l);
        if (st.verify_every && s % st.verify_every == 0) tr.verify_mirrored();
        if (st.sample_every && s % st.sample_every == 0) {
          char name[64];
          std::snprintf(name, sizeof name, "samples_step%06lld.png", static_cast<long long>(s));
          write_grid(st.out_dir / name);
          bar.note("wrote " + (st.out_dir / name).string());
        }
        if (ckdir && st.checkpoint_every && s % st.checkpoint_every == 0 && s < stop) {
          save_checkpoint();
          bar.note("checkpoint " + sum.checkpoint->string());
        }
        if (s >= stop) break;
      }
    }
    save_checkpoint();
    write_csv(csv, rows);
    write_grid(st.out_dir / "samples_final.png");
    plot_losses(rows).write_png(st.out_dir / "losses.png");
    sum.pictures.push_back(st.out_dir / "losses.png");
    sum.images_per_s = sum.seconds > 0 ? static_cast<double>(sum.steps_run * global) / sum.seconds : 0;
    if (!st.quiet)
      std::printf("done: step %lld, %lld steps in %s (%.1f images/s), last losses D %.3f/%.3f G %.3f/%.3f cycle %.3f identity %.3f\n",
                  static_cast<long long>(tr.steps_done()), static_cast<long long>(sum.steps_run), clock_string(sum.seconds).c_str(),
                  sum.images_per_s, sum.last.d_a, sum.last.d_b, sum.last.gan_ab, sum.last.gan_ba, sum.last.cycle, sum.last.identity);
  } else {
    fs::create_directories(st.out_dir);
    write_grid(st.out_dir / "samples_evaluate.png");
  }
  sum.steps = std::max(sum.steps, tr.steps_done());

  if (!st.classifier.empty()) {
    const auto ar = distribute::checkpoint::load(st.classifier);
    auto clf = strategy.mirror([&](auto&) {
      auto c = make_classifier(0);
      ar.get_model("classifier", c);
      return c;
    });
    const tensor ta = stack(d.test_a, 0, d.test_a.size(), d.channels), tb = stack(d.test_b, 0, d.test_b.size(), d.channels);
    sum.quality = evaluate(strategy, tr.g_ab(), tr.g_ba(), clf, ta, tb, sneaker, ankle_boot);
    if (!st.quiet) print_scores(*sum.quality, d);
  } else if (st.evaluate) {
    throw std::invalid_argument("--evaluate needs --classifier (train one with fmnist_classifier)");
  }
  return sum;
}

inline summary run(const settings& st) {
  if (st.strategy == "one_device") {
    distribute::one_device_strategy<distribute::cpu> s;
    return run_with(s, st);
  }
  if (st.strategy == "mirrored") {
    distribute::mirrored_strategy<distribute::cpu> s{distribute::cpu_replicas(st.replicas)};
    return run_with(s, st);
  }
  throw std::invalid_argument("--strategy must be one_device or mirrored, not '" + st.strategy + "'");
}

}  // namespace cyclegan
