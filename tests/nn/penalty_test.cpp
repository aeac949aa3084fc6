// Gradients of gradients on the tape (tape::gradient with nn::create_graph) and the penalties built
// on them (nn/penalties.hpp): every recorded backward held to central differences in double through a
// discriminator that uses each layer and operation that has one, the penalties' formulas, lazy
// regularisation, WGAN-GP's draws, the missing-rule error, frozen calls, and mirrored replicas.
#include <distribute/distribute.hpp>
#include <distribute/nn.hpp>
#include <distribute/nn/check_gradients.hpp>
#include <distribute/nn/penalties.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::shape;

namespace {

template <class T>
dist::tensor<T> normal(shape s, unsigned seed, double scale = 1.0) {
  std::mt19937 g{seed};
  std::normal_distribution<double> d{0.0, scale};
  dist::tensor<T> t{s};
  for (auto& v : t) v = static_cast<T>(d(g));
  return t;
}

// A discriminator that passes through every layer and operation with a recorded backward: convolutions
// with reflection and zero padding, a sequential (its layers called again on the tape), spectral norm around a convolution and a linear layer, the three
// normalisations, the activations as layers and as operations, pooling, flatten and reshape,
// split/concat, the broadcasting arithmetic, sum, mean and max, and a projection term through an
// embedding of the labels (a conditional discriminator's).
template <class T>
struct every_layer_discriminator : nn::module<every_layer_discriminator<T>, T> {
  nn::conv2d<T> c1{
      {.in_channels = 2, .out_channels = 4, .kernel = 3, .padding = 1, .pad_mode = nn::padding_mode::reflect}, 1};
  nn::leaky_relu<T> leaky{T(0.2)};
  nn::relu<T> rectify{};
  nn::tanh<T> squash{};
  nn::instance_norm<T> in{{.channels = 4, .affine = true}, 2};
  nn::sequential<nn::conv2d<T>, nn::instance_norm<T>, nn::relu<T>> block{
      nn::conv2d<T>{{.in_channels = 4, .out_channels = 4, .kernel = 3, .padding = 1, .bias = false}, 10},
      nn::instance_norm<T>{{.channels = 4}, 11}, nn::relu<T>{}};  // the norm and the ReLU fused in its forward
  // The convolutions a norm follows have no bias (the norm removes it, and its gradient with it).
  nn::spectral_norm<nn::conv2d<T>> c2{
      nn::conv2d<T>{{.in_channels = 4, .out_channels = 4, .kernel = 3, .stride = 2, .padding = 1, .bias = false}, 3},
      {},
      4};
  nn::batch_norm<T> bn{{.channels = 4}, 5};
  nn::avg_pool2d<T> pool{{.kernel = 2}};
  nn::layer_norm<T> ln{{.normalized_shape = shape{4, 2, 2}}};
  nn::flatten<T> flat{};
  nn::linear<T> dense{{.in_features = 16, .out_features = 8}, 6};
  nn::embedding<T> embed{{.num_embeddings = 3, .embedding_dim = 8}, 7};
  nn::spectral_norm<nn::linear<T>> out{nn::linear<T>{{.in_features = 8, .out_features = 1}, 8}, {}, 9};

  auto members() {
    return nn::members("c1", c1, "in", in, "block", block, "c2", c2, "bn", bn, "ln", ln, "dense", dense, "embed", embed,
                       "out", out);
  }

  template <class Tape>
  typename Tape::variable operator()(Tape& t, typename Tape::variable x) {
    auto h = t(leaky, t(c1, x));
    auto [a, b] = t.split(h, 2);
    h = t(block, t(in, t.concat(t(rectify, a), t(squash, b))));
    h = t(bn, t(c2, h));
    h = t(ln, t(pool, h));
    auto f = nn::reshape(t, t(flat, h), {-1, 16});
    f = nn::softplus(t, t(dense, f), T(1.5));
    dist::tensor<T> labels{shape{x.shape()[0]}};  // classes 2, 0, 2, 0, ... (the same on every half of a batch)
    for (std::int64_t i = 0; i < x.shape()[0]; ++i)
      labels[static_cast<std::size_t>(i)] = static_cast<T>(2 * ((i + 1) % 2));
    auto e = t(embed, t.constant(labels));
    auto projection = nn::sum(t, nn::mul(t, e, nn::sigmoid(t, f)), 1, true);  // [N, 1]
    auto peak = nn::max(t, f, 1, true);                                       // [N, 1]
    auto score = nn::add(t, t(out, f), nn::sub(t, projection, nn::scale(t, peak, T(0.5))));
    auto spread = nn::mean(t, nn::square(t, f), 1, true);
    return nn::div(t, score, nn::add(t, spread, t.constant(dist::tensor<T>{shape{1}, std::vector<T>{T(1)}})));
  }
};

// R1's inner quantity as a model of its input, for nn::check_gradients: the per-example squared
// norm of dD(x)/dx, so that both d/dtheta and d/dx of the penalty are held to finite differences.
template <class T>
struct squared_input_gradient : nn::module<squared_input_gradient<T>, T> {
  every_layer_discriminator<T> d;
  auto members() { return nn::members("d", d); }
  template <class Tape>
  typename Tape::variable operator()(Tape& t, typename Tape::variable x) {
    const auto g = t.gradient(nn::sum(t, d(t, x)), x, nn::create_graph);
    return nn::sum(t, nn::square(t, g), {1, 2, 3});
  }
};

// WGAN-GP's inner quantity: (||dD(x)/dx|| - 1)^2 per example.
template <class T>
struct wgan_gp_term : nn::module<wgan_gp_term<T>, T> {
  every_layer_discriminator<T> d;
  auto members() { return nn::members("d", d); }
  template <class Tape>
  typename Tape::variable operator()(Tape& t, typename Tape::variable x) {
    const auto g = t.gradient(nn::sum(t, d(t, x)), x, nn::create_graph);
    const auto norm = nn::sqrt(t, nn::sum(t, nn::square(t, g), {1, 2, 3}));
    return nn::square(t, nn::sub(t, norm, t.constant(dist::tensor<T>{shape{1}, std::vector<T>{T(1)}})));
  }
};

// Parameter gradients of a model, flattened.
template <class M>
std::vector<double> gradients_of(M& m) {
  std::vector<double> out;
  m.for_each_parameter([&](auto, auto g) { out.insert(out.end(), g.begin(), g.end()); });
  return out;
}

// A layer without a recorded backward (a user's own, written before create_graph existed).
struct doubling {
  using scalar_type = double;
  struct state_type {};
  template <class R>
  dist::tensor<double> forward(R& r, const dist::tensor<double>& x, state_type&) {
    return nn::scale(r, x, 2.0);
  }
  template <class R>
  dist::tensor<double> backward(R& r, state_type&, const dist::tensor<double>& dy) {
    return nn::scale(r, dy, 2.0);
  }
  template <class R>
  dist::tensor<double> forward(R& r, const dist::tensor<double>& x) {
    return nn::scale(r, x, 2.0);
  }
  template <class R>
  dist::tensor<double> backward(R& r, const dist::tensor<double>& dy) {
    return nn::scale(r, dy, 2.0);
  }
  template <class F>
  void for_each_parameter(F&&) {}
  void zero_grad() {}
  void set_training(bool) {}
};

// docs/nn.md's scaled softsign (y = a x / (1 + |x|)) with the recorded backward the docs give it.
template <class T = double>
class scaled_softsign {
 public:
  using scalar_type = T;
  using device_type = dist::cpu;
  using tensor_type = dist::tensor<T>;
  struct state_type {
    tensor_type x, d;
  };
  explicit scaled_softsign(std::uint64_t seed)
      : a_{shape{1}, nn::init::scale, seed}, one_{shape{1}, std::vector<T>{T(1)}} {}
  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    s.x = x;
    s.d = nn::add(r, nn::abs(r, x), one_);
    return nn::mul(r, nn::div(r, x, s.d), a_.value);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    auto [du, da] = nn::mul_backward(r, nn::div(r, s.x, s.d), a_.value, dy);
    nn::axpy(r, T(1), da, a_.grad);
    return nn::div(r, du, nn::square(r, s.d));
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_);
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_, dy);
  }
  template <class Tape>
  typename Tape::variable recorded_backward(Tape& t, state_type&, typename Tape::variable x, typename Tape::variable,
                                            typename Tape::variable dy, bool frozen) {
    return t.mul(dy, nn::div(t, t.parameter(a_, frozen), nn::square(t, nn::add(t, nn::abs(t, x), t.constant(one_)))));
  }
  template <class F>
  void for_each_parameter(F&& f) {
    a_.visit(f);
  }
  void zero_grad() { a_.zero_grad(); }
  void set_training(bool) {}

 private:
  nn::parameter<T> a_;
  tensor_type one_;
  state_type kept_;
};

// A user's layer with a recorded backward, under R1 inside a small model.
struct softsign_model : nn::module<softsign_model, double> {
  nn::conv2d<double> c{{.in_channels = 2, .out_channels = 3, .kernel = 3, .padding = 1}, 31};
  scaled_softsign<double> act{32};
  nn::linear<double> l{{.in_features = 3 * 4 * 4, .out_features = 1, .bias = false},
                       33};  // a bias has no part in dD/dx
  nn::flatten<double> flat{};
  auto members() { return nn::members("c", c, "act", act, "l", l); }
  template <class Tape>
  typename Tape::variable operator()(Tape& t, typename Tape::variable x) {
    const auto g = t.gradient(nn::sum(t, t(l, t(flat, t(act, t(c, x))))), x, nn::create_graph);
    return nn::sum(t, nn::square(t, g), {1, 2, 3});
  }
};

// The resampling layers (linear, so their recorded backward is their adjoint) between layers whose
// second order depends on x.
struct resampling_model : nn::module<resampling_model, double> {
  nn::conv2d<double> c{{.in_channels = 2, .out_channels = 4, .kernel = 3, .padding = 1}, 41};
  nn::tanh<double> squash{};
  nn::upsample<double> bilinear{{.scale_factor = 2, .mode = nn::upsample_mode::bilinear}};
  nn::pixel_shuffle<double> shuffle{{.upscale_factor = 2}};
  nn::upsample<double> nearest{{.scale_factor = 2}};
  nn::avg_pool2d<double> pool{{.kernel = 8}};
  nn::flatten<double> flat{};
  nn::linear<double> l{{.in_features = 16, .out_features = 1, .bias = false}, 42};
  auto members() { return nn::members("c", c, "l", l); }
  template <class Tape>
  typename Tape::variable operator()(Tape& t, typename Tape::variable x) {
    const auto h = t(nearest, t(shuffle, t(bilinear, t(squash, t(c, x)))));  // [N, 1, 32, 32]
    const auto score = t(l, t(flat, t(pool, h)));
    const auto g = t.gradient(nn::sum(t, score), x, nn::create_graph);
    return nn::sum(t, nn::square(t, g), {1, 2, 3});
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(penalties)

BOOST_AUTO_TEST_CASE(resampling_layers_have_recorded_backwards) {
  resampling_model m;
  const auto report =
      nn::check_gradients(m, normal<double>(shape::nchw(2, 2, 4, 4), 43), {.step = 1e-5, .tolerance = 1e-6});
  BOOST_TEST_MESSAGE(report.to_string());
  BOOST_TEST(report.passed());
}

// docs/nn.md's recorded backward of a layer of one's own, held to finite differences under R1.
BOOST_AUTO_TEST_CASE(a_users_layer_with_a_recorded_backward) {
  softsign_model m;
  const auto report =
      nn::check_gradients(m, normal<double>(shape::nchw(2, 2, 4, 4), 34), {.step = 1e-5, .tolerance = 1e-6});
  BOOST_TEST_MESSAGE(report.to_string());
  BOOST_TEST(report.passed());
}

// d/dtheta and d/dx of ||dD/dx||^2 and of (||dD/dx|| - 1)^2 against central differences: each
// recorded backward's parameter part, and its dependence on x (through tanh's output, the norms'
// statistics, the softplus and sigmoid derivatives), to 1e-6.
BOOST_AUTO_TEST_CASE(second_order_gradients_match_finite_differences) {
  const auto x = normal<double>(shape::nchw(2, 2, 8, 8), 11);
  {
    squared_input_gradient<double> m;
    m.d.c2.set_training(false);  // spectral norm's u and v fixed: the penalty is then a function of theta
    m.d.out.set_training(false);
    m.d.bn.set_training(false);
    const auto report = nn::check_gradients(m, x, {.step = 1e-5, .tolerance = 1e-6, .name = "R1 (batch norm eval)"});
    BOOST_TEST_MESSAGE(report.to_string());
    BOOST_TEST(report.passed());
    m.d.bn.set_training(true);
    const auto trained =
        nn::check_gradients(m, x, {.step = 1e-5, .tolerance = 1e-6, .name = "R1 (batch norm training)"});
    BOOST_TEST_MESSAGE(trained.to_string());
    BOOST_TEST(trained.passed());
  }
  {
    wgan_gp_term<double> m;
    m.d.c2.set_training(false);
    m.d.out.set_training(false);
    const auto report = nn::check_gradients(m, x, {.step = 1e-5, .tolerance = 1e-6, .name = "WGAN-GP"});
    BOOST_TEST_MESSAGE(report.to_string());
    BOOST_TEST(report.passed());
  }
}

// The recorded gradient has the values of the first-order one, and taking it leaves the parameter
// gradients untouched until backward.
BOOST_AUTO_TEST_CASE(a_recorded_gradient_equals_the_first_order_one) {
  every_layer_discriminator<double> d;
  d.c2.set_training(false);  // u and v fixed: both forwards compute with the same weights
  d.out.set_training(false);
  const auto x = normal<double>(shape::nchw(2, 2, 8, 8), 12);
  auto r = nn::local();
  std::vector<double> first;
  {
    nn::tape<nn::local_replica, double> t{r};
    const auto v = t.watch(x);
    t.backward(nn::sum(t, d(t, v)));
    first.assign(t.gradient(v).begin(), t.gradient(v).end());
  }
  d.zero_grad();
  nn::tape<nn::local_replica, double> t{r};
  const auto v = t.watch(x);
  const auto g = t.gradient(nn::sum(t, d(t, v)), v, nn::create_graph);
  BOOST_TEST(g.shape() == x.shape());
  for (std::size_t i = 0; i < first.size(); ++i)
    BOOST_TEST(g.value()[i] == first[i], boost::test_tools::tolerance(1e-12));
  for (const double v2 : gradients_of(d)) BOOST_TEST(v2 == 0.0);
}

// r1_penalty, r2_penalty and gradient_penalty_at are gamma/2 (resp. lambda) times the means of the
// quantities checked above, with the same parameter gradients; lazy regularisation weights by the
// interval on the steps it runs and records nothing on the others.
BOOST_AUTO_TEST_CASE(penalties_are_their_formulas) {
  const auto x = normal<double>(shape::nchw(2, 2, 8, 8), 13);
  auto r = nn::local();
  squared_input_gradient<double> ref;
  ref.d.c2.set_training(false);
  ref.d.out.set_training(false);
  // The reference: mean of ||g||^2, times gamma / 2 * every.
  const double gamma = 3.0;
  const std::int64_t every = 4;
  double expected = 0;
  {
    nn::tape<nn::local_replica, double> t{r};
    const auto per = ref(t, t.watch(x));
    const auto loss = nn::scale(t, nn::mean(t, per), gamma / 2 * every);
    expected = loss.value()[0];
    t.backward(loss);
  }
  const auto expected_grads = gradients_of(ref);
  for (auto* which : {"r1", "r2"}) {
    ref.zero_grad();
    nn::tape<nn::local_replica, double> t{r};
    auto d = [&](auto v) { return ref.d(t, v); };
    const nn::penalty_options o{.weight = gamma, .every = every};
    const auto p = std::string(which) == "r1" ? nn::r1_penalty(t, x, d, o, 8) : nn::r2_penalty(t, x, d, o, 8);
    BOOST_TEST(p.shape().numel() == 1);
    BOOST_TEST(p.value()[0] == expected, boost::test_tools::tolerance(1e-12));
    t.backward(p);
    const auto got = gradients_of(ref);
    BOOST_TEST_REQUIRE(got.size() == expected_grads.size());
    for (std::size_t i = 0; i < got.size(); ++i)
      BOOST_TEST(got[i] == expected_grads[i], boost::test_tools::tolerance(1e-12));
  }
  {  // sharing the forward: the same value and gradients from the scores the loss uses
    ref.zero_grad();
    nn::tape<nn::local_replica, double> t{r};
    const auto v = t.watch(x);
    const auto p = nn::r1_penalty(t, v, ref.d(t, v), {.weight = gamma, .every = every}, 8);
    BOOST_TEST(p.value()[0] == expected, boost::test_tools::tolerance(1e-12));
    t.backward(p);
    const auto got = gradients_of(ref);
    for (std::size_t i = 0; i < got.size(); ++i)
      BOOST_TEST(got[i] == expected_grads[i], boost::test_tools::tolerance(1e-12));
  }
  {  // a step lazy regularisation skips: a zero constant, nothing recorded through D
    ref.zero_grad();
    nn::tape<nn::local_replica, double> t{r};
    int calls = 0;
    auto d = [&](auto v) {
      ++calls;
      return ref.d(t, v);
    };
    const auto p = nn::r1_penalty(t, x, d, {.weight = gamma, .every = every}, 9);
    BOOST_TEST(p.value()[0] == 0.0);
    BOOST_TEST(!p.requires_grad());
    BOOST_TEST(calls == 0);
  }
  {  // gradient_penalty_at: lambda * mean (||g|| - 1)^2
    wgan_gp_term<double> gp;
    gp.d.c2.set_training(false);
    gp.d.out.set_training(false);
    double want = 0;
    {
      nn::tape<nn::local_replica, double> t{r};
      want = 7.0 * nn::mean(t, gp(t, t.watch(x))).value()[0];
    }
    nn::tape<nn::local_replica, double> t{r};
    const auto p = nn::gradient_penalty_at(t, x, [&](auto v) { return gp.d(t, v); }, {.weight = 7.0});
    BOOST_TEST(p.value()[0] == want, boost::test_tools::tolerance(1e-12));
  }
}

// WGAN-GP's interpolates: alpha in (0, 1] per example, the same for the same seed, step and replica,
// different across each; gradient_penalty is gradient_penalty_at those points.
BOOST_AUTO_TEST_CASE(wgan_gp_draws_are_deterministic_per_replica_and_step) {
  const auto a = nn::interpolation_weights(64, 5, 3, 0);
  BOOST_TEST(a == nn::interpolation_weights(64, 5, 3, 0));
  BOOST_TEST(a != nn::interpolation_weights(64, 5, 4, 0));
  BOOST_TEST(a != nn::interpolation_weights(64, 5, 3, 1));
  BOOST_TEST(a != nn::interpolation_weights(64, 6, 3, 0));
  for (const double v : a) BOOST_TEST((v > 0.0 && v <= 1.0));

  every_layer_discriminator<double> d;
  d.c2.set_training(false);
  d.out.set_training(false);
  const auto real = normal<double>(shape::nchw(2, 2, 8, 8), 14), fake = normal<double>(shape::nchw(2, 2, 8, 8), 15);
  const auto alpha = nn::interpolation_weights(2, 5, 3, 0);
  dist::tensor<double> points{real.shape()};
  for (std::size_t i = 0; i < points.size(); ++i) {
    const double w = alpha[i / (points.size() / 2)];
    points[i] = fake[i] + w * (real[i] - fake[i]);
  }
  auto r = nn::local();
  nn::tape<nn::local_replica, double> t{r};
  auto disc = [&](auto v) { return d(t, v); };
  const auto p = nn::gradient_penalty(t, real, fake, disc, {.weight = 10.0, .seed = 5}, 3);
  const auto q = nn::gradient_penalty_at(t, points, disc, {.weight = 10.0});
  BOOST_TEST(p.value()[0] == q.value()[0], boost::test_tools::tolerance(1e-12));
  BOOST_TEST(p.value()[0] > 0.0);
}

// A gradient with create_graph that meets a layer or an operation without a recorded backward throws
// naming it; bad calls are refused with what was wrong.
BOOST_AUTO_TEST_CASE(a_missing_rule_is_an_error_naming_the_layer) {
  auto r = nn::local();
  const auto x = normal<double>(shape::nchw(1, 2, 4, 4), 16);
  auto names = [](const std::string& what) {
    return [what](const nn::missing_rule_error& e) {
      BOOST_TEST_MESSAGE(e.what());
      return std::string(e.what()).find(what) != std::string::npos;
    };
  };
  {
    doubling layer;
    nn::tape<nn::local_replica, double> t{r};
    const auto v = t.watch(x);
    const auto y = nn::sum(t, t(layer, v));
    BOOST_CHECK_EXCEPTION(t.gradient(y, v, nn::create_graph), nn::missing_rule_error, names("doubling"));
  }
  {  // inside a sequential: the error names the layer
    nn::sequential<nn::leaky_relu<double>, doubling> seq{nn::leaky_relu<double>{0.2}, doubling{}};
    nn::tape<nn::local_replica, double> t{r};
    const auto v = t.watch(x);
    const auto y = nn::sum(t, t(seq, v));
    BOOST_CHECK_EXCEPTION(t.gradient(y, v, nn::create_graph), nn::missing_rule_error, names("doubling"));
  }
  {
    nn::tape<nn::local_replica, double> t{r};
    const auto v = t.watch(x);
    const auto y = t.record_operation(nn::scale(r, x, 3.0), v, [&](const auto& dy) { return nn::scale(r, dy, 3.0); });
    BOOST_CHECK_EXCEPTION(t.gradient(nn::sum(t, y), v, nn::create_graph), nn::missing_rule_error,
                          names("record_operation"));
    // With its rule it passes.
    const auto z = t.record_operation(
        nn::scale(r, x, 3.0), v, [&](const auto& dy) { return nn::scale(r, dy, 3.0); },
        [&](auto dy) { return t.scale(dy, 3.0); });
    const auto g = t.gradient(nn::sum(t, z), v, nn::create_graph);
    for (const double e : g.value()) BOOST_TEST(e == 3.0);
  }
  {  // a function's recorded gradient backpropagates (its second derivative), but is not recorded again
    nn::tape<nn::local_replica, double> t{r};
    const auto v = t.watch(x);
    const auto g = t.gradient(nn::sum(t, nn::exp(t, v)), v, nn::create_graph);
    BOOST_CHECK_EXCEPTION(t.gradient(nn::sum(t, g), v, nn::create_graph), nn::missing_rule_error, names("third-order"));
    t.backward(nn::sum(t, g));
    for (std::size_t i = 0; i < x.size(); ++i)
      BOOST_TEST(t.gradient(v)[i] == std::exp(x[i]), boost::test_tools::tolerance(1e-12));
  }
  {
    nn::tape<nn::local_replica, double> t{r};
    const auto v = t.watch(x);
    const auto other = t.watch(x);
    const auto y = nn::sum(t, nn::square(t, v));
    BOOST_CHECK_THROW(t.gradient(y, other, nn::create_graph), std::invalid_argument);  // y does not depend on it
    BOOST_CHECK_THROW(t.gradient(nn::square(t, v), v, nn::create_graph), std::invalid_argument);  // not one element
    t.backward(y);
    BOOST_CHECK_THROW(t.gradient(y, v, nn::create_graph), std::logic_error);  // after backward
  }
  {
    every_layer_discriminator<double> d;
    nn::tape<nn::local_replica, double> t{r};
    auto disc = [&](auto v) { return d(t, v); };
    const auto bad = normal<double>(shape::nchw(2, 2, 8, 8), 17);
    BOOST_CHECK_THROW(nn::r1_penalty(t, bad, disc, {.every = 0}), std::invalid_argument);
    BOOST_CHECK_THROW(nn::r1_penalty(t, bad, disc, {.weight = -1.0}), std::invalid_argument);
    BOOST_CHECK_THROW(nn::r1_penalty(t, bad, disc, {}, -1), std::invalid_argument);
    BOOST_CHECK_THROW(nn::gradient_penalty(t, bad, normal<double>(shape::nchw(1, 2, 8, 8), 18), disc),
                      std::invalid_argument);
  }
}

// A frozen discriminator call under a penalty: the input gradient flows, the parameters keep their
// gradients (none written by the penalty's second order either).
BOOST_AUTO_TEST_CASE(a_frozen_call_writes_no_second_order_gradient) {
  every_layer_discriminator<double> d;
  d.c2.set_training(false);
  d.out.set_training(false);
  const auto x = normal<double>(shape::nchw(2, 2, 8, 8), 19);
  auto r = nn::local();
  nn::tape<nn::local_replica, double> t{r};
  const auto v = t.watch(x);
  const auto g = t.gradient(nn::sum(t, t(d, v, nn::frozen)), v, nn::create_graph);
  t.backward(nn::sum(t, nn::square(t, g)));
  for (const double e : gradients_of(d)) BOOST_TEST(e == 0.0);
  BOOST_TEST(!t.gradient(v).empty());
}

// Under mirrored_strategy with two replicas, the all-reduced R1 gradients of the per-replica halves
// equal those of one device on the whole batch (each replica's share of the mean over the global
// batch, summed by the all-reduce), and an overlapped all-reduce, whose buckets start as each layer's gradients are
// announced final, gives the blocking one's bits: the penalty's second-order writes come before the
// announcement.
namespace {
template <class S>
std::vector<double> r1_gradients(S& s, bool overlap) {
  const auto x = normal<float>(shape::nchw(4, 2, 8, 8), 20);
  auto discs = s.mirror([](auto&) {
    every_layer_discriminator<float> d;
    d.c2.set_training(false);
    d.out.set_training(false);
    d.bn.set_training(false);  // batch statistics would differ between a half and the whole
    return d;
  });
  auto xs = s.scatter(std::vector<float>(x.begin(), x.end()), 128);
  s.run(
      [&](dist::replica auto& r, const std::vector<float>& xl, auto& d) {
        const dist::tensor<float> real{shape::nchw(static_cast<std::int64_t>(xl.size()) / 128, 2, 8, 8), xl};
        d.zero_grad();
        nn::tape t{r};
        const auto p = nn::r1_penalty(t, real, [&](auto v) { return d(t, v); }, {.weight = 1.0, .global_batch = 4});
        if (overlap) {
          auto sync = r.overlap_gradients();
          sync.add(d);
          t.backward(p);
          sync.wait();
        } else {
          t.backward(p);
          r.all_reduce_gradients(d);
        }
      },
      xs, discs);
  s.verify_mirrored(discs);
  return gradients_of(discs.primary());
}
}  // namespace

BOOST_AUTO_TEST_CASE(mirrored_penalty_gradients_equal_one_device) {
  dist::one_device_strategy<> one;
  dist::mirrored_strategy<> two{dist::cpu_replicas(2)};
  const auto a = r1_gradients(one, false);
  const auto b = r1_gradients(two, false);
  const auto c = r1_gradients(two, true);
  BOOST_TEST_REQUIRE(a.size() == b.size());
  double worst = 0, largest = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    largest = std::max(largest, std::abs(a[i]));
  }
  BOOST_TEST_MESSAGE("largest gradient " << largest << ", worst difference " << worst);
  BOOST_TEST(largest > 0.0);
  BOOST_TEST(worst <= 1e-4 * largest);
  BOOST_TEST((b == c), "the overlapped all-reduce gives the blocking one's bits");
}

BOOST_AUTO_TEST_SUITE_END()
