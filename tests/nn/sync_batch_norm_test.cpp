// sync_batch_norm: Chan's merge; equality with batch norm over the concatenated batch for uneven
// per-replica batches (an empty replica included), forward, backward and running statistics; eval
// mode without communication; plain batch norm under one device.

#include "nn_test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <cstring>
#include <numeric>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::shape;
using dist::tensor;

namespace {

constexpr std::int64_t channels = 3, height = 4, width = 2, example = channels * height * width;

// Examples [begin, begin + count) of `all` as a tensor.
template <class T>
tensor<T> slice(const tensor<T>& all, std::int64_t begin, std::int64_t count) {
  std::vector<T> v(all.begin() + begin * example, all.begin() + (begin + count) * example);
  return tensor<T>{shape::nchw(count, channels, height, width), std::move(v)};
}

struct replica_result {
  std::vector<double> y, dx, dgamma, dbeta, running_mean, running_var;
};

// Forward + backward of sync_batch_norm on the replicas' parts of (x, dy), parts of `counts` examples;
// the gamma/beta gradients are combined with all_reduce_gradients as in training.
template <template <class> class BN>
std::vector<replica_result> run_replicas(const std::vector<std::int64_t>& counts, const tensor<double>& x,
                                         const tensor<double>& dy) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(static_cast<int>(counts.size()))};
  auto layers = s.mirror([](auto&) { return BN<double>{{.channels = channels}, 17}; });
  auto results = s.run(
      [&](dist::replica auto& r, BN<double>& bn) {
        std::int64_t begin = 0;
        for (int q = 0; q < r.replica_id(); ++q) begin += counts[static_cast<std::size_t>(q)];
        const auto n = counts[static_cast<std::size_t>(r.replica_id())];
        replica_result out;
        const auto y = bn.forward(r, slice(x, begin, n));
        bn.zero_grad();
        const auto dx = bn.backward(r, slice(dy, begin, n));
        r.all_reduce_gradients(bn);
        out.y.assign(y.begin(), y.end());
        out.dx.assign(dx.begin(), dx.end());
        out.dgamma.assign(bn.gamma().grad.begin(), bn.gamma().grad.end());
        out.dbeta.assign(bn.beta().grad.begin(), bn.beta().grad.end());
        out.running_mean = bn.running_mean();
        out.running_var = bn.running_var();
        return out;
      },
      layers);
  return {results.begin(), results.end()};
}

std::vector<double> concat(const std::vector<replica_result>& rs, std::vector<double> replica_result::* field) {
  std::vector<double> v;
  for (const auto& r : rs) v.insert(v.end(), (r.*field).begin(), (r.*field).end());
  return v;
}

double max_abs_diff(std::span<const double> a, std::span<const double> b) {
  BOOST_TEST_REQUIRE(a.size() == b.size());
  double m = 0;
  for (std::size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sync_batch_norm)

BOOST_AUTO_TEST_CASE(chan_merge_is_exact_for_any_split) {
  std::vector<double> v(13);
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<double>(i) * 1.7) * 10 + 3;
  const auto whole = nn::detail::channel_moments(v.data(), 1, 1, 13, 0);
  // Splits with empty parts first, in the middle and last.
  for (const auto& split : {std::vector<long long>{13}, {5, 3, 0, 5}, {0, 13}, {1, 1, 11, 0}, {6, 7}}) {
    nn::detail::moments acc{};
    long long begin = 0;
    for (long long n : split) {
      acc = nn::detail::merge(acc, nn::detail::channel_moments(v.data() + begin, 1, 1, n, 0));
      begin += n;
    }
    BOOST_TEST(acc.count == whole.count);
    BOOST_TEST(acc.mean == whole.mean, boost::test_tools::tolerance(1e-13));
    BOOST_TEST(acc.m2 == whole.m2, boost::test_tools::tolerance(1e-12));
  }
  const auto empty = nn::detail::merge({}, {});
  BOOST_TEST(empty.count == 0.0);
}

BOOST_AUTO_TEST_CASE(uneven_replicas_equal_batch_norm_over_the_concatenated_batch) {
  const std::vector<std::int64_t> counts{5, 3, 0, 4};
  const std::int64_t total = 12;
  const auto x = dist::test::random_tensor<double>(shape::nchw(total, channels, height, width), 31, -3.0, 5.0);
  const auto dy = dist::test::random_tensor<double>(x.shape(), 32);

  nn::batch_norm<double> ref{{.channels = channels}, 17};
  auto r = nn::local();
  const auto y_ref = ref.forward(r, x);
  ref.zero_grad();
  const auto dx_ref = ref.backward(r, dy);

  const auto rs = run_replicas<nn::sync_batch_norm>(counts, x, dy);
  BOOST_TEST(max_abs_diff(concat(rs, &replica_result::y), y_ref.values()) < 1e-12);
  BOOST_TEST(max_abs_diff(concat(rs, &replica_result::dx), dx_ref.values()) < 1e-12);
  for (const auto& q : rs) {
    BOOST_TEST(max_abs_diff(q.dgamma, ref.gamma().grad.values()) < 1e-12);
    BOOST_TEST(max_abs_diff(q.dbeta, ref.beta().grad.values()) < 1e-12);
    BOOST_TEST(max_abs_diff(q.running_mean, ref.running_mean()) < 1e-13);
    BOOST_TEST(max_abs_diff(q.running_var, ref.running_var()) < 1e-13);
  }
  // And the result is the same on every replica bit for bit where it is shared.
  for (const auto& q : rs) BOOST_TEST(q.running_var == rs[0].running_var);

  // Plain batch norm normalises each part by its own statistics: not the global result (this is why
  // sync_batch_norm exists). Replica 2 has no examples, so the parts here are 5, 3 and 4 of 3 replicas.
  const auto plain = run_replicas<nn::batch_norm>({5, 3, 4}, x, dy);
  BOOST_TEST(max_abs_diff(concat(plain, &replica_result::y), y_ref.values()) > 1e-3);
  BOOST_TEST(max_abs_diff(concat(plain, &replica_result::dx), dx_ref.values()) > 1e-3);
}

BOOST_AUTO_TEST_CASE(float_replicas_match_within_rounding) {
  const auto xd = dist::test::random_tensor<double>(shape::nchw(9, channels, height, width), 41, -1.0, 2.0);
  tensor<float> x{xd.shape()};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(xd[i]);
  nn::batch_norm<float> ref{{.channels = channels}, 3};
  auto r = nn::local();
  const auto y_ref = ref.forward(r, x);

  dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
  auto layers = s.mirror([](auto&) { return nn::sync_batch_norm<float>{{.channels = channels}, 3}; });
  const std::int64_t counts[] = {2, 7, 0};
  auto ys = s.run(
      [&](dist::replica auto& q, nn::sync_batch_norm<float>& bn) {
        std::int64_t begin = 0;
        for (int i = 0; i < q.replica_id(); ++i) begin += counts[i];
        return bn.forward(q, slice(x, begin, counts[q.replica_id()]));
      },
      layers);
  std::vector<float> y;
  for (const auto& t : ys) y.insert(y.end(), t.begin(), t.end());
  BOOST_TEST(dist::test::relative_error_of<float>(y, y_ref.values()) < 1e-6);
}

BOOST_AUTO_TEST_CASE(eval_mode_uses_running_statistics_and_does_not_communicate) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(2)};
  auto layers = s.mirror([](auto&) { return nn::sync_batch_norm<double>{{.channels = channels}, 5}; });
  const auto x = dist::test::random_tensor<double>(shape::nchw(4, channels, height, width), 51, 1.0, 4.0);
  s.run([&](dist::replica auto& r, nn::sync_batch_norm<double>& bn) { bn.forward(r, slice(x, 2 * r.replica_id(), 2)); },
        layers);
  const auto mean = layers[0].running_mean(), var = layers[0].running_var();
  BOOST_TEST(mean[0] != 0.0);  // updated from the batch
  // Only replica 0 runs the eval forward and backward: a collective inside would never complete.
  auto outputs = s.run(
      [&](dist::replica auto& r, nn::sync_batch_norm<double>& bn) {
        bn.set_training(false);
        if (r.replica_id() != 0) return tensor<double>{};
        auto y = bn.forward(r, x);
        bn.backward(r, y);
        return y;
      },
      layers);
  const auto& y = outputs[0];
  auto& bn = layers[0];
  double worst = 0;
  for (std::int64_t e = 0; e < 4; ++e)
    for (std::int64_t c = 0; c < channels; ++c)
      for (std::int64_t i = 0; i < height; ++i)
        for (std::int64_t j = 0; j < width; ++j) {
          const auto cc = static_cast<std::size_t>(c);
          const double expected =
              bn.gamma().value[cc] * (x(e, c, i, j) - mean[cc]) / std::sqrt(var[cc] + 1e-5) + bn.beta().value[cc];
          worst = std::max(worst, std::abs(y(e, c, i, j) - expected));
        }
  BOOST_TEST(worst < 1e-12);
  BOOST_TEST(bn.running_mean() == mean);  // eval mode leaves the statistics alone
}

BOOST_AUTO_TEST_CASE(under_one_device_it_is_batch_norm) {
  static_assert(!nn::detail::communicates<nn::local_replica>,
                "sync_batch_norm compiles its collectives out under the local communicator");
  static_assert(nn::detail::communicates<dist::mirrored_strategy<>::replica_type>);
  dist::one_device_strategy<> s;
  const auto x = dist::test::random_tensor<float>(shape::nchw(6, channels, height, width), 61);
  const auto dy = dist::test::random_tensor<float>(x.shape(), 62);
  auto sync = s.mirror([](auto&) { return nn::sync_batch_norm<float>{{.channels = channels}, 9}; });
  nn::batch_norm<float> plain{{.channels = channels}, 9};
  auto out = s.run(
      [&](dist::replica auto& r, nn::sync_batch_norm<float>& bn) {
        auto y = bn.forward(r, x);
        auto dx = bn.backward(r, dy);
        return std::pair{y, dx};
      },
      sync);
  auto r = nn::local();
  const auto y = plain.forward(r, x);
  const auto dx = plain.backward(r, dy);
  BOOST_TEST((out[0].first == y));  // bit for bit
  BOOST_TEST((out[0].second == dx));
  BOOST_TEST((sync[0].gamma().grad == plain.gamma().grad));
}

BOOST_AUTO_TEST_SUITE_END()
