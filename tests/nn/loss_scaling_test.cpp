// Dynamic loss scaling (optim::loss_scaler): an inf or a NaN in one replica's gradients makes every
// replica skip the step (parameters, optimiser state and scaler identical and unchanged, the scale
// halved on all); clean steps are bit for bit those of training without a scaler (the scale is a power
// of two); growth after exactly growth_interval clean steps, the floor and the ceiling; the state's
// save/load round trip and its errors; the options' errors.

#include "nn_test_support.hpp"

#include <distribute/optim/loss_scaler.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace optim = distribute::optim;
using dist::shape;
using dist::tensor;

namespace {

constexpr std::int64_t global_batch = 12;
constexpr float an_inf = std::numeric_limits<float>::infinity();
const float a_nan = std::numeric_limits<float>::quiet_NaN();

auto make_model() {
  return nn::sequential{nn::linear<float>({.in_features = 3, .out_features = 8}, 1), nn::tanh<float>(),
                        nn::linear<float>({.in_features = 8, .out_features = 2}, 2)};
}

std::vector<float> values(std::int64_t n, std::uint32_t seed) {
  const auto t = dist::test::random_tensor<float>(shape{n}, seed);
  return {t.begin(), t.end()};
}

std::vector<float> parameters_of(auto& model) {
  std::vector<float> v;
  model.for_each_parameter([&](std::span<float> p, std::span<float>) { v.insert(v.end(), p.begin(), p.end()); });
  return v;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

using distribute::test::mentions;

using distribute::test::error_of;

// A non-finite value written into the first gradient element of one replica, either before the
// gradient all-reduce (it then reaches every replica's sums) or after it (only that replica sees it:
// the agreement alone makes the others skip).
struct fault {
  int step = -1;
  int replica = 0;
  float value = 0;
  bool before_reduce = false;
};

struct run_result {
  std::vector<float> parameters;          // replica 0's, after the last step
  std::vector<std::vector<int>> stepped;  // per step, per replica: whether scaler.step stepped
  std::vector<double> scales;             // replica 0's scale after each step
};

// `replicas` CPU replicas train the model with Adam for `steps` steps on a global batch of 12 (split
// as evenly as possible), with a scaler of `scaling` options or without one. Checks after every step
// that models, optimisers and scalers are still mirrored.
run_result train(int replicas, int steps, std::optional<optim::loss_scale_options> scaling, fault f = {}) {
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(replicas)};
  auto models = s.mirror([](auto&) { return make_model(); });
  auto opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
  auto scalers = s.mirror([&](auto&) { return optim::loss_scaler{scaling.value_or(optim::loss_scale_options{})}; });
  run_result out;
  for (int t = 0; t < steps; ++t) {
    const auto x = values(global_batch * 3, 100 + static_cast<std::uint32_t>(t));
    const auto y = values(global_batch * 2, 200 + static_cast<std::uint32_t>(t));
    const auto digests_before = std::vector<std::uint64_t>{models[0].state_digest(), opts[0].state_digest()};
    const double scale_before = scalers[0].scale();
    const auto stepped = s.run(
        [&](dist::replica auto& r, auto& model, optim::adam<float>& opt, optim::loss_scaler& scaler) {
          const std::int64_t lo = global_batch * r.replica_id() / replicas;
          const std::int64_t hi = global_batch * (r.replica_id() + 1) / replicas;
          const tensor<float> xl{shape{hi - lo, 3}, std::vector<float>(x.begin() + lo * 3, x.begin() + hi * 3)};
          const tensor<float> yl{shape{hi - lo, 2}, std::vector<float>(y.begin() + lo * 2, y.begin() + hi * 2)};
          auto inject = [&] {
            bool first = true;
            model.for_each_parameter([&](std::span<float>, std::span<float> g) {
              if (first) g[0] = f.value;
              first = false;
            });
          };
          const bool faulty = t == f.step && r.replica_id() == f.replica;
          model.zero_grad();
          auto loss = nn::mse(r, model.forward(r, xl), yl, global_batch);
          if (scaling) scaler.scale_loss_gradient(r, loss);
          model.backward(r, loss.grad, nn::no_input_gradient);
          if (faulty && f.before_reduce) inject();
          r.all_reduce_gradients(model);
          if (faulty && !f.before_reduce) inject();
          if (!scaling) {
            opt.step(r, model);
            return 1;
          }
          return scaler.step(r, opt, model) ? 1 : 0;
        },
        models, opts, scalers);
    out.stepped.emplace_back(stepped.begin(), stepped.end());
    out.scales.push_back(scalers[0].scale());
    s.verify_mirrored(models);
    s.verify_mirrored(opts);
    s.verify_mirrored(scalers);
    if (t == f.step) {
      // Skipped everywhere: parameters and optimiser state as before, the scale backed off.
      BOOST_TEST(models[0].state_digest() == digests_before[0], "step " << t << ": parameters changed");
      BOOST_TEST(opts[0].state_digest() == digests_before[1], "step " << t << ": optimiser state changed");
      BOOST_TEST(scalers[0].scale() == scale_before * 0.5);
      for (const auto& sc : scalers) BOOST_TEST(sc.skipped_steps() == 1);
    }
  }
  out.parameters = parameters_of(models[0]);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(loss_scaling)

BOOST_AUTO_TEST_CASE(clean_steps_are_those_of_training_without_a_scaler_bit_for_bit) {
  for (int replicas : {2, 3}) {
    const auto plain = train(replicas, 6, std::nullopt);
    // PyTorch's defaults (2^16, no change in 6 steps), a scale below 1, and one that grows every 2
    // steps: powers of two all, so scaling and unscaling are exact.
    for (const auto& o : {optim::loss_scale_options{}, optim::loss_scale_options{.init_scale = 0.125},
                          optim::loss_scale_options{.init_scale = 1024, .growth_interval = 2}}) {
      const auto scaled = train(replicas, 6, o);
      BOOST_TEST(same_bits(scaled.parameters, plain.parameters),
                 replicas << " replicas, initial scale " << o.init_scale);
      for (const auto& step : scaled.stepped)
        for (int s : step) BOOST_TEST(s == 1);
    }
    const auto growing = train(replicas, 6, optim::loss_scale_options{.init_scale = 1024, .growth_interval = 2});
    BOOST_TEST(growing.scales == (std::vector<double>{1024, 2048, 2048, 4096, 4096, 8192}),
               boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(an_inf_or_a_nan_in_one_replica_skips_the_step_on_every_replica) {
  for (int replicas : {2, 3})
    for (float bad : {an_inf, -an_inf, a_nan})
      for (bool before_reduce : {false, true}) {
        const fault f{.step = 2, .replica = replicas - 1, .value = bad, .before_reduce = before_reduce};
        BOOST_TEST_CONTEXT(replicas << " replicas, " << bad << (before_reduce ? " before" : " after")
                                    << " the all-reduce") {
          const auto run = train(replicas, 5, optim::loss_scale_options{}, f);  // checks the skip itself
          for (std::size_t t = 0; t < run.stepped.size(); ++t)
            for (int s : run.stepped[t]) BOOST_TEST(s == (t == 2 ? 0 : 1), "step " << t);
          BOOST_TEST(run.scales == (std::vector<double>{65536, 65536, 32768, 32768, 32768}),
                     boost::test_tools::per_element());
        }
      }
}

BOOST_AUTO_TEST_CASE(a_skipped_step_leaves_the_training_as_if_it_had_not_been) {
  // A skipped step followed by clean ones against a run whose third step never happened: the same
  // parameters, bit for bit, when the batches are the same. Built from the same pieces as train():
  // a one-replica-fault run of 4 steps, and a scaler-free run over batches 0, 1, 3 (step 2's skipped).
  for (int replicas : {2, 3}) {
    dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(replicas)};
    auto with = s.mirror([](auto&) { return make_model(); });
    auto without = s.mirror([](auto&) { return make_model(); });
    auto opt_with = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
    auto opt_without = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
    auto scalers = s.mirror([](auto&) { return optim::loss_scaler{{.init_scale = 256}}; });
    for (int t = 0; t < 4; ++t) {
      const auto x = values(global_batch * 3, 100 + static_cast<std::uint32_t>(t));
      const auto y = values(global_batch * 2, 200 + static_cast<std::uint32_t>(t));
      const auto stepped = s.run(
          [&](dist::replica auto& r, auto& a, auto& b, optim::adam<float>& oa, optim::adam<float>& ob,
              optim::loss_scaler& scaler) {
            const std::int64_t lo = global_batch * r.replica_id() / replicas;
            const std::int64_t hi = global_batch * (r.replica_id() + 1) / replicas;
            const tensor<float> xl{shape{hi - lo, 3}, std::vector<float>(x.begin() + lo * 3, x.begin() + hi * 3)};
            const tensor<float> yl{shape{hi - lo, 2}, std::vector<float>(y.begin() + lo * 2, y.begin() + hi * 2)};
            a.zero_grad();
            auto la = nn::mse(r, a.forward(r, xl), yl, global_batch);
            scaler.scale_loss_gradient(r, la);
            a.backward(r, la.grad, nn::no_input_gradient);
            r.all_reduce_gradients(a);
            if (t == 2 && r.replica_id() == 0)
              a.for_each_parameter([](std::span<float>, std::span<float> g) { g[g.size() - 1] = a_nan; });
            const int took = scaler.step(r, oa, a) ? 1 : 0;
            if (t == 2) return took;
            b.zero_grad();
            auto lb = nn::mse(r, b.forward(r, xl), yl, global_batch);
            b.backward(r, lb.grad, nn::no_input_gradient);
            r.all_reduce_gradients(b);
            ob.step(r, b);
            return took;
          },
          with, without, opt_with, opt_without, scalers);
      for (int took : stepped) BOOST_TEST(took == (t != 2 ? 1 : 0), "step " << t);
    }
    s.verify_mirrored(with);
    s.verify_mirrored(opt_with);
    s.verify_mirrored(scalers);
    BOOST_TEST(same_bits(parameters_of(with[0]), parameters_of(without[0])), replicas << " replicas");
    BOOST_TEST(opt_with[0].state_digest() == opt_without[0].state_digest());
    BOOST_TEST(opt_with[0].steps() == 3);
    BOOST_TEST(scalers[1].scale() == 128.0);
    BOOST_TEST(scalers[1].skipped_steps() == 1);
  }
}

namespace {

// One step of a single host copy (no replica) whose gradients are `g` before unscaling: every
// gradient element is set to g, so an inf makes the step skip.
bool step_with_gradient(optim::loss_scaler& scaler, nn::linear<float>& model, optim::sgd<float>& opt, float g) {
  model.for_each_parameter([&](std::span<float>, std::span<float> grad) {
    for (auto& v : grad) v = g;
  });
  return scaler.step(opt, model);
}

}  // namespace

BOOST_AUTO_TEST_CASE(growth_after_exactly_growth_interval_clean_steps) {
  nn::linear<float> model{{.in_features = 2, .out_features = 2}, 3};
  optim::sgd<float> opt{{.lr = 0.1}};
  optim::loss_scaler scaler{{.init_scale = 16, .growth_interval = 3}};
  BOOST_TEST(scaler.scale() == 16.0);
  BOOST_TEST(step_with_gradient(scaler, model, opt, 1.0f));
  BOOST_TEST(step_with_gradient(scaler, model, opt, 1.0f));
  BOOST_TEST(scaler.scale() == 16.0);
  BOOST_TEST(scaler.clean_steps() == 2);
  BOOST_TEST(step_with_gradient(scaler, model, opt, 1.0f));
  BOOST_TEST(scaler.scale() == 32.0);  // the third clean step in a row
  BOOST_TEST(scaler.clean_steps() == 0);
  // A skip resets the count: two clean, one skipped, then three more are needed.
  BOOST_TEST(step_with_gradient(scaler, model, opt, 1.0f));
  BOOST_TEST(step_with_gradient(scaler, model, opt, 1.0f));
  const auto before = parameters_of(model);
  BOOST_TEST(!step_with_gradient(scaler, model, opt, an_inf));
  BOOST_TEST(same_bits(parameters_of(model), before));
  BOOST_TEST(opt.steps() == 5);
  BOOST_TEST(scaler.scale() == 16.0);
  BOOST_TEST(scaler.clean_steps() == 0);
  BOOST_TEST(scaler.skipped_steps() == 1);
  for (int i = 0; i < 2; ++i) BOOST_TEST(step_with_gradient(scaler, model, opt, 1.0f));
  BOOST_TEST(scaler.scale() == 16.0);
  BOOST_TEST(step_with_gradient(scaler, model, opt, 1.0f));
  BOOST_TEST(scaler.scale() == 32.0);
  // The gradient the optimiser saw was unscaled: a gradient of 32 (the scale) steps as 1 would.
  nn::linear<float> a{{.in_features = 2, .out_features = 2}, 4}, b{{.in_features = 2, .out_features = 2}, 4};
  optim::sgd<float> oa{{.lr = 0.1}}, ob{{.lr = 0.1}};
  optim::loss_scaler sc{{.init_scale = 32}};
  BOOST_TEST(step_with_gradient(sc, a, oa, 32.0f));
  b.for_each_parameter([](std::span<float>, std::span<float> g) {
    for (auto& v : g) v = 1.0f;
  });
  ob.step(b);
  BOOST_TEST(same_bits(parameters_of(a), parameters_of(b)));
}

BOOST_AUTO_TEST_CASE(the_scale_stops_at_its_floor_and_its_ceiling) {
  nn::linear<float> model{{.in_features = 2, .out_features = 1}, 5};
  optim::sgd<float> opt{{.lr = 0.1}};
  optim::loss_scaler low{{.init_scale = 16, .min_scale = 4}};
  std::vector<double> scales;
  for (int i = 0; i < 4; ++i) {
    BOOST_TEST(!step_with_gradient(low, model, opt, a_nan));
    scales.push_back(low.scale());
  }
  BOOST_TEST(scales == (std::vector<double>{8, 4, 4, 4}), boost::test_tools::per_element());
  BOOST_TEST(low.skipped_steps() == 4);
  BOOST_TEST(opt.steps() == 0);

  optim::loss_scaler high{{.init_scale = 32, .growth_interval = 1, .max_scale = 64}};
  scales.clear();
  for (int i = 0; i < 3; ++i) {
    BOOST_TEST(step_with_gradient(high, model, opt, 0.5f));
    scales.push_back(high.scale());
  }
  BOOST_TEST(scales == (std::vector<double>{64, 64, 64}), boost::test_tools::per_element());

  // The default range keeps the scale and its reciprocal normal floats.
  optim::loss_scaler dflt;
  BOOST_TEST(dflt.scale() == 65536.0);
  BOOST_TEST(dflt.options().growth_factor == 2.0);
  BOOST_TEST(dflt.options().backoff_factor == 0.5);
  BOOST_TEST(dflt.options().growth_interval == 2000);
  optim::loss_scaler tiny{{.init_scale = 0x1p-125}};
  for (int i = 0; i < 3; ++i) BOOST_TEST(!step_with_gradient(tiny, model, opt, an_inf));
  BOOST_TEST(tiny.scale() == 0x1p-126);
  BOOST_TEST(std::isnormal(static_cast<float>(1.0 / tiny.scale())));
}

BOOST_AUTO_TEST_CASE(a_loss_gradient_is_scaled_and_its_value_is_not) {
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(2)};
  const auto pred = dist::test::random_tensor<float>(shape{4, 2}, 7),
             target = dist::test::random_tensor<float>(shape{4, 2}, 8);
  // Checked on the test's thread: each replica says whether its results were as expected.
  const auto ok = s.run([&](dist::replica auto& r) {
    optim::loss_scaler scaler{{.init_scale = 8}};
    const auto plain = nn::mse(r, pred, target, 8);
    auto scaled = nn::mse(r, pred, target, 8);
    scaler.scale_loss_gradient(r, scaled);
    bool good = scaled.value == plain.value && scaled.grad.size() == plain.grad.size();
    for (std::size_t i = 0; good && i < plain.grad.size(); ++i) good = scaled.grad[i] == 8.0f * plain.grad[i];
    auto g = plain.grad;
    scaler.scale_loss_gradient(r, g);
    for (std::size_t i = 0; good && i < g.size(); ++i) good = g[i] == scaled.grad[i];
    return good ? 1 : 0;
  });
  for (int good : ok) BOOST_TEST(good == 1);
  optim::loss_scaler scaler{{.init_scale = 0.25}};
  auto host = nn::mse(pred, target, 4);
  const auto grad = host.grad;
  scaler.scale_loss_gradient(host);
  for (std::size_t i = 0; i < grad.size(); ++i) BOOST_TEST(host.grad[i] == 0.25f * grad[i]);
}

BOOST_AUTO_TEST_CASE(state_round_trips_and_bad_state_is_a_clear_error) {
  nn::linear<float> model{{.in_features = 2, .out_features = 1}, 6};
  optim::sgd<float> opt{{.lr = 0.1}};
  optim::loss_scaler scaler{{.init_scale = 1024, .growth_interval = 5}};
  step_with_gradient(scaler, model, opt, 1.0f);
  step_with_gradient(scaler, model, opt, an_inf);
  step_with_gradient(scaler, model, opt, 1.0f);
  step_with_gradient(scaler, model, opt, 1.0f);
  BOOST_TEST(scaler.scale() == 512.0);
  BOOST_TEST(scaler.clean_steps() == 2);
  BOOST_TEST(scaler.skipped_steps() == 1);
  std::stringstream saved;
  scaler.save(saved);
  const std::string bytes = saved.str();
  BOOST_TEST(bytes.size() == 8u + 8u + 8u + 8u);

  optim::loss_scaler loaded{{.init_scale = 1024, .growth_interval = 5}};
  BOOST_TEST(loaded.state_digest() != scaler.state_digest());
  std::istringstream in(bytes);
  loaded.load(in);
  BOOST_TEST(loaded.state_digest() == scaler.state_digest());
  BOOST_TEST(loaded.scale() == 512.0);
  BOOST_TEST(loaded.clean_steps() == 2);
  BOOST_TEST(loaded.skipped_steps() == 1);
  // It carries on from there: three more clean steps grow the scale.
  for (int i = 0; i < 3; ++i) step_with_gradient(loaded, model, opt, 1.0f);
  BOOST_TEST(loaded.scale() == 1024.0);
  // A checkpoint section, like an optimiser's.
  dist::checkpoint::archive archive;
  archive.put_state("scaler", scaler);
  optim::loss_scaler restored{{.init_scale = 1024, .growth_interval = 5}};
  archive.get_state("scaler", restored);
  BOOST_TEST(restored.state_digest() == scaler.state_digest());

  // Every bad state leaves the scaler as it was.
  const std::uint64_t kept = scaler.state_digest();
  auto load_error = [&](const std::string& b) {
    const std::string what = error_of([&] {
      std::istringstream is(b);
      scaler.load(is);
    });
    BOOST_TEST(scaler.state_digest() == kept, "a failed load changed the state: " << what);
    return what;
  };
  for (std::size_t n = 0; n < bytes.size(); ++n)
    BOOST_TEST(mentions(load_error(bytes.substr(0, n)), "truncated loss scaler state"), n << " bytes");
  // Another optimiser's state.
  std::stringstream sgd_state;
  opt.save(sgd_state);
  BOOST_TEST(mentions(load_error(sgd_state.str()), "not a saved loss scaler state"));
  auto with_scale = [&](double v) {
    std::string b = bytes;
    std::memcpy(b.data() + 8, &v, sizeof v);
    return b;
  };
  for (double v : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(), 0.0, -2.0})
    BOOST_TEST(mentions(load_error(with_scale(v)), "corrupt loss scaler state: the scale is"), v);
  BOOST_TEST(mentions(load_error(with_scale(0x1p127)), "outside this scaler's [min_scale, max_scale]"));
  auto with_count = [&](std::size_t at, std::int64_t v) {
    std::string b = bytes;
    std::memcpy(b.data() + at, &v, sizeof v);
    return b;
  };
  BOOST_TEST(mentions(load_error(with_count(16, -1)), "corrupt loss scaler state: a negative step count"));
  BOOST_TEST(mentions(load_error(with_count(24, -5)), "corrupt loss scaler state: a negative step count"));
  // A scaler with a narrower range refuses a scale outside it.
  optim::loss_scaler narrow{{.init_scale = 1, .min_scale = 1, .max_scale = 256}};
  std::istringstream is(bytes);
  BOOST_TEST(mentions(error_of([&] { narrow.load(is); }), "scale of 512, outside"));
  BOOST_TEST(narrow.scale() == 1.0);
}

BOOST_AUTO_TEST_CASE(options_out_of_range_are_named) {
  auto error = [](optim::loss_scale_options o) {
    return error_of([&] { [[maybe_unused]] const optim::loss_scaler made{o}; });
  };
  BOOST_TEST(mentions(error({.init_scale = 0}), "init_scale is 0 but must be a finite positive float"));
  BOOST_TEST(mentions(error({.init_scale = std::numeric_limits<double>::infinity()}), "init_scale is inf"));
  BOOST_TEST(mentions(error({.init_scale = std::numeric_limits<double>::quiet_NaN()}), "init_scale is nan"));
  BOOST_TEST(mentions(error({.max_scale = 0x1p127}), "max_scale is"));
  BOOST_TEST(mentions(error({.min_scale = 0x1p-127}), "min_scale is"));
  BOOST_TEST(mentions(error({.min_scale = 8, .max_scale = 4}), "min_scale is 8 but must not exceed max_scale (4)"));
  BOOST_TEST(
      mentions(error({.init_scale = 2, .min_scale = 4}), "init_scale is 2 but must lie in [min_scale, max_scale]"));
  BOOST_TEST(mentions(error({.growth_factor = 1}), "growth_factor is 1 but must be finite and above 1"));
  BOOST_TEST(mentions(error({.backoff_factor = 1}), "backoff_factor is 1 but must be in (0, 1)"));
  BOOST_TEST(mentions(error({.backoff_factor = 0}), "backoff_factor is 0"));
  BOOST_TEST(mentions(error({.growth_interval = 0}), "growth_interval is 0 but must be at least 1"));
  BOOST_TEST(error({.init_scale = 1, .min_scale = 1}) == "no error");
}

BOOST_AUTO_TEST_SUITE_END()
