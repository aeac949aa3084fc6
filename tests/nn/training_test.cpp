// Optimisers against hand-computed references; fused gradient all-reduce; data-parallel equivalence
// of a conv net with sync_batch_norm over 1 to 4 replicas; bit-identical reruns.

#include "nn_test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstring>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace optim = distribute::optim;
using dist::shape;
using dist::tensor;

namespace {

// The smallest parameterized model: a few flat parameter tensors with hand-set gradients.
template <class T>
struct flat_model {
  using scalar_type = T;
  std::vector<std::vector<T>> values, grads;

  explicit flat_model(std::vector<std::size_t> sizes) {
    for (auto n : sizes) {
      values.emplace_back(n, T(0));
      grads.emplace_back(n, T(0));
    }
  }
  template <class F>
  void for_each_parameter(F&& f) {
    for (std::size_t i = 0; i < values.size(); ++i) f(std::span<T>(values[i]), std::span<T>(grads[i]));
  }
};
static_assert(nn::parameterized<flat_model<float>>);
static_assert(!nn::parameterized<std::vector<float>>);

}  // namespace

BOOST_AUTO_TEST_SUITE(optimisers)

BOOST_AUTO_TEST_CASE(adam_matches_a_hand_computed_reference) {
  // lr 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01; gradients chosen per step.
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd = 0.01;
  flat_model<double> model({2});
  model.values[0] = {1.0, -2.0};
  optim::adam<double> opt{{.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd}};
  const double grads[3][2] = {{0.5, -1.0}, {0.25, 2.0}, {-0.1, 0.0}};
  // The textbook algorithm, step by step, in plain scalars.
  double p[2] = {1.0, -2.0}, m[2] = {0, 0}, v[2] = {0, 0};
  for (int t = 1; t <= 3; ++t) {
    model.grads[0] = {grads[t - 1][0], grads[t - 1][1]};
    opt.step(model);
    for (int i = 0; i < 2; ++i) {
      const double g = grads[t - 1][i] + wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(b1, t)), v_hat = v[i] / (1 - std::pow(b2, t));
      p[i] -= lr * m_hat / (std::sqrt(v_hat) + eps);
      BOOST_TEST(model.values[0][static_cast<std::size_t>(i)] == p[i], boost::test_tools::tolerance(1e-12));
    }
    if (t == 1) {
      // By hand: after one step m_hat = g and v_hat = g^2, so the update is lr * sign(g) (to eps).
      BOOST_TEST(model.values[0][0] == 1.0 - 0.1, boost::test_tools::tolerance(1e-7));
      BOOST_TEST(model.values[0][1] == -2.0 + 0.1, boost::test_tools::tolerance(1e-7));
    }
  }
  // Element 0 by hand: g1 = 0.5 + 0.01*1 = 0.51, m1 = 0.051, v1 = 0.0002601, p1 = 0.9;
  // g2 = 0.25 + 0.01*0.9 = 0.259, m2 = 0.9*0.051 + 0.1*0.259 = 0.0718,
  // v2 = 0.999*0.0002601 + 0.001*0.067081 = 0.00032692, p2 = 0.9 - 0.1*(0.0718/0.19)/sqrt(v2/0.001999)
  // = 0.806555; g3 = -0.1 + 0.01*p2, m3 = 0.0554266, v3 = 0.000335046, p3 = 0.745385.
  BOOST_TEST(model.values[0][0] == 0.745385, boost::test_tools::tolerance(1e-6));
  BOOST_TEST(opt.steps() == 3);
}

BOOST_AUTO_TEST_CASE(sgd_with_momentum_matches_a_hand_computed_reference) {
  flat_model<double> model({1});
  model.values[0] = {1.0};
  optim::sgd<double> opt{{.lr = 0.1, .momentum = 0.9}};
  // v1 = 1, p = 0.9; v2 = 0.9 + 2 = 2.9, p = 0.61; v3 = 2.61 - 1 = 1.61, p = 0.449.
  const double g[3] = {1.0, 2.0, -1.0}, expected[3] = {0.9, 0.61, 0.449};
  for (int t = 0; t < 3; ++t) {
    model.grads[0] = {g[t]};
    opt.step(model);
    BOOST_TEST(model.values[0][0] == expected[t], boost::test_tools::tolerance(1e-14));
  }
}

BOOST_AUTO_TEST_CASE(state_round_trips_bit_for_bit) {
  auto run = [](auto& opt, flat_model<float>& model, int from, int to) {
    for (int t = from; t < to; ++t) {
      for (std::size_t i = 0; i < model.grads[0].size(); ++i) model.grads[0][i] = std::sin(static_cast<float>(t * 7 + static_cast<int>(i)));
      opt.step(model);
    }
  };
  for (int kind = 0; kind < 2; ++kind) {
    flat_model<float> a({5}), b({5});
    optim::adam<float> adam_a{{.lr = 0.01}}, adam_b{{.lr = 0.01}};
    optim::sgd<float> sgd_a{{.lr = 0.01, .momentum = 0.5}}, sgd_b{{.lr = 0.01, .momentum = 0.5}};
    std::stringstream saved;
    if (kind == 0) {
      run(adam_a, a, 0, 2);
      adam_a.save(saved);
      b = a;
      adam_b.load(saved);
      BOOST_TEST(adam_b.state_digest() == adam_a.state_digest());
      run(adam_a, a, 2, 4);
      run(adam_b, b, 2, 4);
    } else {
      run(sgd_a, a, 0, 2);
      sgd_a.save(saved);
      b = a;
      sgd_b.load(saved);
      run(sgd_a, a, 2, 4);
      run(sgd_b, b, 2, 4);
    }
    BOOST_TEST(std::memcmp(a.values[0].data(), b.values[0].data(), 5 * sizeof(float)) == 0);
  }
  std::stringstream garbage("not a state");
  optim::adam<float> opt;
  BOOST_CHECK_THROW(opt.load(garbage), std::runtime_error);
  std::stringstream sgd_state;
  optim::sgd<float>{}.save(sgd_state);
  BOOST_CHECK_THROW(opt.load(sgd_state), std::runtime_error);
}

BOOST_AUTO_TEST_CASE(state_must_match_the_model) {
  flat_model<float> small({3}), large({4});
  optim::adam<float> opt;
  opt.step(small);
  BOOST_CHECK_THROW(opt.step(large), std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(gradients)

BOOST_AUTO_TEST_CASE(fused_buckets_sum_every_gradient) {
  // Sizes in floats: 1000 (4000 B), 10, 3000 (12000 B), 0 (skipped), 500.
  const std::vector<std::size_t> sizes{1000, 10, 3000, 0, 500};
  struct row { std::size_t bucket_bytes, collectives; };
  for (const row t : {row{std::size_t{25} << 20, 1}, row{0, 4}, row{4040, 3}, row{16000, 2}}) {
    for (auto op : {dist::reduce_op::sum, dist::reduce_op::mean}) {
      dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
      auto models = s.mirror([&](auto&) { return flat_model<float>(sizes); });
      auto counts = s.run(
          [&](dist::replica auto& r, flat_model<float>& m) {
            for (std::size_t p = 0; p < m.grads.size(); ++p)
              for (std::size_t i = 0; i < m.grads[p].size(); ++i)
                m.grads[p][i] = static_cast<float>((r.replica_id() + 1) * (static_cast<int>(p) + 1)) + static_cast<float>(i % 7);
            return r.all_reduce_gradients(m, {.op = op, .bucket_bytes = t.bucket_bytes});
          },
          models);
      for (auto c : counts) BOOST_TEST(c == t.collectives, "bucket cap " << t.bucket_bytes);
      for (const auto& m : models)
        for (std::size_t p = 0; p < sizes.size(); ++p)
          for (std::size_t i = 0; i < sizes[p]; ++i) {
            // (1 + 2 + 3)(p + 1) + 3 (i % 7), divided by 3 for a mean.
            const float sum = 6.0f * static_cast<float>(p + 1) + 3.0f * static_cast<float>(i % 7);
            const float expected = op == dist::reduce_op::mean ? sum / 3.0f : sum;
            if (m.grads[p][i] != expected) {
              BOOST_TEST(m.grads[p][i] == expected, "parameter " << p << " element " << i);
              return;
            }
          }
    }
  }
}

BOOST_AUTO_TEST_CASE(under_one_device_it_does_nothing) {
  dist::one_device_strategy<> s;
  auto models = s.mirror([](auto&) { return flat_model<float>({4, 4}); });
  models[0].grads[1] = {1, 2, 3, 4};
  auto counts = s.run([](dist::replica auto& r, flat_model<float>& m) { return r.all_reduce_gradients(m); }, models);
  BOOST_TEST(counts[0] == 0u);
  BOOST_TEST(models[0].grads[1] == (std::vector<float>{1, 2, 3, 4}));
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

constexpr std::int64_t global_batch = 12, in_size = 1 * 6 * 6, out_size = 2 * 3 * 3;

// conv (no bias: a norm follows) -> Norm -> relu -> conv stride 2, reflection padding -> tanh.
template <template <class> class Norm>
auto make_net(std::uint64_t seed) {
  return nn::sequential{
      nn::conv2d<float>{{.in_channels = 1, .out_channels = 4, .kernel = 3, .stride = 1, .padding = 1, .bias = false}, seed},
      Norm<float>{{.channels = 4}, seed + 1}, nn::relu<float>{},
      nn::conv2d<float>{{.in_channels = 4, .out_channels = 2, .kernel = 3, .stride = 2, .padding = 1,
                         .pad_mode = nn::padding_mode::reflect}, seed + 2},
      nn::tanh<float>{}};
}

struct training_data {
  std::vector<float> x, y;
};
training_data make_data() {
  training_data d;
  const auto x = dist::test::random_tensor<float>(shape::nchw(global_batch, 1, 6, 6), 71, -1.0, 2.0);
  const auto y = dist::test::random_tensor<float>(shape::nchw(global_batch, 2, 3, 3), 72, -0.5, 0.5);
  d.x.assign(x.begin(), x.end());
  d.y.assign(y.begin(), y.end());
  return d;
}

// Five Adam steps on the same global batch of 12; returns replica 0's parameters, one vector per
// tensor, after checking that every replica holds the same bits.
// The loss convention: `global` divides by the global batch and sums the gradients (the default);
// `per_replica` averages over each replica's own examples and all-reduces with mean.
enum class scaling { global, per_replica };

template <template <class> class Norm, class S>
std::vector<std::vector<float>> train(S& s, scaling how = scaling::global, int steps = 5,
                                      std::int64_t batch = global_batch) {
  auto data = make_data();
  data.x.resize(static_cast<std::size_t>(batch * in_size));  // the first `batch` examples
  data.y.resize(static_cast<std::size_t>(batch * out_size));
  using net_type = decltype(make_net<Norm>(0));
  auto nets = s.mirror([](auto&) { return make_net<Norm>(1234); });
  auto opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-2}}; });
  auto xs = s.scatter(data.x, in_size);
  auto ys = s.scatter(data.y, out_size);
  for (int step = 0; step < steps; ++step) {
    auto losses = s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, net_type& net,
            optim::adam<float>& opt) {
          const auto n = static_cast<std::int64_t>(xl.size()) / in_size;
          const tensor<float> x{shape::nchw(n, 1, 6, 6), xl}, y{shape::nchw(n, 2, 3, 3), yl};
          net.zero_grad();
          const auto out = net.forward(r, x);
          if (how == scaling::per_replica) {
            const auto loss = nn::mse(out, y, n);
            net.backward(r, loss.grad);
            r.all_reduce_gradients(net, {.op = dist::reduce_op::mean});
            opt.step(net);
            return loss.value / static_cast<float>(r.num_replicas());
          }
          const auto loss = nn::mse(out, y, batch);  // a share of the mean over the GLOBAL batch
          net.backward(r, loss.grad);
          r.all_reduce_gradients(net);  // the sum of the shares
          opt.step(net);
          return loss.value;
        },
        xs, ys, nets, opts);
    BOOST_TEST(std::isfinite(s.reduce(dist::reduce_op::sum, losses)));
  }
  if constexpr (std::is_same_v<net_type, decltype(make_net<nn::batch_norm>(0))>) {
    // Plain batch norm's running statistics are each replica's own: the copies differ in their
    // buffers (checked below: their parameters agree).
    if (s.num_replicas_in_sync() > 1) BOOST_CHECK_THROW(s.verify_mirrored(nets), dist::mirrored_divergence);
  } else {
    s.verify_mirrored(nets);  // the digests of every replica's parameters and running statistics agree
  }
  std::vector<std::vector<std::vector<float>>> per_replica;
  for (auto& net : nets) {
    per_replica.emplace_back();
    net.for_each_parameter([&](std::span<float> v, std::span<float>) { per_replica.back().emplace_back(v.begin(), v.end()); });
  }
  for (std::size_t q = 1; q < per_replica.size(); ++q)
    BOOST_TEST((per_replica[q] == per_replica[0]), "replica " << q << " drifted from replica 0");
  return per_replica[0];
}

double worst_relative_error(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  BOOST_TEST_REQUIRE(a.size() == b.size());
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, dist::test::relative_error_of<float>(a[i], b[i]));
  return worst;
}

std::vector<std::vector<float>> initial_parameters() {
  auto net = make_net<nn::sync_batch_norm>(1234);
  std::vector<std::vector<float>> p;
  net.for_each_parameter([&](std::span<float> v, std::span<float>) { p.emplace_back(v.begin(), v.end()); });
  return p;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(equivalence)

BOOST_AUTO_TEST_CASE(sync_batch_norm_training_matches_one_device) {
  dist::one_device_strategy<> one;
  const auto reference = train<nn::sync_batch_norm>(one);
  // Training moved the parameters well beyond the tolerance, so agreement below means something.
  BOOST_TEST(worst_relative_error(reference, initial_parameters()) > 1e-2);
  // 12 examples split 12; 6+6; 4+4+4; 3+3+3+3; and unevenly 3+3+2+2+2.
  for (int n = 1; n <= 5; ++n) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    const double err = worst_relative_error(train<nn::sync_batch_norm>(s), reference);
    BOOST_TEST(err < 1e-4, n << " replicas: parameters differ from one device by " << err << " (relative)");
    BOOST_TEST_MESSAGE("sync_batch_norm, " << n << " replicas: worst relative parameter difference " << err);
  }
}

BOOST_AUTO_TEST_CASE(plain_batch_norm_does_not) {
  dist::one_device_strategy<> one;
  const auto reference = train<nn::batch_norm>(one);
  for (int n = 2; n <= 4; ++n) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    const double err = worst_relative_error(train<nn::batch_norm>(s), reference);
    BOOST_TEST(err > 1e-3, n << " replicas: plain batch norm differs from one device by only " << err);
    BOOST_TEST_MESSAGE("batch_norm, " << n << " replicas: worst relative parameter difference " << err);
  }
}

BOOST_AUTO_TEST_CASE(layers_without_batch_statistics_match_one_device) {
  dist::one_device_strategy<> one;
  const auto reference = train<nn::instance_norm>(one);
  for (int n : {2, 3}) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    const double err = worst_relative_error(train<nn::instance_norm>(s), reference);
    BOOST_TEST(err < 1e-4, n << " replicas: " << err);
  }
}

BOOST_AUTO_TEST_CASE(a_replica_without_examples_takes_part) {
  // A global batch of 3 over 4 replicas: 1, 1, 1 and 0 examples. The empty replica still joins
  // every collective (sync_batch_norm's and the gradients') with a zero contribution.
  dist::one_device_strategy<> one;
  const auto reference = train<nn::sync_batch_norm>(one, scaling::global, 5, 3);
  dist::mirrored_strategy<> s{dist::cpu_replicas(4)};
  const double err = worst_relative_error(train<nn::sync_batch_norm>(s, scaling::global, 5, 3), reference);
  BOOST_TEST(err < 1e-4, "3 examples over 4 replicas: " << err);
}

BOOST_AUTO_TEST_CASE(verify_mirrored_sees_a_drifted_parameter) {
  dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
  auto nets = s.mirror([](auto&) { return make_net<nn::sync_batch_norm>(7); });
  s.verify_mirrored(nets);
  nets[2].get<0>().weight().value[5] += 1e-7f;
  BOOST_CHECK_THROW(s.verify_mirrored(nets), dist::mirrored_divergence);
}

// The message of verify_mirrored's divergence ("no divergence" if it passes).
template <class S, class V>
std::string divergence_of(const S& s, const V& mirrored) {
  try {
    s.verify_mirrored(mirrored);
  } catch (const dist::mirrored_divergence& e) {
    return e.what();
  }
  return "no divergence";
}
bool mentions(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

BOOST_AUTO_TEST_CASE(verify_mirrored_sees_diverged_running_statistics) {
  // Plain batch norm takes its statistics, running ones included, from the replica's own examples:
  // forward passes in training mode over different shares leave the parameters identical and the
  // running mean and variance different on every replica.
  dist::mirrored_strategy<> s{dist::cpu_replicas(3)};
  auto nets = s.mirror([](auto&) { return make_net<nn::batch_norm>(7); });
  s.verify_mirrored(nets);
  const auto data = make_data();
  const auto xs = s.scatter(data.x, in_size);
  auto forward = [&](auto& models) {
    s.run([](dist::replica auto& r, const std::vector<float>& xl, auto& m) {
      (void)m.forward(r, tensor<float>{shape::nchw(static_cast<std::int64_t>(xl.size()) / in_size, 1, 6, 6), xl});
    }, xs, models);
  };
  forward(nets);
  for (auto& net : nets) BOOST_TEST(nn::parameter_digest(net) == nn::parameter_digest(nets[0]));
  BOOST_TEST(nets[1].get<1>().running_mean() != nets[0].get<1>().running_mean());
  const auto what = divergence_of(s, nets);
  BOOST_TEST(mentions(what, "on replica(s) 1, 2"), what);
  BOOST_TEST(mentions(what, "buffers (such as batch norm's running statistics) differ on replica(s) 1, 2"), what);
  BOOST_TEST(!mentions(what, "parameters differ"), what);
  // broadcast copies the primary's buffers with its parameters.
  s.broadcast(nets);
  s.verify_mirrored(nets);
  BOOST_TEST(nets[2].get<1>().running_var() == nets[0].get<1>().running_var());
  // A drifted parameter on one replica, drifted statistics on another: the message tells them apart.
  nets[1].get<0>().weight().value[0] += 1e-7f;
  nets[2].for_each_buffer([](std::span<double> b) { b[0] += 1e-12; });
  const auto both = divergence_of(s, nets);
  BOOST_TEST(mentions(both, "on replica(s) 1, 2; parameters differ on replica(s) 1; buffers"), both);
  BOOST_TEST(mentions(both, "running statistics) differ on replica(s) 2"), both);
  s.broadcast(nets, 2);
  s.verify_mirrored(nets);

  // SyncBatchNorm takes the global batch's statistics: its copies stay identical, buffers included.
  auto synced = s.mirror([](auto&) { return make_net<nn::sync_batch_norm>(7); });
  forward(synced);
  s.verify_mirrored(synced);
  // A layer on its own is a model too (digested by its parameters and buffers).
  auto layers = s.mirror([](auto&) { return nn::batch_norm<float>{{.channels = 1}, 3}; });
  forward(layers);
  BOOST_TEST(mentions(divergence_of(s, layers), "buffers"));
  s.broadcast(layers, 1);
  s.verify_mirrored(layers);
}

BOOST_AUTO_TEST_CASE(per_replica_mean_losses_need_an_even_split) {
  // Losses averaged per replica with a mean all-reduce: right for an even split (12 over 2, 3, 4),
  // wrong for an uneven one (12 over 5: 3, 3, 2, 2, 2), where the global rule stays right.
  dist::one_device_strategy<> one;
  const auto reference = train<nn::instance_norm>(one);
  for (int n : {2, 3, 4}) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(n)};
    const double err = worst_relative_error(train<nn::instance_norm>(s, scaling::per_replica), reference);
    BOOST_TEST(err < 1e-4, n << " replicas, even split: " << err);
  }
  dist::mirrored_strategy<> five{dist::cpu_replicas(5)};
  const double uneven = worst_relative_error(train<nn::instance_norm>(five, scaling::per_replica), reference);
  BOOST_TEST(uneven > 1e-3, "5 replicas, uneven split, per-replica means: only " << uneven);
  const double global = worst_relative_error(train<nn::instance_norm>(five), reference);
  BOOST_TEST(global < 1e-4, "5 replicas, uneven split, global rule: " << global);
  BOOST_TEST_MESSAGE("uneven split: per-replica means differ by " << uneven << ", the global rule by " << global);
}

BOOST_AUTO_TEST_CASE(two_runs_with_the_same_seed_are_bit_identical) {
  for (int n : {1, 3, 4}) {
    dist::mirrored_strategy<> a{dist::cpu_replicas(n)}, b{dist::cpu_replicas(n)};
    const auto first = train<nn::sync_batch_norm>(a), second = train<nn::sync_batch_norm>(b);
    BOOST_TEST((first == second), n << " replicas");
  }
  dist::one_device_strategy<> one;
  BOOST_TEST((train<nn::sync_batch_norm>(one) == train<nn::sync_batch_norm>(one)));
}

BOOST_AUTO_TEST_SUITE_END()
