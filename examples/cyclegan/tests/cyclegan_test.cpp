// The CycleGAN example's tests: the placement tags, a smoke run of each placement, the placements'
// agreement, bit-exact resume, and the classifier.
#include "../classifier_training.hpp"
#include "../program.hpp"

#include <distribute/strategy/placement.hpp>

#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <csignal>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

namespace dist = distribute;
namespace fs = std::filesystem;
using namespace cyclegan;

namespace {

const fs::path fmnist_dir{std::string(dist::data::fashion_mnist_default_dir)};

// The tests read Fashion-MNIST from Debian's dataset-fashion-mnist; without it they are skipped.
void require_data() {
  if (!fs::exists(fmnist_dir / "train-images-idx3-ubyte.gz") && !fs::exists(fmnist_dir / "train-images-idx3-ubyte")) {
    std::printf("Fashion-MNIST not found in %s (apt-get install dataset-fashion-mnist): skipped\n", fmnist_dir.c_str());
    std::exit(77);
  }
}

fs::path scratch(const std::string& name) {
  const fs::path p = fs::temp_directory_path() / ("cyclegan_test_" + std::to_string(::getpid()) + "_" + name);
  fs::remove_all(p);
  return p;
}

// A tiny CycleGAN: a few hundred steps of it would take seconds; the tests run a few.
settings tiny(const std::string& name) {
  settings st;
  st.train.gen = {.channels = 1, .filters = 4, .blocks = 1};
  st.train.disc = {.channels = 1, .filters = 4, .layers = 2};
  st.train.batch = 2;
  st.train.pool_size = 4;
  st.steps = 4;
  st.train_limit = 32;
  st.eval_limit = 16;
  st.samples = 2;
  st.sample_every = 2;
  st.out_dir = scratch(name);
  st.quiet = true;
  return st;
}

// Every parameter tensor of a model, in enumeration order.
template <class M>
std::vector<std::vector<float>> parameter_tensors(M& m) {
  std::vector<std::vector<float>> out;
  m.for_each_parameter([&](auto v, auto) { out.emplace_back(v.begin(), v.end()); });
  return out;
}

// Every parameter of a model, in enumeration order, as one sequence.
template <class M>
std::vector<float> parameters(M& m) {
  std::vector<float> out;
  m.for_each_parameter([&](auto v, auto) { out.insert(out.end(), v.begin(), v.end()); });
  return out;
}

double max_relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  BOOST_REQUIRE_EQUAL(a.size(), b.size());
  double worst = 0, scale = 0;
  for (float x : a) scale = std::max(scale, static_cast<double>(std::abs(x)));
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  return worst / std::max(scale, 1e-12);
}

// A stand-in model for the placement tags: one float per replica.
struct counter {
  float value = 0;
};

std::string hex(std::string_view s) {
  std::string out;
  char buf[3];
  for (const char c : s) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned char>(c));
    out += buf;
  }
  return out;
}

// The --tensorboard file of a run of `steps` steps with a grid every 2: one file, holding every step's
// curves and the grids; where scripts/setup.sh installed TensorBoard's reader, the last cycle loss
// reads back from it as the run returned it.
void check_tensorboard_file(const fs::path& dir, const summary& sum, std::int64_t steps) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) files.push_back(e.path());
  BOOST_TEST_REQUIRE(files.size() == 1u);
  BOOST_TEST(files[0].filename().string().rfind("events.out.tfevents.", 0) == 0u, files[0]);
  BOOST_TEST(fs::file_size(files[0]) > 1000u);  // the curves of every step and the grids
#ifdef DISTRIBUTE_TENSORBOARD_VENV
  const fs::path python = fs::path(DISTRIBUTE_TENSORBOARD_VENV) / "bin" / "python";
  if (!fs::exists(python)) return;  // the summary tests say why; here the file's presence suffices
  const std::string command =
      "'" + python.string() + "' '" + DISTRIBUTE_SUMMARY_READER + "' --no-pixels '" + files[0].string() + "'";
  FILE* p = ::popen(command.c_str(), "r");
  BOOST_TEST_REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  BOOST_TEST_REQUIRE(::pclose(p) == 0, "read_events.py failed:\n" << out);
  char bits[16];
  std::snprintf(bits, sizeof bits, "%08x", std::bit_cast<std::uint32_t>(static_cast<float>(sum.last.cycle)));
  const std::string last_cycle = "tb scalars " + hex("loss/cycle") + " " + std::to_string(steps) + " " + bits + "\n";
  BOOST_TEST(out.find(last_cycle) != std::string::npos, "no line '" << last_cycle << "' in:\n" << out);
  std::size_t grids = 0;
  for (std::size_t at = 0; (at = out.find("tb images " + hex("samples") + " ", at)) != std::string::npos; ++at) ++grids;
  BOOST_TEST(grids == static_cast<std::size_t>(steps / 2));  // the final grid is the last step's, written once
  // The step-time breakdown, one value per step and part.
  for (const char* part :
       {"time/compute_ms", "time/collective_ms", "time/input_wait_ms", "time/checkpoint_ms", "time/other_ms"}) {
    std::size_t values = 0;
    for (std::size_t at = 0; (at = out.find("tb scalars " + hex(part) + " ", at)) != std::string::npos; ++at) ++values;
    BOOST_TEST(values == static_cast<std::size_t>(steps), part);
  }
#endif
}

}  // namespace

// --- placement.hpp ---------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(placement_tags)

BOOST_AUTO_TEST_CASE(blocks_run_where_their_tag_says) {
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(3)};
  auto state = s.mirror([](auto&) { return counter{}; });
  auto everywhere = dist::make_block(dist::every_replica, [](dist::replica auto& r, counter& c) {
    c.value += 1;
    return r.replica_id();
  });
  auto primary = dist::make_block(dist::primary_only, [](dist::replica auto& r, counter& c) {
    c.value += 10;
    return r.num_replicas();
  });
  static_assert(std::is_same_v<decltype(everywhere)::tag_type, dist::every_replica_t>);
  const auto ids = dist::run_block(s, everywhere, state);
  static_assert(dist::is_per_replica_v<std::remove_cvref_t<decltype(ids)>>);
  BOOST_TEST(ids.size() == 3u);
  BOOST_TEST(ids[2] == 2);
  const int group = dist::run_block(s, primary, state);
  BOOST_TEST(group == 1);  // the primary runs as a group of one: its collectives are no-ops
  BOOST_TEST(state[0].value == 11.0f);
  BOOST_TEST(state[1].value == 1.0f);
  dist::resync(s, state);
  for (auto& c : state) BOOST_TEST(c.value == 11.0f);
}

BOOST_AUTO_TEST_CASE(one_device_collapses_to_direct_calls) {
  dist::one_device_strategy<dist::cpu> s;
  auto state = s.mirror([](auto&) { return counter{}; });
  auto everywhere = dist::make_block(dist::every_replica, [](dist::replica auto&, counter& c) { return c.value += 1; });
  auto primary = dist::make_block(dist::primary_only, [](dist::replica auto&, counter& c) { return c.value += 10; });
  const auto a = dist::run_block(s, everywhere, state);
  static_assert(std::remove_cvref_t<decltype(a)>::extent == 1);  // in place, no allocation
  const float b = dist::run_block(s, primary, state);
  dist::resync(s, state);  // nothing to copy with one replica
  BOOST_TEST(a[0] == 1.0f);
  BOOST_TEST(b == 11.0f);
}

BOOST_AUTO_TEST_CASE(a_failing_block_reports_and_the_strategy_stays_usable) {
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(2)};
  auto fails = dist::make_block(dist::every_replica, [](dist::replica auto& r) {
    if (r.replica_id() == 1) throw std::runtime_error("replica 1 failed");
    r.barrier();
  });
  BOOST_CHECK_THROW(dist::run_block(s, fails), std::exception);
  auto fine = dist::make_block(dist::every_replica, [](dist::replica auto& r) { return r.replica_id(); });
  BOOST_TEST(dist::run_block(s, fine)[1] == 1);
}

BOOST_AUTO_TEST_SUITE_END()

// --- a smoke run of each placement --------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(smoke)

BOOST_AUTO_TEST_CASE(each_placement_trains_and_draws) {
  require_data();
  struct mode {
    const char* strategy;
    placement place;
    norm_kind norm;
  };
  for (const mode m : {mode{"one_device", placement::full, norm_kind::instance},
                       mode{"mirrored", placement::full, norm_kind::instance},
                       mode{"mirrored", placement::discriminator_only, norm_kind::batch},
                       mode{"mirrored", placement::conditional, norm_kind::sync_batch}}) {
    BOOST_TEST_CONTEXT(m.strategy << " " << name_of(m.place) << " " << name_of(m.norm)) {
      settings st = tiny(std::string("smoke_") + name_of(m.place));
      st.strategy = m.strategy;
      st.train.place = m.place;
      st.train.disc.norm = m.norm;
      st.verify_every = 1;                             // the mirrored copies must stay identical after every step
      const bool board = st.strategy == "one_device";  // one run also writes a TensorBoard file
      if (board) st.tensorboard_dir = st.out_dir / "tensorboard";
      if (board) st.checkpoint_dir = st.out_dir / "checkpoints";  // and a checkpoint at the end
      const summary sum = run(st);
      BOOST_TEST(sum.finite);
      BOOST_TEST(sum.steps == 4);
      // Where the loop's time went, from the strategy: compute in every step, collectives only
      // between replicas (the conditional placement runs this small batch on the primary alone),
      // and the parts within the loop's wall time.
      BOOST_TEST(sum.time.runs >= 4);
      BOOST_TEST(sum.time.compute > 0.0);
      if (st.strategy == "one_device" || m.place == placement::conditional) BOOST_TEST(sum.time.collective == 0.0);
      else BOOST_TEST(sum.time.collective > 0.0);
      BOOST_TEST(sum.time.compute + sum.time.collective + sum.time.input_wait + sum.time.checkpoint <=
                 sum.time.wall + 1e-3);
      if (!st.checkpoint_dir.empty()) BOOST_TEST(sum.time.checkpoint > 0.0);
      for (const char* f : {"samples_step000002.png", "samples_final.png", "losses.png", "losses.csv"}) {
        BOOST_TEST(fs::file_size(st.out_dir / f) > 100u, f);
      }
      if (board) check_tensorboard_file(st.tensorboard_dir, sum, 4);
      fs::remove_all(st.out_dir);
    }
  }
}

BOOST_AUTO_TEST_CASE(adapt_threads_reaches_the_engine_and_trains) {
  require_data();
  settings st = tiny("smoke_adapt");
  st.strategy = "one_device";
  st.adapt_threads = true;
  const summary sum = run(st);
  BOOST_TEST(sum.engine.adapt_threads);
  BOOST_TEST(sum.finite);
  BOOST_TEST(sum.steps == 4);
  fs::remove_all(st.out_dir);
  st.adapt_threads = false;
  BOOST_TEST(!run(st).engine.adapt_threads);
  fs::remove_all(st.out_dir);
}

BOOST_AUTO_TEST_CASE(bfloat16_trains_where_the_cpu_has_bf16_units_and_is_refused_by_name_elsewhere) {
  require_data();
  settings st = tiny("smoke_bf16");
  st.precision = dist::compute_precision::bfloat16;
  st.verify_every = 1;
  if (dist::detail::cpu_has_bf16_units()) {
    const summary sum = run(st);
    BOOST_TEST(sum.finite);
    BOOST_TEST(sum.steps == 4);
  } else {
    try {
      (void)run(st);
      BOOST_TEST(false, "bfloat16 was not refused on a CPU without bf16 units");
    } catch (const std::invalid_argument& e) {
      BOOST_TEST(std::string(e.what()).find("bf16 units") != std::string::npos, e.what());
    }
  }
  fs::remove_all(st.out_dir);
  st.precision = dist::compute_precision::float16;  // settings built in code: refused before anything runs
  try {
    (void)run(st);
    BOOST_TEST(false, "float16 was not refused");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(std::string(e.what()).find("needs loss scaling") != std::string::npos, e.what());
  }
}

BOOST_AUTO_TEST_CASE(learning_rate_schedule) {
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(2)};
  train_options o;
  o.gen = {.channels = 1, .filters = 2, .blocks = 0};
  o.disc = {.channels = 1, .filters = 2, .layers = 1};
  o.lr = 1e-3;
  o.total_steps = 10;  // 5 constant, then 5 decaying (the reference's rule: 1 - k / (decay + 1))
  trainer<dist::mirrored_strategy<dist::cpu>> plain(s, o, 1, 28, 28);
  BOOST_TEST(plain.global_batch() == 8);  // --batch 4 per replica x 2 replicas
  BOOST_TEST(plain.learning_rate(0) == 1e-3);
  BOOST_TEST(plain.learning_rate(4) == 1e-3);
  BOOST_TEST(plain.learning_rate(5) == 1e-3);
  BOOST_TEST(std::abs(plain.learning_rate(9) - 1e-3 * (1 - 4.0 / 6)) < 1e-15);
  o.scale_lr = true;  // lr x replicas, reached linearly over the warm-up
  o.warmup_steps = 4;
  trainer<dist::mirrored_strategy<dist::cpu>> scaled(s, o, 1, 28, 28);
  BOOST_TEST(std::abs(scaled.learning_rate(0) - 1e-3 * 1.25) < 1e-15);
  BOOST_TEST(std::abs(scaled.learning_rate(3) - 2e-3) < 1e-15);
  BOOST_TEST(std::abs(scaled.learning_rate(4) - 2e-3) < 1e-15);
  BOOST_TEST(std::abs(scaled.learning_rate(9) - 2e-3 * (1 - 4.0 / 6)) < 1e-15);
}

BOOST_AUTO_TEST_CASE(bad_flags_are_named) {
  BOOST_CHECK_THROW(parse_placement("sideways"), std::invalid_argument);
  BOOST_CHECK_THROW(parse_norm("layer"), std::invalid_argument);
  settings st = tiny("bad");
  st.strategy = "quantum";
  BOOST_CHECK_THROW(run(st), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()

// --- where the placements must agree -------------------------------------------------------------
//
// With instance norm in every network, each loss a share of the mean over the GLOBAL batch and the
// image pool fed the global batch on the primary, the three placements compute the same step. After
// 3 steps every parameter of G_AB, G_BA, D_A and D_B agrees with one device:
//   - bit for bit for `conditional` below its threshold (the same calls on the same batch);
//   - within 1e-4 relative for `full` and `discriminator_only` over 2 replicas (the gradient sums
//     are grouped per replica, so the last bits differ; measured: about 1e-6).

BOOST_AUTO_TEST_SUITE(placements_agree)

template <class S>
std::vector<std::vector<std::vector<float>>> train_three_steps(
    S& s, placement place, std::size_t threshold, const domains& d, bool overlap = true,
    dist::gradient_compression compression = dist::gradient_compression::none) {
  train_options o;
  o.overlap = overlap;
  o.compression = compression;
  o.gen = {.channels = 1, .filters = 4, .blocks = 1};
  o.disc = {.channels = 1, .filters = 4, .layers = 2};
  o.batch = 4 / s.num_replicas_in_sync();  // global batch 4 everywhere
  o.pool_size = 2;                         // full after the first step: the pool's draws matter
  o.total_steps = 3;
  o.place = place;
  o.mirror_threshold = threshold;
  trainer<S> tr(s, o, 1, 28, 28);
  for (int step = 0; step < 3; ++step) {
    const auto first = static_cast<std::size_t>(step * 4);
    tr.step(stack(d.a, first, 4, 1), stack(d.b, first, 4, 1));
  }
  tr.verify_mirrored();
  return {parameter_tensors(tr.g_ab().primary()), parameter_tensors(tr.g_ba().primary()),
          parameter_tensors(tr.d_a().primary()), parameter_tensors(tr.d_b().primary())};
}

BOOST_AUTO_TEST_CASE(after_three_steps) {
  require_data();
  domains d = load_fashion_mnist(fmnist_dir);
  d.a.resize(12);
  d.b.resize(12);
  dist::one_device_strategy<dist::cpu> one;
  dist::mirrored_strategy<dist::cpu> two{dist::cpu_replicas(2)};
  const auto reference = train_three_steps(one, placement::full, 0, d);
  const auto full = train_three_steps(two, placement::full, 0, d);
  const auto disc_only = train_three_steps(two, placement::discriminator_only, 0, d);
  const auto cond_primary = train_three_steps(two, placement::conditional, 8, d);  // global batch 4 < 8
  const auto cond_mirrored = train_three_steps(two, placement::conditional, 4, d);
  const char* names[] = {"G_AB", "G_BA", "D_A", "D_B"};
  for (std::size_t k = 0; k < 4; ++k) {
    BOOST_TEST_CONTEXT(names[k]) {
      double worst_full = 0, worst_disc = 0;
      for (std::size_t t = 0; t < reference[k].size(); ++t) {
        BOOST_TEST(cond_primary[k][t] == reference[k][t]);  // bit for bit
        BOOST_TEST(cond_mirrored[k][t] == full[k][t]);      // the same path as full
        worst_full = std::max(worst_full, max_relative_difference(full[k][t], reference[k][t]));
        worst_disc = std::max(worst_disc, max_relative_difference(disc_only[k][t], reference[k][t]));
      }
      BOOST_TEST(worst_full < 1e-4);
      BOOST_TEST(worst_disc < 1e-4);
      std::printf("%s: %zu tensors; largest relative difference to one device: full %.2g, discriminator_only %.2g\n",
                  names[k], reference[k].size(), worst_full, worst_disc);
    }
  }
}

BOOST_AUTO_TEST_CASE(overlapped_all_reduce_changes_no_bit) {
  // Each network's all-reduce during its last backward (the default) or after it: the same bits, in
  // every placement.
  require_data();
  domains d = load_fashion_mnist(fmnist_dir);
  d.a.resize(12);
  d.b.resize(12);
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(2)};
  for (const placement place : {placement::full, placement::discriminator_only, placement::conditional}) {
    const auto on = train_three_steps(s, place, 4, d, true);
    const auto off = train_three_steps(s, place, 4, d, false);
    BOOST_TEST((on == off), name_of(place));
  }
  // With the gradients travelling as bfloat16 too; and they do travel so (not the float bits).
  const auto bf16 = dist::gradient_compression::bfloat16;
  const auto on = train_three_steps(s, placement::full, 4, d, true, bf16);
  BOOST_TEST((on == train_three_steps(s, placement::full, 4, d, false, bf16)), "bfloat16 gradients");
  BOOST_TEST(!(on == train_three_steps(s, placement::full, 4, d, true)), "bfloat16 gradients are not the float ones");
}

// The step recorded on an nn::tape (wiring::tape: each generator applied three times and the
// discriminators frozen on one tape) against the hand-wired step: the same losses, gradients and
// parameters, bit for bit, under one device and mirrored (with and without the overlapped all-reduce).
template <wiring W, class S>
std::vector<std::vector<float>> three_steps_wired(S& s, bool overlap, std::vector<double>& losses) {
  train_options o;
  o.overlap = overlap;
  o.gen = {.channels = 1, .filters = 4, .blocks = 2};
  o.disc = {.channels = 1, .filters = 4, .layers = 2};
  o.batch = 4 / s.num_replicas_in_sync();
  o.pool_size = 2;
  o.total_steps = 3;
  trainer<S, W> tr(s, o, 1, 28, 28);
  for (int step = 0; step < 3; ++step) {
    tensor a{dist::shape::nchw(4, 1, 28, 28)}, b{dist::shape::nchw(4, 1, 28, 28)};
    for (std::size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i + 1000 * static_cast<std::size_t>(step))));
      b[i] = static_cast<float>(std::cos(0.53 * static_cast<double>(i + 1000 * static_cast<std::size_t>(step))));
    }
    const auto l = tr.step(a, b).values();
    losses.insert(losses.end(), l.begin(), l.end());
  }
  tr.verify_mirrored();
  std::vector<std::vector<float>> out;
  for (auto* net : {&tr.g_ab().primary(), &tr.g_ba().primary()})
    net->for_each_parameter([&](auto v, auto g) {
      out.emplace_back(v.begin(), v.end());
      out.emplace_back(g.begin(), g.end());
    });
  for (auto* net : {&tr.d_a().primary(), &tr.d_b().primary()})
    net->for_each_parameter([&](auto v, auto g) {
      out.emplace_back(v.begin(), v.end());
      out.emplace_back(g.begin(), g.end());
    });
  return out;
}

BOOST_AUTO_TEST_CASE(the_step_on_a_tape_equals_the_hand_wired_step_bit_for_bit) {
  dist::one_device_strategy<dist::cpu> one;
  dist::mirrored_strategy<dist::cpu> two{dist::cpu_replicas(2)};
  auto agree = [](auto& s, bool overlap, const char* what) {
    std::vector<double> hand_losses, tape_losses;
    const auto hand = three_steps_wired<wiring::by_hand>(s, overlap, hand_losses);
    const auto taped = three_steps_wired<wiring::tape>(s, overlap, tape_losses);
    BOOST_TEST_CONTEXT(what) {
      BOOST_TEST(hand_losses.size() == 18u);
      for (std::size_t i = 0; i < hand_losses.size(); ++i)
        BOOST_TEST(std::bit_cast<std::uint64_t>(hand_losses[i]) == std::bit_cast<std::uint64_t>(tape_losses[i]),
                   "loss " << i);
      BOOST_TEST_REQUIRE(hand.size() == taped.size());
      for (std::size_t k = 0; k < hand.size(); ++k)
        BOOST_TEST((hand[k] == taped[k]), "tensor " << k << " (even: value, odd: gradient)");
    }
  };
  agree(one, true, "one_device");
  agree(two, true, "mirrored, overlapped all-reduce");
  agree(two, false, "mirrored, all-reduce after backward");
}

BOOST_AUTO_TEST_CASE(every_network_finishes_its_buckets_in_plan_order) {
  // The bucket plan (reverse enumeration) is the order backward finishes the gradients of both
  // networks (generator: the residual blocks inside `repeated`; discriminator: its patch stages), so
  // no bucket waits behind an earlier one and a plan rebuilt in ready order would be this one.
  // Every tensor a bucket of its own: the finest plan, the one most easily out of order.
  const dist::gradient_reduction small{.bucket_bytes = 1, .first_bucket_bytes = 1};
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(2)};
  auto gens = s.mirror([](auto&) { return make_generator(generator_options{}, 7); });
  auto discs = s.mirror([](auto&) { return make_discriminator(discriminator_options{}, 8); });
  std::vector<float> x(2 * 28 * 28);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  auto xs = s.scatter(x, 28 * 28);
  const auto counts = s.run(
      [&](dist::replica auto& r, const std::vector<float>& xl, generator& g, discriminator& d) {
        const tensor in{dist::shape::nchw(static_cast<std::int64_t>(xl.size()) / (28 * 28), 1, 28, 28), xl};
        std::array<std::size_t, 4> out{};  // generator held back, its buckets, discriminator held back, its buckets
        auto pass = [&](auto& net, std::size_t at) {
          net.zero_grad();
          const tensor y = net.forward(r, in);
          auto sync = r.overlap_gradients(small);
          sync.add(net);
          net.backward(r, tensor(y.shape(), std::vector<float>(static_cast<std::size_t>(y.shape().numel()), 1e-3f)));
          out[at] = sync.held_back();
          std::size_t tensors = 0;
          net.for_each_parameter([&](auto, auto) { ++tensors; });
          out[at + 1] = sync.wait() == tensors ? tensors : 0;  // one bucket per tensor, or 0
        };
        pass(g, 0);
        pass(d, 2);
        return out;
      },
      xs, gens, discs);
  for (const auto& c : counts) {
    BOOST_TEST(c[0] == 0u);
    // Instance norm has no parameters (the reference's): the generator's 12 convolution weights (6
    // in the residual blocks) and its last bias; the discriminator's 4 weights and 2 biases.
    BOOST_TEST(c[1] == 13u);
    BOOST_TEST(c[2] == 0u);
    BOOST_TEST(c[3] == 6u);
  }
}

BOOST_AUTO_TEST_SUITE_END()

// --- resume ------------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(resume)

// SIGINT (Ctrl-C) while the trainer runs with checkpoints: it stops after the step the signal lands
// in, with a checkpoint of that step and the CSV up to it, and reports it; --resume then continues
// from the next step to the uninterrupted run's checkpoint, bit for bit.
BOOST_AUTO_TEST_CASE(a_signal_stops_the_run_with_a_checkpoint_and_resume_continues_bit_for_bit) {
  require_data();
  for (const char* strategy : {"one_device", "mirrored"}) {
    BOOST_TEST_CONTEXT(strategy) {
      settings whole = tiny(std::string("signal_whole_") + strategy);
      whole.strategy = strategy;
      whole.steps = 40;
      whole.train_limit = 24;
      whole.sample_every = 0;
      whole.checkpoint_dir = whole.out_dir / "ckpt";
      whole.checkpoint_every = 2;
      run(whole);

      settings part = whole;
      part.out_dir = scratch(std::string("signal_part_") + strategy);
      part.checkpoint_dir = part.out_dir / "ckpt";
      // Ctrl-C once the run has written its first checkpoint (after step 2).
      std::jthread ctrl_c([&](std::stop_token stop) {
        while (!stop.stop_requested() && !fs::exists(part.checkpoint_dir / dist::checkpoint::directory::file_name(2)))
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        if (!stop.stop_requested()) std::raise(SIGINT);
      });
      const summary stopped = run(part);
      ctrl_c.request_stop();
      ctrl_c.join();
      BOOST_TEST_REQUIRE(stopped.preempted.has_value(),
                         "the run was not stopped (it ended at step " << stopped.steps << ")");
      BOOST_TEST(stopped.preempted->starts_with("SIGINT after step "), *stopped.preempted);
      BOOST_TEST(stopped.steps >= 2);
      BOOST_TEST(stopped.steps < 40);
      BOOST_TEST(!stopped.quality.has_value());
      const auto saved = dist::checkpoint::directory(part.checkpoint_dir).steps();
      BOOST_TEST_REQUIRE(!saved.empty());
      BOOST_TEST(saved.front().first == stopped.steps, "the checkpoint is of the step it stopped after");
      BOOST_TEST(read_csv(part.out_dir / "losses.csv", 1000).size() == static_cast<std::size_t>(stopped.steps));

      part.resume = true;
      const summary resumed = run(part);
      BOOST_TEST(!resumed.preempted.has_value());
      BOOST_TEST(resumed.steps == 40);
      BOOST_TEST(resumed.steps_run == 40 - stopped.steps, "no step lost or repeated");
      const auto a = dist::checkpoint::directory(whole.checkpoint_dir).load_latest();
      const auto b = dist::checkpoint::directory(part.checkpoint_dir).load_latest();
      BOOST_REQUIRE(a && b);
      for (const auto& name : a->names()) {
        const auto x = a->bytes(name), y = b->bytes(name);
        BOOST_TEST(std::equal(x.begin(), x.end(), y.begin(), y.end()), "section " << name);
      }
      fs::remove_all(whole.out_dir);
      fs::remove_all(part.out_dir);
    }
  }
}

BOOST_AUTO_TEST_CASE(resumed_equals_uninterrupted_bit_for_bit) {
  require_data();
  for (const char* strategy : {"one_device", "mirrored"}) {
    BOOST_TEST_CONTEXT(strategy) {
      settings whole = tiny(std::string("whole_") + strategy);
      whole.strategy = strategy;
      whole.steps = 8;
      whole.train_limit = 24;  // 6 steps per epoch: the run crosses an epoch, and resumes inside one
      whole.sample_every = 0;
      whole.checkpoint_dir = whole.out_dir / "ckpt";
      whole.checkpoint_every = 0;
      run(whole);

      settings part = whole;
      part.out_dir = scratch(std::string("part_") + strategy);
      part.checkpoint_dir = part.out_dir / "ckpt";
      part.stop_at_step = 5;
      BOOST_TEST(run(part).steps == 5);
      part.stop_at_step = 0;
      part.resume = true;
      const summary resumed = run(part);
      BOOST_TEST(resumed.steps == 8);
      BOOST_TEST(resumed.steps_run == 3);

      const auto a = dist::checkpoint::directory(whole.checkpoint_dir).load_latest();
      const auto b = dist::checkpoint::directory(part.checkpoint_dir).load_latest();
      BOOST_REQUIRE(a && b);
      BOOST_TEST(a->names() == b->names());
      for (const auto& name : a->names()) {
        const auto x = a->bytes(name), y = b->bytes(name);
        BOOST_TEST(std::equal(x.begin(), x.end(), y.begin(), y.end()), "section " << name);
      }
      // The CSV continues from the checkpoint: 8 steps, once each.
      BOOST_TEST(read_csv(part.out_dir / "losses.csv", 1000).size() == 8u);
      fs::remove_all(whole.out_dir);
      fs::remove_all(part.out_dir);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_mismatched_run_is_refused) {
  require_data();
  settings st = tiny("mismatch");
  st.strategy = "one_device";
  st.steps = 2;
  st.sample_every = 0;
  st.checkpoint_dir = st.out_dir / "ckpt";
  run(st);
  st.resume = true;
  st.train.batch = 3;  // another global batch: the data position would not match
  BOOST_CHECK_THROW(run(st), std::invalid_argument);
  st.train.batch = 2;
  st.train.gen.filters = 5;  // another model: the checkpoint names the mismatch
  BOOST_CHECK_THROW(run(st), dist::checkpoint::checkpoint_error);
  fs::remove_all(st.out_dir);
}

BOOST_AUTO_TEST_SUITE_END()

// --- the classifier ------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(classifier)

BOOST_AUTO_TEST_CASE(learning_rate_is_constant_then_decays_linearly_to_zero) {
  classifier_options o;
  o.lr = 1e-3;
  BOOST_TEST(classifier_lr(o, 0, 100) == 1e-3);  // decay over the whole run (the default)
  BOOST_TEST(std::abs(classifier_lr(o, 50, 100) - 5e-4) < 1e-12);
  BOOST_TEST(std::abs(classifier_lr(o, 99, 100) - 1e-5) < 1e-12);
  o.decay_fraction = 0.25;
  BOOST_TEST(classifier_lr(o, 75, 100) == 1e-3);  // constant for the first 75 steps
  BOOST_TEST(std::abs(classifier_lr(o, 76, 100) - 24.0 / 25 * 1e-3) < 1e-12);
  o.decay_fraction = 0;
  BOOST_TEST(classifier_lr(o, 99, 100) == 1e-3);  // no decay
}

// 2 epochs over 3,000 images: the training loss falls by more than 10% (measured: 0.78 to 0.47) and
// the test accuracy passes 75% (measured: 82.9%; chance is 10%, a network that does not learn stays
// near it). Scoring is in evaluation mode (dropout off, batch norm's running statistics), so it gives
// the same answer twice, and the model round-trips through a checkpoint with those statistics.
BOOST_AUTO_TEST_CASE(learns_and_round_trips_through_a_checkpoint) {
  require_data();
  const auto train = all_examples(dist::data::fashion_mnist(dist::data::split::train, fmnist_dir), 3000);
  auto test = all_examples(dist::data::fashion_mnist(dist::data::split::test, fmnist_dir), 1000);
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(2)};
  std::vector<classifier_epoch> epochs;
  auto net = train_classifier(s, train, {.batch = 16, .epochs = 2, .lr = 3e-3, .quiet = true},
                              [&](const classifier_epoch& e, cyclegan::classifier&) { epochs.push_back(e); });
  BOOST_TEST_REQUIRE(epochs.size() == 2u);
  BOOST_TEST(epochs[1].loss < 0.9 * epochs[0].loss);
  const auto acc = score_classifier(net, test);
  BOOST_TEST_MESSAGE("losses " << epochs[0].loss << ", " << epochs[1].loss << "; test accuracy " << acc.overall);
  BOOST_TEST(acc.overall > 0.75);
  BOOST_TEST(score_classifier(net, test).overall == acc.overall);

  const fs::path file = scratch("classifier.dck");
  dist::checkpoint::archive ar;
  ar.put_model("classifier", net);
  dist::checkpoint::save(file, ar);
  auto loaded = make_classifier(123);
  dist::checkpoint::load(file).get_model("classifier", loaded);
  BOOST_TEST(parameters(loaded) == parameters(net));
  BOOST_TEST(score_classifier(loaded, test).overall == acc.overall);
  fs::remove(file);
}

BOOST_AUTO_TEST_SUITE_END()

// --- the command line ---------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(flags)

// The message of the invalid_argument that parsing `args` throws ("" when it parses).
std::string flag_error(std::vector<std::string> args) {
  std::vector<const char*> argv{"cyclegan_train"};
  for (const auto& a : args) argv.push_back(a.c_str());
  settings st;
  try {
    parse_arguments(st, static_cast<int>(argv.size()), argv.data());
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

BOOST_AUTO_TEST_CASE(every_bad_value_names_the_flag_the_value_and_the_range) {
  struct bad {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<bad> cases{
      {{"--batch", "0"}, "--batch: 0 is out of range (accepted: an integer from 1 to 4096)"},
      {{"--batch", "4294967297"}, "--batch: 4294967297 is out of range (accepted: an integer from 1 to 4096)"},
      {{"--replicas", "4294967298"}, "--replicas: 4294967298 is out of range (accepted: an integer from 1 to 256)"},
      {{"--epochs", "2147483648"}, "--epochs: 2147483648 is out of range (accepted: an integer from 1 to 1000000)"},
      {{"--steps", "99999999999999999999"}, "--steps: 99999999999999999999 is out of range"},
      {{"--batch", "abc"}, "--batch: 'abc' is not an integer (accepted: an integer from 1 to 4096)"},
      {{"--batch", "4x"}, "--batch: '4x' is not an integer"},
      {{"--batch", ""}, "--batch: '' is not an integer"},
      {{"--seed", "-1"}, "--seed: -1 is out of range (accepted: an integer from 0 to 18446744073709551615)"},
      {{"--lr", "nan"}, "--lr: nan is out of range (accepted: a finite number above 0 and at most 1)"},
      {{"--lr", "inf"}, "--lr: inf is out of range"},
      {{"--lr", "-1"}, "--lr: -1 is out of range"},
      {{"--lr", "0"}, "--lr: 0 is out of range"},
      {{"--lr", "fast"}, "--lr: 'fast' is not a number (accepted: a finite number above 0 and at most 1)"},
      {{"--lambda-cycle", "nan"}, "--lambda-cycle: nan is out of range (accepted: a finite number from 0 to 10000)"},
      {{"--decay-fraction", "2"}, "--decay-fraction: 2 is out of range (accepted: a finite number from 0 to 1)"},
      {{"--decay-fraction", "-1"}, "--decay-fraction: -1 is out of range"},
      {{"--decay-fraction", "nan"}, "--decay-fraction: nan is out of range"},
      {{"--samples", "0"}, "--samples: 0 is out of range (accepted: an integer from 1 to 64)"},
      {{"--image-size", "5"}, "--image-size: 5 is out of range (accepted: an integer from 8 to 1024)"},
      {{"--image-size", "20000"}, "--image-size: 20000 is out of range"},
      {{"--norm", "layer"}, "--norm: 'layer' is not one of instance, batch, sync_batch"},
      {{"--gradient-compression", "fp8"}, "--gradient-compression: 'fp8' is not one of none, bfloat16"},
      {{"--precision", "fp16"}, "--precision: 'fp16' is not one of float32, bf16"},
      {{"--batch"}, "--batch needs a value"},
      {{"--resume"}, "--resume needs --checkpoint-dir"},
      {{"--bogus"}, "unknown flag '--bogus'"},
  };
  for (const auto& c : cases) {
    const std::string got = flag_error(c.args);
    BOOST_TEST(got.find(c.message) == 0, "got '" << got << "', expected '" << c.message << "'");
  }
}

BOOST_AUTO_TEST_CASE(good_values_parse_and_help_stops) {
  settings st;
  const char* argv[] = {"x",
                        "--batch",
                        "8",
                        "--replicas",
                        "3",
                        "--lr",
                        "1e-3",
                        "--seed",
                        "18446744073709551615",
                        "--quiet",
                        "--decay-fraction",
                        "0",
                        "--strategy",
                        "one_device",
                        "--image-size",
                        "32"};
  BOOST_TEST(parse_arguments(st, 16, argv));
  BOOST_TEST(st.train.batch == 8);
  BOOST_TEST(st.replicas == 3);
  BOOST_TEST(st.train.lr == 1e-3);
  BOOST_TEST(st.train.seed == 18446744073709551615ull);
  BOOST_TEST(st.quiet);
  BOOST_TEST(st.strategy == "one_device");
  BOOST_TEST(st.adapt_threads);  // the default
  const char* fixed[] = {"x", "--adapt-threads", "off"};
  BOOST_TEST(parse_arguments(st, 3, fixed));
  BOOST_TEST(!st.adapt_threads);
  const char* adapt[] = {"x", "--adapt-threads", "on"};
  BOOST_TEST(parse_arguments(st, 3, adapt));
  BOOST_TEST(st.adapt_threads);
  const char* help[] = {"x", "--batch", "2", "--help", "--batch", "0"};
  BOOST_TEST(!parse_arguments(st, 6, help));  // --help answers before the bad value after it
  classifier_settings cs;
  const char* bad[] = {"x", "--epochs", "0"};
  BOOST_CHECK_EXCEPTION(
      parse_classifier_arguments(cs, 3, bad), std::invalid_argument, [](const std::invalid_argument& e) {
        return std::string(e.what()) == "--epochs: 0 is out of range (accepted: an integer from 1 to 10000)";
      });
}

BOOST_AUTO_TEST_CASE(settings_built_in_code_are_checked_before_anything_divides_by_them) {
  settings st = tiny("zero_batch");
  st.train.batch = 0;  // once a division by zero (SIGFPE) computing the steps per epoch
  BOOST_CHECK_EXCEPTION(run(st), std::invalid_argument, [](const std::invalid_argument& e) {
    return std::string(e.what()).starts_with("--batch: 0 is out of range");
  });
  st = tiny("nan_lr");
  st.train.lr = std::nan("");
  BOOST_CHECK_THROW(run(st), std::invalid_argument);
  st = tiny("zero_samples");
  st.samples = 0;
  BOOST_CHECK_THROW(run(st), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(images_the_networks_cannot_take_are_named) {
  BOOST_CHECK_NO_THROW(check_image_shape(28, 28, 2, "x"));
  BOOST_CHECK_NO_THROW(check_image_shape(256, 256, 3, "x"));
  BOOST_CHECK_EXCEPTION(check_image_shape(7, 7, 2, "--fmnist-dir d"), std::invalid_argument,
                        [](const std::invalid_argument& e) {
                          return std::string(e.what()).starts_with(
                              "--fmnist-dir d: images of 7x7 pixels do not fit the networks (accepted: sides that are "
                              "multiples of 4 from 12 to 1024");
                        });
  BOOST_CHECK_THROW(check_image_shape(30, 30, 2, "x"), std::invalid_argument);
  BOOST_CHECK_THROW(check_image_shape(28, 28, 4, "x"), std::invalid_argument);  // 28 / 16 leaves 1
}

BOOST_AUTO_TEST_SUITE_END()

// --- crashes and damaged files -----------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(crash_safety)

settings checkpointed(const std::string& name) {
  settings st = tiny(name);
  st.strategy = "one_device";
  st.steps = 8;
  st.train_limit = 24;
  st.sample_every = 0;
  st.checkpoint_dir = st.out_dir / "ckpt";
  st.checkpoint_every = 2;
  return st;
}

BOOST_AUTO_TEST_CASE(the_csv_keeps_every_row_when_a_crash_loses_the_newest_checkpoint) {
  require_data();
  settings st = checkpointed("csv");
  st.stop_at_step = 5;
  run(st);
  // A kill between the CSV's rename and the checkpoint's: the CSV is ahead of the newest checkpoint.
  fs::remove(st.checkpoint_dir / dist::checkpoint::directory::file_name(5));
  BOOST_TEST(read_csv(st.out_dir / "losses.csv", 1000).size() == 5u);
  st.stop_at_step = 0;
  st.resume = true;
  BOOST_TEST(run(st).steps_run == 4);  // from step 4
  const auto rows = read_csv(st.out_dir / "losses.csv", 1000);
  BOOST_TEST(continuous(rows, 8));
  fs::remove_all(st.out_dir);
}

BOOST_AUTO_TEST_CASE(leftovers_of_a_killed_run_are_removed_at_start) {
  require_data();
  settings st = checkpointed("leftovers");
  st.stop_at_step = 4;
  run(st);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  const std::string tag = ".tmp-" + std::to_string(child) + "-0";
  const fs::path stale[] = {st.checkpoint_dir / (dist::checkpoint::directory::file_name(6) + tag),
                            st.out_dir / ("losses.csv" + tag), st.out_dir / ("samples_final.png" + tag)};
  for (const auto& p : stale) std::ofstream(p) << "half";
  st.stop_at_step = 0;
  st.resume = true;
  run(st);
  for (const auto& p : stale) BOOST_TEST(!fs::exists(p), p);
  fs::remove_all(st.out_dir);
}

BOOST_AUTO_TEST_CASE(a_directory_of_corrupt_checkpoints_stops_a_resume_and_a_new_run_keeps_its_checkpoints) {
  require_data();
  settings st = checkpointed("corrupt");
  run(st);
  const auto damaged = dist::checkpoint::directory(st.checkpoint_dir).steps();
  for (const auto& [step, file] : damaged) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(20);
    f.put('\x7f');
  }
  // --resume with nothing that loads: an error naming every file, not a silent restart at step 0.
  st.resume = true;
  BOOST_CHECK_EXCEPTION(
      run(st), dist::checkpoint::no_loadable_checkpoint, [&](const dist::checkpoint::no_loadable_checkpoint& e) {
        const std::string what = e.what();
        bool named = what.find(st.checkpoint_dir.string()) != std::string::npos && e.files.size() == damaged.size();
        for (const auto& [step, file] : damaged) named = named && what.find(file.string() + ": ") != std::string::npos;
        return named;
      });
  // A new run in the same directory (no --resume) starts from 0, and pruning keeps its checkpoints.
  st.resume = false;
  const summary again = run(st);
  BOOST_TEST(again.steps_run == 8);
  const auto kept = dist::checkpoint::directory(st.checkpoint_dir).steps();
  BOOST_TEST_REQUIRE(kept.size() == 3u);
  BOOST_TEST(kept[0].first == 8);  // once written and deleted at once
  BOOST_TEST(dist::checkpoint::directory(st.checkpoint_dir).load_latest().has_value());
  fs::remove_all(st.out_dir);
}

BOOST_AUTO_TEST_CASE(a_checkpoint_with_a_negative_step_is_refused_by_name) {
  require_data();
  settings st = checkpointed("negative");
  st.steps = 2;
  run(st);
  dist::checkpoint::directory d(st.checkpoint_dir);
  const auto [file, ar] = *d.load_latest_with_path();
  dist::checkpoint::archive forged;
  for (const auto& [name, bytes] : ar.sections())
    if (name == "step") forged.put("step", std::int64_t{-5});
    else forged.put_bytes(name, bytes);
  dist::checkpoint::save(file, forged);  // a valid checksum around a bad value
  st.resume = true;
  BOOST_CHECK_EXCEPTION(run(st), dist::checkpoint::checkpoint_error, [&](const dist::checkpoint::checkpoint_error& e) {
    const std::string what = e.what();
    return what.find(file.string()) != std::string::npos && what.find("step -5 is negative") != std::string::npos;
  });
  fs::remove_all(st.out_dir);
}

BOOST_AUTO_TEST_SUITE_END()
