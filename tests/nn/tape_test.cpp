// Models that are graphs: a forward's state as a value (one layer applied several times before its
// backwards), the errors that the stateful pair's misuse raises, the tensor operations, and nn::tape,
// whose gradients are held to finite differences, to the same model wired by hand, and to one device.

#include "nn_test_support.hpp"

#include <distribute/nn/tape.hpp>
#include <distribute/nn/tensor_ops.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace optim = distribute::optim;
using dist::shape;
using dist::tensor;
using dist::test::error_of;
using dist::test::gradients_of;
using dist::test::mentions;
using dist::test::parameters_of;
using dist::test::random_tensor;

namespace {

// A U-Net with two skips: 8x8 -> 4x4 -> 2x2 -> 4x4 (+ skip) -> 8x8 (+ skip) -> 8x8.
template <class T>
struct unet {
  using scalar_type = T;
  nn::conv2d<T> e1{{.in_channels = 1, .out_channels = 3, .kernel = 3, .stride = 1, .padding = 1}, 11};
  nn::leaky_relu<T> a1;
  nn::conv2d<T> e2{{.in_channels = 3, .out_channels = 4, .kernel = 4, .stride = 2, .padding = 1}, 12};
  nn::leaky_relu<T> a2;
  nn::conv2d<T> e3{{.in_channels = 4, .out_channels = 4, .kernel = 4, .stride = 2, .padding = 1}, 13};
  nn::leaky_relu<T> a3;
  nn::conv_transpose2d<T> d3{
      {.in_channels = 4, .out_channels = 4, .kernel = 4, .stride = 2, .padding = 1, .output_padding = 0}, 14};
  nn::leaky_relu<T> a4;
  nn::conv_transpose2d<T> d2{
      {.in_channels = 8, .out_channels = 3, .kernel = 4, .stride = 2, .padding = 1, .output_padding = 0}, 15};
  nn::leaky_relu<T> a5;
  nn::conv2d<T> out{{.in_channels = 6, .out_channels = 1, .kernel = 3, .stride = 1, .padding = 1}, 16};
  nn::tanh<T> th;

  template <class F>
  void for_each_parameter(F&& f) {
    e1.for_each_parameter(f);
    e2.for_each_parameter(f);
    e3.for_each_parameter(f);
    d3.for_each_parameter(f);
    d2.for_each_parameter(f);
    out.for_each_parameter(f);
  }
  void zero_grad() {
    for_each_parameter([](std::span<T>, std::span<T> g) { std::fill(g.begin(), g.end(), T(0)); });
  }

  // Recorded on a tape.
  template <class Tape>
  auto forward(Tape& t, typename Tape::variable x) {
    const auto h1 = t(a1, t(e1, x));
    const auto h2 = t(a2, t(e2, h1));
    const auto h3 = t(a3, t(e3, h2));
    const auto u2 = t(a4, t(d3, h3));
    const auto u1 = t(a5, t(d2, t.concat(u2, h2)));
    return t(th, t(out, t.concat(u1, h1)));
  }

  // Wired by hand: the stateful pair, and the skips' gradients added where they meet.
  template <class R>
  tensor<T> forward(R& r, const tensor<T>& x) {
    h1_ = a1.forward(r, e1.forward(r, x));
    h2_ = a2.forward(r, e2.forward(r, h1_));
    const auto h3 = a3.forward(r, e3.forward(r, h2_));
    const auto u2 = a4.forward(r, d3.forward(r, h3));
    const auto u1 = a5.forward(r, d2.forward(r, nn::concat(r, u2, h2_)));
    return th.forward(r, out.forward(r, nn::concat(r, u1, h1_)));
  }
  template <class R>
  tensor<T> backward(R& r, const tensor<T>& dy) {
    auto [du1, dh1_skip] = nn::split(r, out.backward(r, th.backward(r, dy)), 3);
    auto [du2, dh2_skip] = nn::split(r, d2.backward(r, a5.backward(r, du1)), 4);
    auto dh2 = e3.backward(r, a3.backward(r, d3.backward(r, a4.backward(r, du2))));
    nn::axpy(r, T(1), dh2_skip, dh2);
    auto dh1 = e2.backward(r, a2.backward(r, dh2));
    nn::axpy(r, T(1), dh1_skip, dh1);
    return e1.backward(r, a1.backward(r, dh1));
  }
  tensor<T> h1_, h2_;
};

// G: x -> conv -> tanh; D(condition, image): concat -> conv s2 -> sync batch norm -> leaky relu -> conv.
template <class T>
auto make_generator(std::uint64_t seed) {
  return nn::sequential{
      nn::conv2d<T>{{.in_channels = 1, .out_channels = 1, .kernel = 3, .stride = 1, .padding = 1}, seed},
      nn::tanh<T>{}};
}
template <class T>
auto make_discriminator(std::uint64_t seed) {
  return nn::sequential{
      nn::conv2d<T>{{.in_channels = 2, .out_channels = 4, .kernel = 4, .stride = 2, .padding = 1}, seed},
      nn::sync_batch_norm<T>{{.channels = 4}, seed + 1}, nn::leaky_relu<T>{},
      nn::conv2d<T>{{.in_channels = 4, .out_channels = 1, .kernel = 3, .stride = 1, .padding = 1}, seed + 2}};
}

// Parameters drawn U(-0.15, 0.15), biases included: activations of order one, so that no finite
// difference step crosses a kink of a (leaky) relu, as it can among the tiny values of the default
// initialisation.
template <class M>
void spread(M& m, std::uint32_t seed = 5) {
  m.for_each_parameter([&](std::span<double> v, std::span<double>) {
    const auto r = random_tensor<double>(shape{static_cast<std::int64_t>(v.size())}, seed++, -0.15, 0.15);
    std::copy(r.begin(), r.end(), v.begin());
  });
}

// Central differences of `objective` over the values in `values`, against `analytic`.
inline double finite_difference_error(const std::function<double()>& objective, std::span<double> values,
                                      std::span<const double> analytic) {
  const double h = 1e-6;
  std::vector<double> numeric(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double keep = values[i];
    values[i] = keep + h;
    const double up = objective();
    values[i] = keep - h;
    const double down = objective();
    values[i] = keep;
    numeric[i] = (up - down) / (2 * h);
  }
  double norm = 0;
  for (double v : numeric) norm += v * v;
  BOOST_TEST(norm > 0, "a zero gradient would prove nothing");
  return dist::test::relative_error(numeric, std::vector<double>(analytic.begin(), analytic.end()), 1e-5);
}

// A layer with the stateful pair only.
struct state_inside : nn::detail::stateless {
  using scalar_type = float;
  template <class R>
  tensor<float> forward(R&, const tensor<float>& v) {
    return v;
  }
  template <class R>
  tensor<float> backward(R&, const tensor<float>& dy) {
    return dy;
  }
};

}  // namespace

BOOST_AUTO_TEST_SUITE(forward_state)

BOOST_AUTO_TEST_CASE(a_second_backward_without_a_forward_names_the_layer) {
  auto r = nn::local();
  nn::conv2d<float> conv{{.in_channels = 1, .out_channels = 2, .padding = 1}, 1};
  const auto x = random_tensor<float>(shape::nchw(2, 1, 5, 5), 1);
  const auto y = conv.forward(r, x);
  conv.backward(r, y);
  const std::string what = error_of([&] { conv.backward(r, y); });
  BOOST_TEST(mentions(what, "conv2d::backward called with no forward since its last backward"), what);
  BOOST_CHECK_THROW(conv.backward(r, y), nn::forward_state_error);
  BOOST_TEST(
      mentions(error_of([&] { nn::relu<float>{}.backward(r, y); }), "relu::backward called without a forward pass"));
}

// PyTorch's order, D(fake); D(real); backward; backward: the second backward fails, saying why,
// before a step could use the gradients.
BOOST_AUTO_TEST_CASE(two_forwards_then_two_backwards_is_an_error_naming_the_layer) {
  auto r = nn::local();
  auto d = make_discriminator<float>(3);
  const auto fake = random_tensor<float>(shape::nchw(2, 2, 8, 8), 2),
             real = random_tensor<float>(shape::nchw(2, 2, 8, 8), 3);
  const auto sf = d.forward(r, fake);
  const auto sr = d.forward(r, real);
  d.backward(r, sf);
  const std::string what = error_of([&] { d.backward(r, sr); });
  BOOST_TEST(mentions(what, "sequential::backward called with no forward since its last backward"), what);
  BOOST_TEST(mentions(what, "ran 2 times in a row"), what);
  BOOST_TEST(mentions(what, "nn::tape"), what);

  nn::leaky_relu<float> act;
  act.forward(r, fake);
  act.forward(r, real);
  act.backward(r, fake);
  BOOST_TEST(mentions(error_of([&] { act.backward(r, real); }), "leaky_relu::backward called with no forward"));
}

BOOST_AUTO_TEST_CASE(a_state_serves_one_backward_of_its_own_layer) {
  auto r = nn::local();
  nn::conv2d<float> a{{.in_channels = 1, .out_channels = 1, .padding = 1}, 1},
      b{{.in_channels = 1, .out_channels = 1, .padding = 1}, 2};
  const auto x = random_tensor<float>(shape::nchw(1, 1, 4, 4), 4);
  decltype(a)::state_type sa, never;
  const auto y = a.forward(r, x, sa);
  std::string what = error_of([&] { b.backward(r, sa, y); });
  BOOST_TEST(mentions(what, "conv2d::backward got the state of another conv2d's forward"), what);
  a.backward(r, sa, y);
  what = error_of([&] { a.backward(r, sa, y); });
  BOOST_TEST(mentions(what, "conv2d::backward got the state of its forward 1 a second time"), what);
  what = error_of([&] { a.backward(r, never, y); });
  BOOST_TEST(mentions(what, "conv2d::backward got a state that no forward filled"), what);
  nn::batch_norm<float> bn{{.channels = 1}, 1};
  decltype(bn)::state_type sb;
  (void)bn.forward(r, x, sb);
  bn.backward(r, sb, x);
  BOOST_TEST(mentions(error_of([&] { bn.backward(r, sb, x); }),
                      "batch_norm::backward got the state of its forward 1 a second time"));
}

// D on fake and on real, each with its state, then both backwards: the gradients of the interleaved
// calls, bit for bit (the parameters' gradients are added in the same order).
BOOST_AUTO_TEST_CASE(two_applications_before_the_backwards_equal_interleaved_calls) {
  auto r = nn::local();
  auto interleaved = make_discriminator<float>(5);
  auto held = make_discriminator<float>(5);
  const auto fake = random_tensor<float>(shape::nchw(3, 2, 8, 8), 6),
             real = random_tensor<float>(shape::nchw(3, 2, 8, 8), 7);
  const auto gf = random_tensor<float>(shape::nchw(3, 1, 4, 4), 8),
             gr = random_tensor<float>(shape::nchw(3, 1, 4, 4), 9);

  interleaved.forward(r, fake);
  const auto dfake_1 = interleaved.backward(r, gf);
  interleaved.forward(r, real);
  const auto dreal_1 = interleaved.backward(r, gr);

  decltype(held)::state_type on_fake, on_real;
  held.forward(r, fake, on_fake);
  held.forward(r, real, on_real);
  const auto dfake_2 = held.backward(r, on_fake, gf);
  const auto dreal_2 = held.backward(r, on_real, gr);

  BOOST_TEST((dfake_1 == dfake_2));
  BOOST_TEST((dreal_1 == dreal_2));
  BOOST_TEST((gradients_of<float>(interleaved) == gradients_of<float>(held)));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(tensor_ops)

BOOST_AUTO_TEST_CASE(concat_and_split_along_the_channels) {
  auto r = nn::local();
  const auto a = random_tensor<float>(shape::nchw(2, 1, 2, 3), 1), b = random_tensor<float>(shape::nchw(2, 3, 2, 3), 2);
  const auto c = nn::concat(r, a, b);
  BOOST_TEST((c.shape() == shape::nchw(2, 4, 2, 3)));
  BOOST_TEST(c(1, 0, 1, 2) == a(1, 0, 1, 2));
  BOOST_TEST(c(1, 3, 0, 1) == b(1, 2, 0, 1));
  const auto [a2, b2] = nn::split(r, c, 1);
  BOOST_TEST((a2 == a));
  BOOST_TEST((b2 == b));
  const tensor<float> f{shape{2, 3}, {1, 2, 3, 4, 5, 6}}, g{shape{2, 1}, {7, 8}};
  BOOST_TEST((nn::concat(r, f, g) == tensor<float>{shape{2, 4}, {1, 2, 3, 7, 4, 5, 6, 8}}));
}

BOOST_AUTO_TEST_CASE(arithmetic) {
  auto r = nn::local();
  const tensor<float> a{shape{4}, {1, 2, 3, 4}}, b{shape{4}, {0.5f, -1, 2, 0}};
  BOOST_TEST((nn::add(r, a, b) == tensor<float>{shape{4}, {1.5f, 1, 5, 4}}));
  BOOST_TEST((nn::scale(r, a, 2.0f) == tensor<float>{shape{4}, {2, 4, 6, 8}}));
  BOOST_TEST((nn::mul(r, a, b) == tensor<float>{shape{4}, {0.5f, -2, 6, 0}}));
  tensor<float> y = a;
  nn::axpy(r, 3.0f, b, y);
  BOOST_TEST((y == tensor<float>{shape{4}, {2.5f, -1, 9, 4}}));
}

BOOST_AUTO_TEST_CASE(shape_errors_name_both_shapes) {
  auto r = nn::local();
  const tensor<float> a{shape::nchw(2, 1, 4, 4)}, b{shape::nchw(2, 1, 5, 4)}, c{shape::nchw(3, 1, 4, 4)};
  std::string what = error_of([&] { nn::concat(r, a, b); });
  BOOST_TEST(
      mentions(what, "concat along the channels of a tensor of shape (2, 1, 4, 4) and one of shape (2, 1, 5, 4)"),
      what);
  BOOST_TEST(mentions(error_of([&] { nn::concat(r, a, c); }), "(3, 1, 4, 4)"));
  what = error_of([&] { nn::add(r, a, c); });
  BOOST_TEST(mentions(what, "add of a tensor of shape (2, 1, 4, 4) and one of shape (3, 1, 4, 4)"), what);
  tensor<float> y{shape::nchw(2, 1, 5, 4)};
  what = error_of([&] { nn::axpy(r, 1.0f, a, y); });
  BOOST_TEST(mentions(what, "axpy of a tensor of shape (2, 1, 4, 4) and one of shape (2, 1, 5, 4)"), what);
  BOOST_TEST(mentions(error_of([&] { nn::mul(r, a, b); }), "mul of a tensor of shape (2, 1, 4, 4)"));
  what = error_of([&] { nn::split(r, a, 1); });
  BOOST_TEST(mentions(what, "split of a tensor of shape (2, 1, 4, 4) after 1 channels"), what);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(tape)

BOOST_AUTO_TEST_CASE(a_unet_with_two_skips_matches_finite_differences) {
  auto r = nn::local();
  unet<double> net;
  spread(net);
  auto x = random_tensor<double>(shape::nchw(2, 1, 8, 8), 21);
  const auto g = random_tensor<double>(shape::nchw(2, 1, 8, 8), 22);
  net.zero_grad();
  nn::tape<decltype(r), double> t{r};
  const auto in = t.watch(x);
  t.backward(net.forward(t, in), g);
  const auto dx = t.gradient(in);
  const auto analytic = gradients_of<double>(net);

  auto objective = [&] {
    const auto y = net.forward(r, x);
    double s = 0;
    for (std::size_t i = 0; i < y.size(); ++i) s += g[i] * y[i];
    return s;
  };
  BOOST_TEST(finite_difference_error(objective, x.values(), dx.values()) < 1e-5);
  std::vector<std::span<double>> values;
  net.for_each_parameter([&](std::span<double> v, std::span<double>) { values.push_back(v); });
  std::size_t offset = 0;
  for (std::size_t p = 0; p < values.size(); ++p) {
    const double e = finite_difference_error(objective, values[p],
                                             std::span<const double>(analytic).subspan(offset, values[p].size()));
    BOOST_TEST(e < 1e-5, "parameter " << p << ": relative error " << e);
    offset += values[p].size();
  }
}

// The pix2pix generator's loss: 100 L1(G(x), target) + mse(D(x, G(x)), 1), D frozen: G's gradients
// (and x's, which feeds G and D) match finite differences; D's gradients stay as they were.
BOOST_AUTO_TEST_CASE(g_through_a_frozen_d_matches_finite_differences) {
  auto r = nn::local();
  auto gen = make_generator<double>(31);
  auto disc = make_discriminator<double>(32);
  spread(gen);
  spread(disc);
  auto x = random_tensor<double>(shape::nchw(2, 1, 8, 8), 33);
  const auto target = random_tensor<double>(shape::nchw(2, 1, 8, 8), 34);
  const tensor<double> ones = [] {
    tensor<double> o{shape::nchw(2, 1, 4, 4)};
    o.fill(1.0);
    return o;
  }();
  // D's gradients hold something that must survive.
  disc.zero_grad();
  disc.for_each_parameter([](std::span<double>, std::span<double> g) { std::fill(g.begin(), g.end(), 0.25); });
  const auto d_before = gradients_of<double>(disc);
  gen.zero_grad();

  nn::tape<decltype(r), double> t{r};
  const auto in = t.watch(x);
  const auto fake = t(gen, in);
  const auto l1 = t.loss(fake, [&](const tensor<double>& y) { return nn::l1(r, y, target, 2); }, 100.0);
  const auto score = t(disc, t.concat(in, fake), nn::frozen);
  const auto gan = t.loss(score, [&](const tensor<double>& s) { return nn::mse(r, s, ones, 2); });
  t.backward();
  BOOST_TEST((gradients_of<double>(disc) == d_before));
  const auto dx = t.gradient(in);
  const auto analytic = gradients_of<double>(gen);

  auto objective = [&] {
    const auto y = gen.forward(r, x);
    const auto s = disc.forward(r, nn::concat(r, x, y));
    return 100.0 * nn::l1(r, y, target, 2).value + nn::mse(r, s, ones, 2).value;
  };
  BOOST_TEST(std::abs(objective() - (100.0 * l1.value + gan.value)) < 1e-12);
  BOOST_TEST(finite_difference_error(objective, x.values(), dx.values()) < 1e-5);
  auto values = std::vector<std::span<double>>{};
  gen.for_each_parameter([&](std::span<double> v, std::span<double>) { values.push_back(v); });
  std::size_t offset = 0;
  for (auto v : values) {
    BOOST_TEST(finite_difference_error(objective, v, std::span<const double>(analytic).subspan(offset, v.size())) <
               1e-5);
    offset += v.size();
  }
}

// Where the hand-wired model adds the same gradients in the same order, the tape gives its bits.
BOOST_AUTO_TEST_CASE(equals_the_hand_wired_unet_bit_for_bit) {
  auto r = nn::local();
  unet<float> taped, wired;
  const auto x = random_tensor<float>(shape::nchw(3, 1, 8, 8), 41);
  const auto g = random_tensor<float>(shape::nchw(3, 1, 8, 8), 42);
  taped.zero_grad();
  wired.zero_grad();
  nn::tape t{r};
  const auto in = t.watch(x);
  const auto y = taped.forward(t, in);
  t.backward(y, g);
  const auto y_wired = wired.forward(r, x);
  const auto dx_wired = wired.backward(r, g);
  BOOST_TEST((y.value() == y_wired));
  BOOST_TEST((t.gradient(in) == dx_wired));
  BOOST_TEST((gradients_of<float>(taped) == gradients_of<float>(wired)));
}

// D on fake (detached) and on real, recorded before one backward: the gradients of two interleaved
// forward/backward pairs.
BOOST_AUTO_TEST_CASE(a_layer_applied_twice_on_a_tape_equals_interleaved_calls) {
  auto r = nn::local();
  auto taped = make_discriminator<float>(51), wired = make_discriminator<float>(51);
  const auto fake = random_tensor<float>(shape::nchw(2, 2, 8, 8), 52),
             real = random_tensor<float>(shape::nchw(2, 2, 8, 8), 53);
  tensor<float> zeros{shape::nchw(2, 1, 4, 4)}, ones{shape::nchw(2, 1, 4, 4)};
  ones.fill(1.0f);
  taped.zero_grad();
  wired.zero_grad();
  nn::tape t{r};
  const auto f = t.stop_gradient(t.watch(fake));
  const auto on_fake = t.loss(t(taped, f), [&](const tensor<float>& s) { return nn::mse(r, s, zeros, 4); });
  const auto on_real =
      t.loss(t(taped, t.constant(real)), [&](const tensor<float>& s) { return nn::mse(r, s, ones, 4); });
  t.backward();

  const auto lf = nn::mse(r, wired.forward(r, fake), zeros, 4);
  wired.backward(r, lf.grad, nn::no_input_gradient);
  const auto lr = nn::mse(r, wired.forward(r, real), ones, 4);
  wired.backward(r, lr.grad, nn::no_input_gradient);
  BOOST_TEST(on_fake.value == lf.value);
  BOOST_TEST(on_real.value == lr.value);
  // The tape runs real's backward first: each weight's two contributions are added in the other order.
  const auto a = gradients_of<float>(taped), b = gradients_of<float>(wired);
  BOOST_TEST(dist::test::relative_error_of<float>(a, b) < 1e-6);
  BOOST_TEST(t.gradient(f).empty());
}

BOOST_AUTO_TEST_CASE(misuse_is_an_error) {
  auto r = nn::local();
  nn::conv2d<float> conv{{.in_channels = 1, .out_channels = 1, .padding = 1}, 1};
  const auto x = random_tensor<float>(shape::nchw(1, 1, 4, 4), 61);
  nn::tape t{r}, other{r};
  const auto y = t(conv, t.watch(x));
  t.backward(y, x);
  BOOST_TEST(mentions(error_of([&] { t.backward(); }), "a tape's backward ran a second time"));
  BOOST_TEST(mentions(error_of([&] { t(conv, y); }), "a layer call recorded on a tape whose backward already ran"));
  BOOST_TEST(mentions(error_of([&] { other(conv, y); }), "tape::operator() got a tensor of another tape"));
  BOOST_TEST(mentions(error_of([&] { other.seed(other.watch(x), tensor<float>{shape{3}}); }),
                      "a tape's gradient of shape (3) for a tensor of shape (1, 1, 4, 4)"));

  // A layer that keeps its state inside can be recorded once per tape.
  state_inside mine;
  nn::tape u{r};
  const auto once = u(mine, u.watch(x));
  BOOST_TEST(mentions(error_of([&] { u(mine, once); }), "was called twice on one tape"));
}

// A pix2pix step on the tape, under one device and two mirrored replicas (sync batch norm in D, the
// gradients all-reduced blocking and overlapped): the same parameters.
namespace {
template <class S>
std::vector<float> train_pix2pix(S& s, bool overlap, int steps = 2) {
  constexpr std::int64_t batch = 4;
  auto gens = s.mirror([](auto&) { return make_generator<float>(71); });
  auto discs = s.mirror([](auto&) { return make_discriminator<float>(72); });
  // SGD: Adam would magnify the rounding differences of near-zero gradients to whole steps.
  auto g_opts = s.mirror([](auto&) { return optim::sgd<float>{{.lr = 0.1}}; });
  auto d_opts = s.mirror([](auto&) { return optim::sgd<float>{{.lr = 0.1}}; });
  for (int step = 0; step < steps; ++step) {
    const auto clean = random_tensor<float>(shape::nchw(batch, 1, 8, 8), 80 + step);
    const auto noisy = random_tensor<float>(shape::nchw(batch, 1, 8, 8), 90 + step);
    auto xs = s.scatter(std::vector<float>(noisy.begin(), noisy.end()), 64);
    auto ys = s.scatter(std::vector<float>(clean.begin(), clean.end()), 64);
    s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& yl, auto& g, auto& d,
            optim::sgd<float>& og, optim::sgd<float>& od) {
          const auto n = static_cast<std::int64_t>(xl.size()) / 64;
          const tensor<float> x{shape::nchw(n, 1, 8, 8), xl}, y{shape::nchw(n, 1, 8, 8), yl};
          tensor<float> zeros{shape::nchw(n, 1, 4, 4)}, ones{shape::nchw(n, 1, 4, 4)};
          ones.fill(1.0f);
          g.zero_grad();
          d.zero_grad();
          nn::tape t{r};
          const auto cond = t.constant(x);
          const auto fake = t(g, cond);
          t.loss(fake, [&](const tensor<float>& v) { return nn::l1(r, v, y, batch); }, 100.0f);
          t.loss(t(d, t.concat(cond, fake), nn::frozen),
                 [&](const tensor<float>& v) { return nn::mse(r, v, ones, batch); });
          const auto detached = t.stop_gradient(fake);
          t.loss(
              t(d, t.concat(cond, detached)), [&](const tensor<float>& v) { return nn::mse(r, v, zeros, batch); },
              0.5f);
          t.loss(
              t(d, t.concat(cond, t.constant(y))), [&](const tensor<float>& v) { return nn::mse(r, v, ones, batch); },
              0.5f);
          if (overlap) {
            auto sync = r.overlap_gradients();
            sync.add(g);
            sync.add(d);
            t.backward();
            sync.wait();
          } else {
            t.backward();
            r.all_reduce_gradients(g);
            r.all_reduce_gradients(d);
          }
          og.step(g);
          od.step(d);
        },
        xs, ys, gens, discs, g_opts, d_opts);
  }
  s.verify_mirrored(gens);
  s.verify_mirrored(discs);
  auto p = parameters_of<float>(gens.primary());
  const auto q = parameters_of<float>(discs.primary());
  p.insert(p.end(), q.begin(), q.end());
  return p;
}
}  // namespace

BOOST_AUTO_TEST_CASE(mirrored_equals_one_device) {
  dist::one_device_strategy<> one;
  dist::mirrored_strategy<> two{dist::cpu_replicas(2)};
  const auto a = train_pix2pix(one, false);
  const auto b = train_pix2pix(two, false);
  const auto c = train_pix2pix(two, true);
  BOOST_TEST(dist::test::relative_error_of<float>(a, b) < 1e-5);
  BOOST_TEST((b == c), "the overlapped all-reduce gives the blocking one's bits");
}

BOOST_AUTO_TEST_SUITE_END()
