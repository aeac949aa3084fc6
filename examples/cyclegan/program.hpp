#pragma once
// cyclegan_train as a function: the command line's options, and a run that trains (or evaluates) and
// returns what it did. The program's main parses argv into `settings`; the tests call `run` directly.

#include "export.hpp"
#include "flags.hpp"
#include "report.hpp"
#include "trainer.hpp"

#include <distribute/checkpoint.hpp>
#include <distribute/preemption.hpp>
#include <distribute/summary/writer.hpp>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace cyclegan {

struct settings {
  std::string strategy = "mirrored";
  std::string device = "cpu";  // cpu or cuda
  // What convolutions and matrix products compute in (compute_options::precision): float32, or
  // bfloat16 (GPUs; CPUs with bf16 units). float16 would need loss scaling, which the trainer has not.
  distribute::compute_precision precision = distribute::compute_precision::float32;
  // CPU replicas of more than one thread: fewer threads while other programs keep the cores busy
  // (compute_options::adapt_threads, on by default; the results have the same bits either way).
  bool adapt_threads = true;
  int replicas = 0;  // of the process (under multi_worker, each worker's); 0: the device's default
  train_options train{};
  int epochs = 1;
  std::int64_t steps = 0;         // 0: epochs x steps per epoch
  std::int64_t stop_at_step = 0;  // stop early (with a checkpoint), keeping the schedule of `steps`
  std::filesystem::path fmnist_dir = std::string(distribute::data::fashion_mnist_default_dir);
  std::filesystem::path data_dir;  // trainA/trainB folders instead of Fashion-MNIST
  int channels = 1, image_size = 28;
  std::size_t train_limit = 0;  // use at most this many training images per domain (tests)
  std::filesystem::path out_dir = "cyclegan_out";
  std::int64_t sample_every = 200;
  int samples = 6;  // rows of the picture grid
  std::filesystem::path checkpoint_dir;
  std::int64_t checkpoint_every = 500;
  bool resume = false;
  int preempted_exit_code = 0;       // what the program exits with after a signal stopped it (a checkpoint written)
  std::filesystem::path classifier;  // fmnist_classifier's checkpoint: scores at the end / --evaluate
  bool evaluate = false;
  std::size_t eval_limit = 0;     // score at most this many test images per direction (0: all)
  std::int64_t verify_every = 0;  // check that mirrored copies are identical every N steps
  bool quiet = false;
  std::filesystem::path tensorboard_dir;  // a TensorBoard event file of the run (empty: none)
  std::filesystem::path export_dir;       // the generators as .safetensors and .onnx at the end (empty: none)
};

// What each numeric flag accepts. The parser refuses values outside these ranges, and `run` checks a
// `settings` built in code against the same ones, so a bad value is named before anything divides by
// it or allocates for it.
namespace ranges {
inline constexpr int max_replicas = 256;
inline constexpr int max_batch = 4096;  // per replica
inline constexpr int max_epochs = 1'000'000;
inline constexpr std::int64_t max_steps = 1'000'000'000'000;
inline constexpr std::int64_t max_filters = 1024;
inline constexpr int max_blocks = 64, max_d_layers = 8;
inline constexpr int min_image_size = 8, max_image_size = 1024;
inline constexpr int max_samples = 64;
inline constexpr std::size_t max_pool = 100'000, max_count = std::size_t{1} << 40;
inline constexpr double max_lr = 1.0, max_lambda = 1e4;
}  // namespace ranges

inline const char* usage = R"(usage: cyclegan_train [flags]

strategy
  --strategy one_device|mirrored|multi_worker   where the step runs (default mirrored); multi_worker:
                                   one worker per process of `mpirun -np K` or `srun -n K` (this
                                   build must have MPI); worker 0 prints, writes pictures and checkpoints
  --device cpu|cuda                where the replicas compute (default cpu); cuda: one_device on cuda:0,
                                   mirrored over --replicas replicas dealt round-robin over the visible
                                   GPUs (one per GPU: NCCL; more replicas than GPUs: logical replicas
                                   sharing a GPU), multi_worker with one GPU per worker, the node-local
                                   rank's (NCCL; this build needs MPI)
  --replicas N                     replicas of mirrored, or of each worker under multi_worker (default:
                                   2 CPU replicas; every visible GPU under mirrored --device cuda)
  --placement full|discriminator_only|conditional   selective mirroring (default full)
  --mirror-threshold N             conditional: mirror when the global batch is >= N (default 16)
model
  --filters N --blocks N           generator filters (64 in the paper) and residual blocks (9) (default 16, 3)
  --d-filters N --d-layers N       discriminator filters (64) and stride-2 layers (3) (default 16, 2)
  --norm instance|batch|sync_batch the discriminator's normalisation (default instance)
training
  --batch N                        per-replica batch; the global batch is N x all replicas (default 4)
  --epochs N | --steps N           length of the run (default 1 epoch); the lr decays over the last half
  --decay-fraction F               share of the run with linear lr decay (default 0.5)
  --lr X                           Adam learning rate (default 2e-4), betas (0.5, 0.999)
  --scale-lr --warmup-steps N      lr x replicas, reached by a linear warm-up
  --lambda-cycle X --lambda-identity X   loss weights (default 10, 0.5 x cycle)
  --pool-size N                    image pool (default 50)
  --seed N                         initialisation, data order and pool (default 1)
  --overlap on|off                 all-reduce each network's gradients while its backward runs
                                   (default on; off: after it; the same results either way)
  --precision float32|bf16         what convolutions and products compute in (default float32; bf16 on
                                   GPUs and on CPUs with bf16 units, float32 master weights)
  --gradient-compression none|bfloat16
                                   what the gradients travel as between replicas (default none;
                                   bfloat16: half the bytes, bfloat16's precision)
  --graphs on|off                  --device cuda: replay each network's forward and backward as CUDA
                                   graphs once captured (default off; the same results either way)
  --adapt-threads on|off           CPU replicas of several threads (one_device): run fewer while other
                                   programs keep the cores busy (default on: a steady speed; the same
                                   results either way)
data
  --fmnist-dir DIR                 Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
  --data-dir DIR                   DIR/trainA and DIR/trainB image folders instead (testA/testB optional)
  --channels N --image-size N      for --data-dir (default 1, 28)
  --train-limit N                  use at most N training images per domain
output
  --out DIR                        pictures, losses.csv and losses.png (default cyclegan_out)
  --sample-every N --samples N     a picture grid every N steps (default 200), N rows (default 6)
  --checkpoint-dir DIR --checkpoint-every N   checkpoints (default every 500 steps and at the end)
  --resume                         continue from the latest checkpoint in --checkpoint-dir
                                   With --checkpoint-dir, SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 to any
                                   worker stops every worker after the same step with a checkpoint of
                                   it; --resume then continues from that step
  --preempted-exit-code N          the exit code after such a stop (default 0)
  --stop-at-step N                 stop early at step N (the schedule still spans the whole run)
  --classifier FILE                fmnist_classifier's checkpoint: score translations at the end
  --evaluate                       only score the latest checkpoint (needs --classifier)
  --eval-limit N                   score at most N test images per direction
  --verify-every N                 check every N steps that mirrored copies are identical
  --tensorboard DIR                also write the losses, learning rate, images/s, picture grids and
                                   scores as a TensorBoard event file in DIR (default: none);
                                   view with `tensorboard --logdir DIR`
  --export DIR                     at the end, write each generator as DIR/g_ab.safetensors and .onnx,
                                   DIR/g_ba.* (PyTorch's state_dict names; docs/interop.md)
  --quiet                          no progress output
)";

// Parses cyclegan_train's command line into `st`. Returns false for --help (the caller prints
// `usage`); throws std::invalid_argument naming the flag, its value and what it accepts.
inline bool parse_arguments(settings& st, int argc, const char* const* argv) {
  using namespace ranges;
  auto& t = st.train;
  flags::parser p;
  p.choice("--strategy", {"one_device", "mirrored", "multi_worker"}, [&](const std::string& v) { st.strategy = v; })
      .choice("--device", {"cpu", "cuda"}, [&](const std::string& v) { st.device = v; })
      .integer("--replicas", st.replicas, 1, max_replicas)
      .choice("--placement", {"full", "discriminator_only", "conditional"},
              [&](const std::string& v) { t.place = parse_placement(v); })
      .integer("--mirror-threshold", t.mirror_threshold, std::size_t{0}, max_count)
      .integer("--filters", t.gen.filters, std::int64_t{1}, max_filters)
      .integer("--blocks", t.gen.blocks, 0, max_blocks)
      .integer("--d-filters", t.disc.filters, std::int64_t{1}, max_filters)
      .integer("--d-layers", t.disc.layers, 1, max_d_layers)
      .choice("--norm", {"instance", "batch", "sync_batch"}, [&](const std::string& v) { t.disc.norm = parse_norm(v); })
      .integer("--batch", t.batch, 1, max_batch)
      .integer("--epochs", st.epochs, 1, max_epochs)
      .integer("--steps", st.steps, std::int64_t{0}, max_steps)
      .real("--decay-fraction", t.decay_fraction, 0.0, 1.0)
      .real("--lr", t.lr, 0.0, max_lr, /*lo_open=*/true)
      .toggle("--scale-lr", t.scale_lr)
      .integer("--warmup-steps", t.warmup_steps, std::int64_t{0}, max_steps)
      .real("--lambda-cycle", t.lambda_cycle, 0.0, max_lambda)
      .real("--lambda-identity", t.lambda_identity, 0.0, max_lambda)
      .integer("--pool-size", t.pool_size, std::size_t{0}, max_pool)
      .integer("--seed", t.seed, std::uint64_t{0}, std::numeric_limits<std::uint64_t>::max())
      .choice("--overlap", {"on", "off"}, [&](const std::string& v) { t.overlap = v == "on"; })
      .choice("--precision", {"float32", "bf16"},
              [&](const std::string& v) {
                st.precision =
                    v == "bf16" ? distribute::compute_precision::bfloat16 : distribute::compute_precision::float32;
              })
      .choice("--gradient-compression", {"none", "bfloat16"},
              [&](const std::string& v) {
                t.compression =
                    v == "bfloat16" ? dist::gradient_compression::bfloat16 : dist::gradient_compression::none;
              })
      .choice("--graphs", {"on", "off"}, [&](const std::string& v) { t.graphs = v == "on"; })
      .choice("--adapt-threads", {"on", "off"}, [&](const std::string& v) { st.adapt_threads = v == "on"; })
      .path("--fmnist-dir", st.fmnist_dir)
      .path("--data-dir", st.data_dir)
      .integer("--channels", st.channels, 1, 4)
      .integer("--image-size", st.image_size, min_image_size, max_image_size)
      .integer("--train-limit", st.train_limit, std::size_t{0}, max_count)
      .path("--out", st.out_dir)
      .integer("--sample-every", st.sample_every, std::int64_t{0}, max_steps)
      .integer("--samples", st.samples, 1, max_samples)
      .path("--checkpoint-dir", st.checkpoint_dir)
      .integer("--checkpoint-every", st.checkpoint_every, std::int64_t{0}, max_steps)
      .toggle("--resume", st.resume)
      .integer("--preempted-exit-code", st.preempted_exit_code, 0, 255)
      .integer("--stop-at-step", st.stop_at_step, std::int64_t{0}, max_steps)
      .path("--classifier", st.classifier)
      .toggle("--evaluate", st.evaluate)
      .integer("--eval-limit", st.eval_limit, std::size_t{0}, max_count)
      .integer("--verify-every", st.verify_every, std::int64_t{0}, max_steps)
      .path("--tensorboard", st.tensorboard_dir)
      .path("--export", st.export_dir)
      .toggle("--quiet", st.quiet);
  if (!p.parse(argc, argv)) return false;
  if (st.resume && st.checkpoint_dir.empty()) throw std::invalid_argument("--resume needs --checkpoint-dir");
  return true;
}

namespace detail {
template <class T>
void check(const char* flag, T value, T lo, T hi) {
  if (value < lo || value > hi) flags::out_of_range(flag, std::to_string(value), flags::integer_range(lo, hi));
}
inline void check_real(const char* flag, double value, double lo, double hi, bool lo_open = false) {
  if (!std::isfinite(value) || value < lo || value > hi || (lo_open && value == lo))
    flags::out_of_range(flag, flags::number(value), flags::real_range(lo, hi, lo_open));
}
}  // namespace detail

// The same ranges for settings built in code (the tests, other programs).
inline void validate(const settings& st) {
  using namespace ranges;
  using detail::check;
  const auto& t = st.train;
  if (st.strategy != "one_device" && st.strategy != "mirrored" && st.strategy != "multi_worker")
    throw std::invalid_argument("--strategy must be one_device, mirrored or multi_worker, not '" + st.strategy + "'");
  if (st.device != "cpu" && st.device != "cuda")
    throw std::invalid_argument("--device must be cpu or cuda, not '" + st.device + "'");
  if (t.graphs && st.device != "cuda")
    throw std::invalid_argument("--graphs on needs --device cuda (CUDA graphs replay GPU work)");
  if (st.precision == distribute::compute_precision::float16)
    throw std::invalid_argument("--precision float16 needs loss scaling, which this trainer has not; use bf16");
  check("--replicas", st.replicas, 0, max_replicas);  // 0: the default
  check("--filters", t.gen.filters, std::int64_t{1}, max_filters);
  check("--blocks", t.gen.blocks, 0, max_blocks);
  check("--d-filters", t.disc.filters, std::int64_t{1}, max_filters);
  check("--d-layers", t.disc.layers, 1, max_d_layers);
  check("--batch", t.batch, 1, max_batch);
  check("--epochs", st.epochs, 1, max_epochs);
  check("--steps", st.steps, std::int64_t{0}, max_steps);
  detail::check_real("--decay-fraction", t.decay_fraction, 0.0, 1.0);
  detail::check_real("--lr", t.lr, 0.0, max_lr, true);
  check("--warmup-steps", t.warmup_steps, std::int64_t{0}, max_steps);
  detail::check_real("--lambda-cycle", t.lambda_cycle, 0.0, max_lambda);
  detail::check_real("--lambda-identity", t.lambda_identity, 0.0, max_lambda);
  check("--pool-size", t.pool_size, std::size_t{0}, max_pool);
  check("--channels", st.channels, 1, 4);
  check("--image-size", st.image_size, min_image_size, max_image_size);
  check("--sample-every", st.sample_every, std::int64_t{0}, max_steps);
  check("--samples", st.samples, 1, max_samples);
  check("--checkpoint-every", st.checkpoint_every, std::int64_t{0}, max_steps);
  check("--stop-at-step", st.stop_at_step, std::int64_t{0}, max_steps);
  check("--preempted-exit-code", st.preempted_exit_code, 0, 255);
  check("--verify-every", st.verify_every, std::int64_t{0}, max_steps);
  if (st.resume && st.checkpoint_dir.empty()) throw std::invalid_argument("--resume needs --checkpoint-dir");
}

// Images the networks can take: the generator halves the size twice and doubles it back (a multiple
// of 4; reflection padding of the residual blocks needs at least 2 at the bottom, so 8), and the
// discriminator halves it --d-layers times and then needs 3 for its two 4x4 stride-1 layers.
inline void check_image_shape(int height, int width, int d_layers, const std::string& source) {
  for (int size : {height, width}) {
    int bottom = size;
    for (int i = 0; i < d_layers; ++i) bottom /= 2;
    if (size % 4 != 0 || size < ranges::min_image_size || size > ranges::max_image_size || bottom < 3)
      throw std::invalid_argument(source + ": images of " + std::to_string(height) + "x" + std::to_string(width) +
                                  " pixels do not fit the networks (accepted: sides that are multiples of 4 from " +
                                  std::to_string(std::max(ranges::min_image_size, 3 << d_layers)) + " to " +
                                  std::to_string(ranges::max_image_size) + " with --d-layers " +
                                  std::to_string(d_layers) + ")");
  }
}

struct summary {
  std::int64_t steps = 0;           // the step count reached
  std::int64_t steps_run = 0;       // steps run by this call
  double seconds = 0;               // training time of this call (steps only)
  double images_per_s = 0;          // global-batch images per second over this call
  distribute::step_timings time{};  // where the training loop's time went (compute, collectives, input, checkpoints)
  step_losses last{};
  bool finite = true;  // every loss of every step was finite
  std::optional<scores> quality;
  std::vector<std::filesystem::path> pictures;
  std::optional<std::filesystem::path> checkpoint;
  std::optional<std::string> preempted;         // a signal stopped the run after a checkpoint: which, after which step
  bool chief = true;                            // this process printed and wrote the files (worker 0)
  std::vector<std::filesystem::path> exported;  // --export's files
  distribute::compute_options engine{};         // the engine options the run set on its strategy
};

// A multi-worker job failed: every worker that saw the failure has printed it (one line) and the job
// is being aborted; the program only has to exit.
struct job_failed : std::runtime_error {
  using std::runtime_error::runtime_error;
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
    std::snprintf(buf, sizeof buf, "%s%s %.1f%%", s.empty() ? "" : ", ",
                  std::string(distribute::data::fashion_mnist_classes[k]).c_str(), 100 * share);
    s += buf;
  }
  return s.empty() ? "none" : s;
}

inline void print_scores(const scores& q, const domains& d) {
  std::printf("evaluation on %lld + %lld test images:\n", static_cast<long long>(q.count_a),
              static_cast<long long>(q.count_b));
  std::printf("  %s -> %s: %.1f%% classified as %s (untranslated: %.1f%%), cycle L1 %.4f; elsewhere: %s\n",
              d.name_a.c_str(), d.name_b.c_str(), 100 * q.a_to_b, d.name_b.c_str(), 100 * q.baseline_a, q.cycle_l1_a,
              elsewhere(q.classes_ab, ankle_boot).c_str());
  std::printf("  %s -> %s: %.1f%% classified as %s (untranslated: %.1f%%), cycle L1 %.4f; elsewhere: %s\n",
              d.name_b.c_str(), d.name_a.c_str(), 100 * q.b_to_a, d.name_a.c_str(), 100 * q.baseline_b, q.cycle_l1_b,
              elsewhere(q.classes_ba, sneaker).c_str());
}

// --replicas on a CPU: 2 unless given.
inline int cpu_replicas(const settings& st) { return st.replicas > 0 ? st.replicas : 2; }
inline const char* device_word(const settings& st) { return st.device == "cuda" ? "GPU" : "CPU"; }

template <distribute::strategy S>
summary run_with(S& strategy, settings st) {
  namespace fs = std::filesystem;
  summary sum;
  // Every worker trains; the chief alone prints and writes (the others run the same steps quietly).
  sum.chief = strategy.is_chief();
  if (!sum.chief) st.quiet = true;
  // Before any data is read: an engine that cannot compute in this precision says why here.
  sum.engine = {.adapt_threads = st.adapt_threads, .precision = st.precision};
  if (st.precision != distribute::compute_precision::float32 || !st.adapt_threads)
    strategy.set_compute_options(sum.engine);
  domains d =
      st.data_dir.empty() ? load_fashion_mnist(st.fmnist_dir) : load_folders(st.data_dir, st.channels, st.image_size);
  if (st.train_limit) {
    d.a.resize(std::min(d.a.size(), st.train_limit));
    d.b.resize(std::min(d.b.size(), st.train_limit));
  }
  if (st.eval_limit) {
    d.test_a.resize(std::min(d.test_a.size(), st.eval_limit));
    d.test_b.resize(std::min(d.test_b.size(), st.eval_limit));
  }
  check_image_shape(
      d.height, d.width, st.train.disc.layers,
      st.data_dir.empty() ? "--fmnist-dir " + st.fmnist_dir.string() : "--image-size " + std::to_string(st.image_size));
  st.train.gen.channels = st.train.disc.channels = d.channels;
  check_export_available(st.export_dir);
  if (!st.classifier.empty() && !st.data_dir.empty())
    throw std::invalid_argument(
        "--classifier scores Fashion-MNIST sneakers and ankle boots; it cannot score --data-dir images");
  const std::int64_t global = static_cast<std::int64_t>(st.train.batch) * strategy.num_replicas_in_sync();
  const std::int64_t per_epoch = static_cast<std::int64_t>(std::min(d.a.size(), d.b.size())) / global;
  if (per_epoch < 1)
    throw std::invalid_argument("the global batch of " + std::to_string(global) + " is larger than the data");
  st.train.total_steps = st.steps ? st.steps : per_epoch * st.epochs;
  const int epochs = static_cast<int>((st.train.total_steps + per_epoch - 1) / per_epoch);
  trainer<S> tr(strategy, st.train, d.channels, d.height, d.width);

  std::optional<distribute::checkpoint::directory> ckdir;
  if (!st.checkpoint_dir.empty()) ckdir.emplace(st.checkpoint_dir);
  // What a run killed before its renames left behind: half-written checkpoints, CSVs and pictures.
  if (ckdir && !st.evaluate && sum.chief) ckdir->remove_stale_temporaries();
  if (!st.evaluate && sum.chief) distribute::checkpoint::remove_stale_temporaries(st.out_dir);

  // The newest checkpoint that loads, with a note on stderr for each newer one that did not. If
  // checkpoints are there and none loads, this throws checkpoint::no_loadable_checkpoint naming each
  // and why: the run stops rather than start over from step 0 in place of the one it was to resume.
  auto latest = [&] {
    std::vector<distribute::checkpoint::directory::skipped_file> skipped;
    auto found = ckdir->load_latest_with_path(&skipped);
    if (sum.chief)
      for (const auto& s : skipped)
        std::fprintf(stderr, "cyclegan_train: skipped a checkpoint that does not load: %s\n", s.reason.c_str());
    if (found) {
      if (const auto step = found->second.template get<std::int64_t>("step"); step < 0)
        throw distribute::checkpoint::checkpoint_error("distribute: " + found->first.string() + ": the saved step " +
                                                       std::to_string(step) + " is negative");
    }
    return found;
  };

  if (st.evaluate) {
    if (!ckdir) throw std::invalid_argument("--evaluate needs --checkpoint-dir (the trained networks)");
    auto found = latest();
    if (!found) throw std::invalid_argument("--evaluate: no checkpoint in " + st.checkpoint_dir.string());
    tr.load_networks(found->second);
    sum.steps = found->second.template get<std::int64_t>("step");
  } else if (st.resume && ckdir) {
    if (auto found = latest()) {
      tr.load(found->second);
      if (!st.quiet)
        std::printf("resumed from %s at step %lld\n", found->first.string().c_str(),
                    static_cast<long long>(tr.steps_done()));
    } else if (!st.quiet) {
      std::printf("no checkpoint in %s: starting from step 0\n", st.checkpoint_dir.string().c_str());
    }
  }
  // Every worker reads the checkpoint directory itself (a filesystem they all see): they must have
  // found the same step, or their steps would pair the wrong data and collectives.
  if (strategy.num_workers() > 1) {
    const std::int64_t mine = st.evaluate ? sum.steps : tr.steps_done();
    const auto at = strategy.values_from_function([&](int) { return mine; });
    const auto lo = strategy.reduce(distribute::reduce_op::min, at),
               hi = strategy.reduce(distribute::reduce_op::max, at);
    if (lo != hi)
      throw std::runtime_error("the workers found different checkpoints in " + st.checkpoint_dir.string() + " (steps " +
                               std::to_string(lo) + " to " + std::to_string(hi) +
                               "); under multi_worker --checkpoint-dir must "
                               "be on a filesystem every worker sees");
  }

  const int samples =
      static_cast<int>(std::min<std::size_t>({static_cast<std::size_t>(st.samples), d.test_a.size(), d.test_b.size()}));
  const tensor sample_a = stack(d.test_a, 0, static_cast<std::size_t>(samples), d.channels);
  const tensor sample_b = stack(d.test_b, 0, static_cast<std::size_t>(samples), d.channels);
  // The TensorBoard event file: the chief's alone (every worker computes the same values).
  distribute::summary::writer board = sum.chief && !st.tensorboard_dir.empty()
                                          ? distribute::summary::writer(st.tensorboard_dir)
                                          : distribute::summary::writer::disabled();
  std::int64_t board_grid_step = -1;  // the step of the last grid written to it
  auto write_grid = [&](const fs::path& file, std::int64_t step) {
    if (!sum.chief) return;
    const auto t = tr.translate_samples(sample_a, sample_b);
    const auto per = static_cast<std::size_t>(d.channels * d.height * d.width);
    std::vector<std::span<const float>> tiles;
    for (std::size_t i = 0; i < static_cast<std::size_t>(samples); ++i)
      for (const tensor* x : {&sample_a, &t.fake_b, &t.rec_a, &sample_b, &t.fake_a, &t.rec_b})
        tiles.emplace_back(x->data() + i * per, per);
    const image grid = make_grid(tiles, 6, d.channels, d.height, d.width, d.height <= 32 ? 3 : 1);
    grid.write_png(file);  // atomically
    sum.pictures.push_back(file);
    if (step != board_grid_step) board.image("samples", step, grid.height, grid.width, 3, grid.rgb.data());
    board_grid_step = step;
  };

  if (!st.evaluate) {
    if (sum.chief) fs::create_directories(st.out_dir);
    const fs::path csv = st.out_dir / "losses.csv";
    std::vector<csv_row> rows =
        tr.steps_done() > 0 && sum.chief ? read_csv(csv, tr.steps_done()) : std::vector<csv_row>{};
    if (sum.chief && tr.steps_done() > 0 && !continuous(rows, tr.steps_done()))
      std::fprintf(stderr, "cyclegan_train: %s does not hold every step up to %lld; its rows are kept as they are\n",
                   csv.string().c_str(), static_cast<long long>(tr.steps_done()));
    const std::int64_t stop = st.stop_at_step ? std::min(st.stop_at_step, st.train.total_steps) : st.train.total_steps;
    if (!st.quiet)
      std::printf(
          "training %s -> %s on %d %s replica(s) (%s), placement %s, global batch %lld, %lld steps (%lld per epoch)\n",
          d.name_a.c_str(), d.name_b.c_str(), strategy.num_replicas_in_sync(), st.strategy.c_str(), device_word(st),
          name_of(st.train.place), static_cast<long long>(global), static_cast<long long>(st.train.total_steps),
          static_cast<long long>(per_epoch));
    if (!st.quiet && st.precision != distribute::compute_precision::float32)
      std::printf("convolutions and products in %s\n", std::string(distribute::to_string(st.precision)).c_str());
    if (!st.quiet && st.train.compression != dist::gradient_compression::none)
      std::printf("gradients all-reduced as %s\n", std::string(dist::to_string(st.train.compression)).c_str());
    if (!st.quiet)
      std::printf(
          "generators: %lld parameters each (filters %lld, %d residual blocks); discriminators: %lld (filters %lld, %d "
          "layers, %s norm)\n",
          static_cast<long long>(parameter_count(tr.g_ab().primary())), static_cast<long long>(st.train.gen.filters),
          st.train.gen.blocks, static_cast<long long>(parameter_count(tr.d_a().primary())),
          static_cast<long long>(st.train.disc.filters), st.train.disc.layers, name_of(st.train.disc.norm));
    std::fflush(stdout);  // before the progress bar on stderr
    // What ran, beside the curves (TensorBoard's Text tab).
    std::string run_line = d.name_a + " -> " + d.name_b + " on " + std::to_string(strategy.num_replicas_in_sync()) +
                           " " + st.strategy + " replica(s) (" + device_word(st) + "), placement " +
                           name_of(st.train.place) + ", global batch " + std::to_string(global) + ", " +
                           std::to_string(st.train.total_steps) + " steps";
    if (tr.steps_done() > 0) run_line += ", resumed at step " + std::to_string(tr.steps_done());
    board.text("run", run_line, tr.steps_done());
    const auto pipeline = make_pipeline(d, static_cast<std::size_t>(global), st.train.seed);
    progress_bar bar(st.train.total_steps, tr.steps_done(), st.quiet);
    double window_images = 0, window_seconds = 0;
    // Where the time goes, measured by the strategy: each step's part (from the end of one step to
    // the end of the next: the input wait, the step, and the last step's pictures and checkpoint),
    // and a window that decays like the images/s.
    const distribute::step_timings loop_start = strategy.timings();
    distribute::step_timings last_timings = loop_start, window_time{};
    // The CSV first, then the checkpoint, each written atomically: whenever a checkpoint of step s
    // exists, the CSV holds every row up to s, so a run resumed from any checkpoint keeps its whole
    // history (rows after the checkpoint are dropped on resume and written again).
    auto save_checkpoint = [&] {
      if (!ckdir || !sum.chief) return;
      write_csv(csv, rows);
      distribute::checkpoint::archive ar;
      tr.save(ar);
      sum.checkpoint = ckdir->save(tr.steps_done(), ar);
    };
    // With checkpoints, a signal to any worker stops every worker after the same step, with a
    // checkpoint of it (distribute::preemption_watch; one all-reduce of one integer a step across
    // processes, none in one).
    std::optional<distribute::preemption_watch<S>> preemption;
    if (ckdir) preemption.emplace(strategy);
    while (tr.steps_done() < stop && !sum.preempted) {
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
        const distribute::step_timings now = strategy.timings(), part = now - last_timings;
        last_timings = now;
        window_time = decayed(window_time, 0.9) + part;
        sum.seconds += dt;
        ++sum.steps_run;
        window_images = 0.9 * window_images + static_cast<double>(global);
        window_seconds = 0.9 * window_seconds + dt;
        for (double v : {l.d_a, l.d_b, l.gan_ab, l.gan_ba, l.cycle, l.identity})
          sum.finite = sum.finite && std::isfinite(v);
        sum.last = l;
        const std::int64_t s = tr.steps_done();
        rows.push_back({s, static_cast<int>(epoch), lr, l, window_images / window_seconds});
        // The CSV's columns, as curves.
        for (const auto& [tag, v] : std::initializer_list<std::pair<const char*, double>>{
                 {"loss/d_a", l.d_a},
                 {"loss/d_b", l.d_b},
                 {"loss/gan_ab", l.gan_ab},
                 {"loss/gan_ba", l.gan_ba},
                 {"loss/cycle", l.cycle},
                 {"loss/identity", l.identity},
                 {"train/lr", lr},
                 {"train/images_per_s", window_images / window_seconds},
                 {"time/compute_ms", 1e3 * part.compute},
                 {"time/collective_ms", 1e3 * part.collective},
                 {"time/input_wait_ms", 1e3 * part.input_wait},
                 {"time/checkpoint_ms", 1e3 * part.checkpoint},
                 {"time/other_ms", 1e3 * part.other()}})
          board.scalar(tag, v, s);
        bar.update(s, static_cast<int>(epoch), epochs, window_images / window_seconds, l, window_time);
        if (st.verify_every && s % st.verify_every == 0) tr.verify_mirrored();
        if (st.sample_every && s % st.sample_every == 0) {
          char name[64];
          std::snprintf(name, sizeof name, "samples_step%06lld.png", static_cast<long long>(s));
          write_grid(st.out_dir / name, s);
          if (sum.chief) bar.note("wrote " + (st.out_dir / name).string());
        }
        if (preemption && preemption->stop_requested()) {
          board.flush();
          save_checkpoint();
          sum.preempted = (preemption->signal() ? distribute::signal_name(preemption->signal())
                                                : std::string("a signal to another worker")) +
                          " after step " + std::to_string(s);
          break;
        }
        if (ckdir && st.checkpoint_every && s % st.checkpoint_every == 0 && s < stop) {
          board.flush();
          save_checkpoint();
          if (sum.chief) bar.note("checkpoint " + sum.checkpoint->string());
        }
        if (s >= stop) break;
      }
    }
    if (sum.preempted) {
      // Stopped on purpose: the checkpoint is written; the rest (final pictures, scores) waits for the
      // run that continues from it.
      if (!st.quiet && sum.chief)
        std::printf("stopped by %s: checkpoint %s; run again with --resume to continue from it\n",
                    sum.preempted->c_str(),
                    sum.checkpoint ? sum.checkpoint->string().c_str() : st.checkpoint_dir.string().c_str());
      sum.steps = tr.steps_done();
      sum.time = strategy.timings() - loop_start;
      return sum;
    }
    if (ckdir) save_checkpoint();
    else if (sum.chief) write_csv(csv, rows);
    sum.time = strategy.timings() - loop_start;
    write_grid(st.out_dir / "samples_final.png", tr.steps_done());
    if (sum.chief) {
      plot_losses(rows).write_png(st.out_dir / "losses.png");
      sum.pictures.push_back(st.out_dir / "losses.png");
    }
    sum.images_per_s = sum.seconds > 0 ? static_cast<double>(sum.steps_run * global) / sum.seconds : 0;
    if (!st.quiet)
      std::printf(
          "done: step %lld, %lld steps in %s (%.1f images/s), last losses D %.3f/%.3f G %.3f/%.3f cycle %.3f identity "
          "%.3f\n",
          static_cast<long long>(tr.steps_done()), static_cast<long long>(sum.steps_run),
          clock_string(sum.seconds).c_str(), sum.images_per_s, sum.last.d_a, sum.last.d_b, sum.last.gan_ab,
          sum.last.gan_ba, sum.last.cycle, sum.last.identity);
    if (!st.quiet && sum.steps_run > 0) std::printf("time: %s\n", time_breakdown(sum.time).c_str());
    if (const auto graphs = tr.graph_status(); !st.quiet && !graphs.empty() && sum.chief)
      std::printf("CUDA graphs: %s\n", graphs.c_str());
  } else {
    if (sum.chief) fs::create_directories(st.out_dir);
    write_grid(st.out_dir / "samples_evaluate.png", sum.steps);
  }
  sum.steps = std::max(sum.steps, tr.steps_done());
  if (!st.export_dir.empty() && sum.chief) {
    const auto input = distribute::shape::nchw(1, d.channels, d.height, d.width);
    for (const auto& f : export_network(tr.g_ab().primary(), "g_ab", input, st.export_dir)) sum.exported.push_back(f);
    for (const auto& f : export_network(tr.g_ba().primary(), "g_ba", input, st.export_dir)) sum.exported.push_back(f);
    if (!st.quiet)
      for (const auto& f : sum.exported) std::printf("exported %s\n", f.string().c_str());
  }

  if (!st.classifier.empty()) {
    const auto ar = distribute::checkpoint::load(st.classifier);
    auto clf = strategy.mirror([&](auto& device) {
      auto c = make_classifier(0, {}, device);
      ar.get_model("classifier", c);
      return c;
    });
    const tensor ta = stack(d.test_a, 0, d.test_a.size(), d.channels),
                 tb = stack(d.test_b, 0, d.test_b.size(), d.channels);
    sum.quality = evaluate(strategy, tr.g_ab(), tr.g_ba(), clf, ta, tb, sneaker, ankle_boot);
    if (!st.quiet) print_scores(*sum.quality, d);
    const auto& q = *sum.quality;
    for (const auto& [tag, v] :
         std::initializer_list<std::pair<const char*, double>>{{"quality/a_to_b", q.a_to_b},
                                                               {"quality/b_to_a", q.b_to_a},
                                                               {"quality/cycle_l1_a", q.cycle_l1_a},
                                                               {"quality/cycle_l1_b", q.cycle_l1_b}})
      board.scalar(tag, v, sum.steps);
  } else if (st.evaluate) {
    throw std::invalid_argument("--evaluate needs --classifier (train one with fmnist_classifier)");
  }
  return sum;
}

// The run on GPU replicas, where the executable has one: cuda_run.cu, compiled by nvcc into
// cyclegan_train in builds with CUDA, sets it before main. cyclegan_train_cpu is the same program
// without it (what scripts/demo.sh builds, so that a CPU run never waits for nvcc).
inline summary (*run_on_cuda)(const settings&) = nullptr;

inline summary run(const settings& st) {
  validate(st);
  if (st.device == "cuda") {
    if (!run_on_cuda)
      throw std::invalid_argument(
          "--device cuda: this executable has no CUDA side (cyclegan_train has one where the build found "
          "nvcc and the CUDA toolkit; cyclegan_train_cpu never has)");
    return run_on_cuda(st);
  }
  if (st.strategy == "one_device") {
    distribute::one_device_strategy<distribute::cpu> s;
    return run_with(s, st);
  }
  if (st.strategy == "mirrored") {
    distribute::mirrored_strategy<distribute::cpu> s{distribute::cpu_replicas(cpu_replicas(st))};
    return run_with(s, st);
  }
  if (st.strategy == "multi_worker") {
#if __has_include(<mpi.h>)
    distribute::multi_worker_mirrored_strategy<distribute::cpu, distribute::mpi> s{
        {.local_replicas = cpu_replicas(st)}};
    try {
      return run_with(s, st);
    } catch (const distribute::collective_error& e) {
      if (s.num_workers() > 1) throw job_failed(e.what());  // printed by the worker that saw it
      throw;
    }
#else
    throw std::invalid_argument(
        "--strategy multi_worker: this build of cyclegan_train has no MPI (configure with MPI found)");
#endif
  }
  throw std::invalid_argument("--strategy must be one_device, mirrored or multi_worker, not '" + st.strategy + "'");
}

}  // namespace cyclegan
