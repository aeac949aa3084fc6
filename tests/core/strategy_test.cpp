// The cross-replica operations of the strategies: run, reduce, gather, local_results, scatter,
// values_from_function, mirror, broadcast, verify_mirrored, run_on_primary. Written once and
// instantiated for one device and for mirrored replicas.

#include "test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <numeric>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace dist = distribute;

namespace {

// Strategy makers for the typed tests: each names a strategy and its replica count.
struct one_device {
  static constexpr int replicas = 1;
  static dist::one_device_strategy<> make() { return {}; }
};
template <int N>
struct mirrored_n {
  static constexpr int replicas = N;
  static dist::mirrored_strategy<> make() { return dist::mirrored_strategy<>{dist::cpu_replicas(N)}; }
};
using strategies = boost::mpl::list<one_device, mirrored_n<1>, mirrored_n<2>, mirrored_n<3>, mirrored_n<4>>;

// A model as the strategies see it, without the nn layer: a parameter and a buffer (a running
// statistic), and no state_digest of its own.
struct model_with_buffer {
  using scalar_type = float;
  std::vector<float> w = std::vector<float>(3, 0.5f), g = std::vector<float>(3, 0.0f);
  std::vector<double> running = std::vector<double>(2, 1.0);
  template <class F>
  void for_each_parameter(F&& f) {
    f(std::span<float>(w), std::span<float>(g));
  }
  template <class F>
  void for_each_buffer(F&& f) {
    f(std::span<double>(running));
  }
};

// A least-squares model trained by gradient descent, written once against the concepts: the mean
// squared error over the GLOBAL batch, so gradients are summed across replicas.
template <dist::strategy S>
std::vector<double> train_linear(S& s, int steps) {
  const int features = 3, batch = 12;
  std::vector<double> x(static_cast<std::size_t>(batch * features)), y(static_cast<std::size_t>(batch));
  for (int i = 0; i < batch; ++i) {
    for (int f = 0; f < features; ++f)
      x[static_cast<std::size_t>(i * features + f)] = std::sin(1.0 + i * 0.7 + f * 1.3);
    y[static_cast<std::size_t>(i)] =
        2.0 * x[static_cast<std::size_t>(i * features)] - x[static_cast<std::size_t>(i * features + 2)] + 0.5;
  }
  auto xs = s.scatter(x, features);
  auto ys = s.scatter(y);
  auto w = s.mirror([&](auto&) { return std::vector<double>(features + 1, 0.0); });
  for (int step = 0; step < steps; ++step) {
    s.run(
        [&](dist::replica auto& r, const std::vector<double>& xl, const std::vector<double>& yl,
            std::vector<double>& wl) {
          std::vector<double> grad(features + 1, 0.0);
          for (std::size_t i = 0; i < yl.size(); ++i) {
            double pred = wl[features];
            for (int f = 0; f < features; ++f)
              pred += wl[static_cast<std::size_t>(f)] * xl[i * features + static_cast<std::size_t>(f)];
            const double err = (pred - yl[i]) * 2.0 / batch;
            for (int f = 0; f < features; ++f)
              grad[static_cast<std::size_t>(f)] += err * xl[i * features + static_cast<std::size_t>(f)];
            grad[features] += err;
          }
          r.all_reduce(dist::reduce_op::sum, grad);
          for (std::size_t k = 0; k < grad.size(); ++k) wl[k] -= 0.1 * grad[k];
        },
        xs, ys, w);
  }
  s.verify_mirrored(w);
  return w[0];
}

}  // namespace

BOOST_AUTO_TEST_SUITE(strategy)

BOOST_AUTO_TEST_CASE_TEMPLATE(run_returns_one_result_per_replica_in_order, M, strategies) {
  auto s = M::make();
  BOOST_TEST(s.num_replicas_in_sync() == M::replicas);
  // Assertions stay on the test thread: the step only reports what it saw.
  auto seen = s.run([](dist::replica auto& r) { return std::pair{r.num_replicas(), r.device().index()}; });
  for (int i = 0; i < M::replicas; ++i) {
    BOOST_TEST(seen[static_cast<std::size_t>(i)].first == M::replicas);
    BOOST_TEST(seen[static_cast<std::size_t>(i)].second == i);
  }
  auto ids = s.run([](dist::replica auto& r) { return r.replica_id() * 10; });
  BOOST_TEST(ids.size() == static_cast<std::size_t>(M::replicas));
  for (int i = 0; i < M::replicas; ++i) BOOST_TEST(ids[static_cast<std::size_t>(i)] == 10 * i);
  const auto local = s.local_results(ids);
  BOOST_TEST(std::vector<int>(local.begin(), local.end()) == std::vector<int>(ids.begin(), ids.end()),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_step_may_return_a_flag, M, strategies) {
  // bool results are real bools per replica (not std::vector<bool>'s packed bits): they can be
  // referenced, changed in place and passed back into a step.
  auto s = M::make();
  auto odd = s.run([](dist::replica auto& r) { return r.replica_id() % 2 == 1; });
  for (int i = 0; i < M::replicas; ++i) BOOST_TEST(odd[static_cast<std::size_t>(i)] == (i % 2 == 1));
  s.run([](auto&, bool& mine) { mine = !mine; }, odd);
  auto copy = odd;
  for (int i = 0; i < M::replicas; ++i) BOOST_TEST(copy[static_cast<std::size_t>(i)] == (i % 2 == 0));
  const auto flags = s.values_from_function([](int id) { return id == 0; });
  BOOST_TEST(flags.values().size() == static_cast<std::size_t>(M::replicas));
  BOOST_TEST(flags.primary());
}

BOOST_AUTO_TEST_CASE_TEMPLATE(run_unwraps_per_replica_and_shares_other_arguments, M, strategies) {
  auto s = M::make();
  auto per = s.values_from_function([](int id) { return id + 100; });
  const int shared = 7;
  std::vector<int> seen(static_cast<std::size_t>(M::replicas), -1);
  s.run([&](auto& r, int& mine, const int& common) { seen[static_cast<std::size_t>(r.replica_id())] = mine + common; },
        per, shared);
  for (int i = 0; i < M::replicas; ++i) BOOST_TEST(seen[static_cast<std::size_t>(i)] == i + 107);
  // The replica may change its own element in place.
  s.run([](auto&, int& mine) { mine *= 2; }, per);
  for (int i = 0; i < M::replicas; ++i) BOOST_TEST(per[static_cast<std::size_t>(i)] == 2 * (i + 100));
}

BOOST_AUTO_TEST_CASE_TEMPLATE(reduce_every_op, M, strategies) {
  auto s = M::make();
  const int n = M::replicas;
  auto v = s.values_from_function([](int id) { return static_cast<double>(id + 1); });
  BOOST_TEST(s.reduce(dist::reduce_op::sum, v) == n * (n + 1) / 2.0);
  BOOST_TEST(s.reduce(dist::reduce_op::mean, v) == (n + 1) / 2.0);
  BOOST_TEST(s.reduce(dist::reduce_op::min, v) == 1.0);
  BOOST_TEST(s.reduce(dist::reduce_op::max, v) == static_cast<double>(n));
  double factorial = 1;
  for (int i = 2; i <= n; ++i) factorial *= i;
  BOOST_TEST(s.reduce(dist::reduce_op::prod, v) == factorial);
  // Sequences reduce element-wise.
  auto seq = s.values_from_function([](int id) { return std::vector<float>{float(id), 1.0f, -float(id)}; });
  const auto summed = s.reduce(dist::reduce_op::sum, seq);
  BOOST_TEST(summed == (std::vector<float>{float(n * (n - 1) / 2), float(n), -float(n * (n - 1) / 2)}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(reduce_rejects_uneven_sequences_and_foreign_values) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  auto uneven = s.values_from_function([](int id) { return std::vector<float>(static_cast<std::size_t>(id + 1)); });
  BOOST_CHECK_THROW(s.reduce(dist::reduce_op::sum, uneven), std::invalid_argument);
  dist::mirrored_strategy<> three{dist::cpu_replicas(3)};
  auto from_three = three.values_from_function([](int id) { return id; });
  BOOST_CHECK_THROW(s.reduce(dist::reduce_op::sum, from_three), std::invalid_argument);
  BOOST_CHECK_THROW(s.run([](auto&, int&) {}, from_three), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(gather_concatenates_in_replica_order, M, strategies) {
  auto s = M::make();
  auto scalars = s.values_from_function([](int id) { return id * 3; });
  std::vector<int> expected(static_cast<std::size_t>(M::replicas));
  for (int i = 0; i < M::replicas; ++i) expected[static_cast<std::size_t>(i)] = 3 * i;
  BOOST_TEST(s.gather(scalars) == expected, boost::test_tools::per_element());
  // Uneven parts, including empty ones.
  auto parts = s.values_from_function([](int id) { return std::vector<int>(static_cast<std::size_t>(id), id); });
  std::vector<int> concat;
  for (int i = 0; i < M::replicas; ++i) concat.insert(concat.end(), static_cast<std::size_t>(i), i);
  BOOST_TEST(s.gather(parts) == concat, boost::test_tools::per_element());
  BOOST_CHECK_THROW(s.gather(parts, 1), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(scatter_splits_exactly) {
  // For every replica count and batch size, divisible or not: the parts, in order, are the batch;
  // sizes differ by at most one, larger parts first.
  for (int n = 1; n <= 4; ++n) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    for (int b = 0; b <= 13; ++b) {
      std::vector<int> batch(static_cast<std::size_t>(b));
      std::iota(batch.begin(), batch.end(), 0);
      const auto parts = s.scatter(batch);
      BOOST_TEST_REQUIRE(parts.size() == static_cast<std::size_t>(n));
      std::vector<int> joined;
      for (int r = 0; r < n; ++r) {
        const auto& p = parts[static_cast<std::size_t>(r)];
        BOOST_TEST(p.size() == static_cast<std::size_t>(b / n + (r < b % n ? 1 : 0)));
        joined.insert(joined.end(), p.begin(), p.end());
      }
      BOOST_TEST(joined == batch, boost::test_tools::per_element());
      BOOST_TEST(s.gather(parts) == batch, boost::test_tools::per_element());
    }
  }
}

BOOST_AUTO_TEST_CASE(scatter_keeps_examples_whole) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  const std::vector<float> batch{0, 1, 2, 3, 4, 5, 6, 7, 8};  // three examples of three features
  const auto parts = s.scatter(batch, 3);
  BOOST_TEST(parts[0] == (std::vector<float>{0, 1, 2, 3, 4, 5}), boost::test_tools::per_element());
  BOOST_TEST(parts[1] == (std::vector<float>{6, 7, 8}), boost::test_tools::per_element());
  // Any contiguous batch, mutable or not.
  std::array<float, 4> arr{1, 2, 3, 4};
  BOOST_TEST(s.scatter(std::span<float>(arr))[1] == (std::vector<float>{3, 4}), boost::test_tools::per_element());
  BOOST_TEST(s.scatter(arr, 2)[0] == (std::vector<float>{1, 2}), boost::test_tools::per_element());
  BOOST_CHECK_THROW(s.scatter(batch, 4), std::invalid_argument);
  BOOST_CHECK_THROW(s.scatter(batch, 0), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(mirror_creates_identical_copies_per_device, M, strategies) {
  auto s = M::make();
  std::vector<int> devices_seen;
  auto m = s.mirror([&](dist::cpu& d) {
    devices_seen.push_back(d.index());
    return std::vector<float>{1.5f, 2.5f};
  });
  BOOST_TEST(m.size() == static_cast<std::size_t>(M::replicas));
  std::vector<int> expected(static_cast<std::size_t>(M::replicas));
  std::iota(expected.begin(), expected.end(), 0);
  BOOST_TEST(devices_seen == expected, boost::test_tools::per_element());
  s.verify_mirrored(m);
  // Each replica sees its own copy.
  s.run([](auto& r, std::vector<float>& mine) { mine[0] += static_cast<float>(r.replica_id()); }, m);
  for (int i = 0; i < M::replicas; ++i) BOOST_TEST(m[static_cast<std::size_t>(i)][0] == 1.5f + static_cast<float>(i));
}

BOOST_AUTO_TEST_CASE(primary_update_then_broadcast_restores_identity) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
  auto weights = s.mirror([](auto&) { return std::vector<double>(4, 1.0); });
  auto steps = s.mirror([](auto&) { return 0; });
  // An update on the primary only: mirrored arguments are unwrapped to the primary's copy, and the
  // primary context is a group of one, so its collectives are no-ops.
  const int replicas_seen = s.run_on_primary(
      [](dist::replica auto& r, std::vector<double>& w, int& step) {
        w[2] = 5.0;
        ++step;
        r.all_reduce(dist::reduce_op::sum, w);
        return r.num_replicas();
      },
      weights, steps);
  BOOST_TEST(replicas_seen == 1);
  BOOST_TEST(weights[0][2] == 5.0);
  BOOST_TEST(weights[1][2] == 1.0);
  try {
    s.verify_mirrored(weights);
    BOOST_FAIL("verify_mirrored missed a divergence");
  } catch (const dist::mirrored_divergence& e) {
    BOOST_TEST(std::string(e.what()).find("1, 2") != std::string::npos, e.what());
  }
  BOOST_CHECK_THROW(s.verify_mirrored(steps), dist::mirrored_divergence);
  s.broadcast(weights);
  s.broadcast(steps, 0);
  s.verify_mirrored(weights);
  s.verify_mirrored(steps);
  BOOST_TEST(weights[2][2] == 5.0);
  BOOST_TEST(steps[1] == 1);
  // Broadcast from another replica.
  weights[1][0] = -1.0;
  s.broadcast(weights, 1);
  for (const auto& w : weights) BOOST_TEST(w[0] == -1.0);
  BOOST_CHECK_THROW(s.broadcast(weights, 3), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(verify_mirrored_covers_a_models_buffers, M, strategies) {
  auto s = M::make();
  auto models = s.mirror([](auto&) { return model_with_buffer{}; });
  s.verify_mirrored(models);
  // Each replica updates its running statistic from its own data: the buffers differ, the parameters
  // do not.
  s.run([](dist::replica auto& r, model_with_buffer& m) { m.running[1] += r.replica_id(); }, models);
  std::string differ;
  for (int q = 1; q < M::replicas; ++q) differ += (differ.empty() ? "" : ", ") + std::to_string(q);
  if (M::replicas > 1) {
    try {
      s.verify_mirrored(models);
      BOOST_FAIL("verify_mirrored missed diverged buffers");
    } catch (const dist::mirrored_divergence& e) {
      const std::string what = e.what();
      BOOST_TEST(what.find("on replica(s) " + differ + ";") != std::string::npos, what);
      BOOST_TEST(what.find("buffers (such as batch norm's running statistics) differ on replica(s) " + differ) !=
                     std::string::npos,
                 what);
      BOOST_TEST(what.find("parameters differ") == std::string::npos, what);
    }
    // A parameter as well, on the last replica only.
    models[static_cast<std::size_t>(M::replicas - 1)].w[0] = 2.0f;
    try {
      s.verify_mirrored(models);
      BOOST_FAIL("verify_mirrored missed diverged parameters");
    } catch (const dist::mirrored_divergence& e) {
      BOOST_TEST(std::string(e.what()).find("parameters differ on replica(s) " + std::to_string(M::replicas - 1) +
                                            ";") != std::string::npos,
                 e.what());
    }
  }
  // broadcast copies the primary's buffers with its parameters.
  s.broadcast(models);
  s.verify_mirrored(models);
  for (const auto& m : models) BOOST_TEST(m.running[1] == 1.0);
  for (const auto& m : models) BOOST_TEST(m.w[0] == 0.5f);
}

BOOST_AUTO_TEST_CASE(data_parallel_training_matches_one_device) {
  dist::one_device_strategy<> one;
  const auto reference = train_linear(one, 50);
  for (int n = 1; n <= 4; ++n) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    const auto w = train_linear(s, 50);
    for (std::size_t k = 0; k < w.size(); ++k) BOOST_TEST(w[k] == reference[k], boost::test_tools::tolerance(1e-12));
  }
}

BOOST_AUTO_TEST_CASE(replica_threads_persist_across_steps) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(4)};
  auto first = s.run([](auto&) { return std::this_thread::get_id(); });
  auto second = s.run([](auto&) { return std::this_thread::get_id(); });
  BOOST_TEST((first[0] == std::this_thread::get_id()), "the primary runs on the calling thread");
  for (std::size_t i = 0; i < 4; ++i) BOOST_TEST((first[i] == second[i]));
  for (std::size_t i = 0; i < 4; ++i)
    for (std::size_t j = i + 1; j < 4; ++j) BOOST_TEST((first[i] != first[j]));
}

BOOST_AUTO_TEST_CASE(strategies_move) {
  dist::mirrored_strategy<> a{dist::cpu_replicas(2)};
  dist::mirrored_strategy<> b = std::move(a);
  auto r = b.run([](auto& r) { return r.all_reduce(dist::reduce_op::sum, 1); });
  BOOST_TEST(b.reduce(dist::reduce_op::sum, r) == 4);
}

BOOST_AUTO_TEST_SUITE_END()
