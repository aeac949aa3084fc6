// The operations between layers (nn/shape_ops.hpp, reductions.hpp, broadcasting.hpp,
// elementwise.hpp) by hand and on a tape (nn/tape_ops.hpp): values against plain loops, gradients
// against central differences in double, the shape errors, and models of several inputs on a tape.

#include "nn_test_support.hpp"

#include <distribute/nn/check_gradients.hpp>
#include <distribute/nn/linear.hpp>
#include <distribute/nn/tape_ops.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::shape;
using dist::tensor;
using dist::test::error_of;
using dist::test::mentions;
using dist::test::random_tensor;

namespace {

using replica = nn::local_replica;
using tape_d = nn::tape<replica, double>;
using var = tape_d::variable;

// Each input's gradient by the tape, of L = sum(w * f(inputs)) for fixed random w, against central
// differences of the same L (relative error, with a floor of 1e-6 of the largest gradient).
void check_tape_gradients(const std::function<var(tape_d&, const std::vector<var>&)>& f, std::vector<tensor<double>> xs,
                          const std::string& what, std::uint32_t seed = 7) {
  auto r = nn::local();
  auto loss = [&](const std::vector<tensor<double>>& in, std::vector<tensor<double>>* grads) {
    tape_d t{r};
    std::vector<var> vs;
    for (const auto& x : in) vs.push_back(t.watch(x));
    const var y = f(t, vs);
    const tensor<double> w = random_tensor<double>(y.shape(), seed);
    double l = 0;
    for (std::size_t i = 0; i < w.size(); ++i) l += w.data()[i] * y.value().data()[i];
    if (grads) {
      t.backward(y, w);
      for (const auto& v : vs) grads->push_back(t.gradient(v));
    }
    return l;
  };
  std::vector<tensor<double>> analytic;
  loss(xs, &analytic);
  for (std::size_t k = 0; k < xs.size(); ++k) {
    BOOST_TEST_CONTEXT(what << ", input " << k) {
      BOOST_REQUIRE_EQUAL(analytic[k].shape(), xs[k].shape());
      double largest = 0, worst = 0;
      std::vector<double> numeric(xs[k].size());
      for (std::size_t i = 0; i < xs[k].size(); ++i) {
        const double h = 1e-6 * std::max(1.0, std::abs(xs[k].data()[i]));
        auto plus = xs, minus = xs;
        plus[k].data()[i] += h;
        minus[k].data()[i] -= h;
        numeric[i] = (loss(plus, nullptr) - loss(minus, nullptr)) / (2 * h);
        largest = std::max(largest, std::abs(numeric[i]));
      }
      BOOST_TEST(largest > 0.0, "the gradient is zero everywhere: the check would prove nothing");
      for (std::size_t i = 0; i < numeric.size(); ++i)
        worst = std::max(worst, std::abs(analytic[k].data()[i] - numeric[i]) /
                                    std::max({std::abs(numeric[i]), 1e-6 * largest, 1e-12}));
      BOOST_TEST(worst <= 1e-6, "worst relative error " << worst);
    }
  }
}
void check_unary(const std::function<var(tape_d&, var)>& f, const tensor<double>& x, const std::string& what) {
  check_tape_gradients([&](tape_d& t, const std::vector<var>& v) { return f(t, v[0]); }, {x}, what);
}

// Values in [lo, hi] kept `gap` away from each of `avoid` (kinks, bounds).
tensor<double> away_from(shape s, std::uint32_t seed, double lo, double hi, std::vector<double> avoid,
                         double gap = 0.05) {
  auto x = random_tensor<double>(s, seed, lo, hi);
  for (auto& v : std::span<double>(x.data(), x.size()))
    for (double a : avoid)
      if (std::abs(v - a) < gap) v = a + (v < a ? -gap : gap);
  return x;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(operations)

BOOST_AUTO_TEST_CASE(functions_match_their_formulas_and_differences) {
  auto r = nn::local();
  const auto x = away_from(shape{2, 3, 4}, 1, -2.0, 2.0, {0.0, -0.5, 0.5});
  const auto pos = random_tensor<double>(shape{2, 3, 4}, 2, 0.2, 3.0);
  auto check_value = [&](const tensor<double>& in, const tensor<double>& out, double (*f)(double), const char* name) {
    for (std::size_t i = 0; i < in.size(); ++i) BOOST_TEST(out.data()[i] == f(in.data()[i]), name << " at " << i);
  };
  check_value(x, nn::square(r, x), [](double v) { return v * v; }, "square");
  check_value(pos, nn::sqrt(r, pos), [](double v) { return std::sqrt(v); }, "sqrt");
  check_value(x, nn::exp(r, x), [](double v) { return std::exp(v); }, "exp");
  check_value(pos, nn::log(r, pos), [](double v) { return std::log(v); }, "log");
  check_value(x, nn::abs(r, x), [](double v) { return std::abs(v); }, "abs");
  check_value(x, nn::sigmoid(r, x), [](double v) { return 1 / (1 + std::exp(-v)); }, "sigmoid");
  check_value(x, nn::softplus(r, x), [](double v) { return std::log1p(std::exp(v)); }, "softplus");
  check_value(x, nn::clamp(r, x, -0.5, 0.5), [](double v) { return std::clamp(v, -0.5, 0.5); }, "clamp");
  check_value(pos, nn::pow(r, pos, 2.5), [](double v) { return std::pow(v, 2.5); }, "pow");
  // Softplus past its threshold is x itself (PyTorch's), also for another beta.
  const tensor<double> big{shape{2}, std::vector<double>{30.0, 11.0}};
  const auto sp = nn::softplus(r, big, 2.0, 20.0);
  BOOST_TEST(sp.data()[0] == 30.0);
  BOOST_TEST(sp.data()[1] == 11.0);
  // The gradient conventions at the edges: abs' at 0 is 0, clamp passes at both bounds.
  const tensor<double> edges{shape{3}, std::vector<double>{0.0, -0.5, 0.5}};
  const tensor<double> ones{shape{3}, std::vector<double>{1, 1, 1}};
  const auto dabs = nn::abs_backward(r, edges, nn::abs(r, edges), ones);
  BOOST_TEST(dabs.data()[0] == 0.0);
  const auto dclamp = nn::clamp_backward(r, edges, nn::clamp(r, edges, -0.5, 0.5), ones, -0.5, 0.5);
  BOOST_TEST((dclamp.data()[1] == 1.0 && dclamp.data()[2] == 1.0));

  check_unary([](tape_d& t, var v) { return nn::square(t, v); }, x, "square");
  check_unary([](tape_d& t, var v) { return nn::sqrt(t, v); }, pos, "sqrt");
  check_unary([](tape_d& t, var v) { return nn::exp(t, v); }, x, "exp");
  check_unary([](tape_d& t, var v) { return nn::log(t, v); }, pos, "log");
  check_unary([](tape_d& t, var v) { return nn::abs(t, v); }, x, "abs");
  check_unary([](tape_d& t, var v) { return nn::sigmoid(t, v); }, x, "sigmoid");
  check_unary([](tape_d& t, var v) { return nn::softplus(t, v); }, x, "softplus");
  check_unary([](tape_d& t, var v) { return nn::softplus(t, v, 3.0, 2.0); }, x, "softplus, beta 3, threshold 2");
  check_unary([](tape_d& t, var v) { return nn::clamp(t, v, -0.5, 0.5); }, x, "clamp");
  check_unary([](tape_d& t, var v) { return nn::pow(t, v, 2.5); }, pos, "pow 2.5");
  check_unary([](tape_d& t, var v) { return nn::pow(t, v, -1.0); }, pos, "pow -1");

  // By hand, the backward functions give what the tape gives.
  const auto dy = random_tensor<double>(x.shape(), 9);
  const auto by_hand = nn::sigmoid_backward(r, x, nn::sigmoid(r, x), dy);
  tape_d t{r};
  const var v = t.watch(x);
  t.backward(nn::sigmoid(t, v), dy);
  BOOST_TEST(dist::test::relative_error_of<double>({by_hand.data(), by_hand.size()},
                                                   {t.gradient(v).data(), t.gradient(v).size()}) < 1e-15);
}

// Float exp, log, sigmoid and softplus on the CPU run through nn/detail/float_lanes.hpp's vector
// code: within a few ulp of the exact value (double's) over the whole float range, and libm's
// special values. Every 4099th bit pattern (about a million values: normal, subnormal, huge, both
// signs) plus the special ones.
BOOST_AUTO_TEST_CASE(float_functions_are_within_a_few_ulp_of_the_exact_value) {
  auto r = nn::local();
  constexpr float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> values{0.0f,
                            -0.0f,
                            inf,
                            -inf,
                            nan,
                            std::numeric_limits<float>::min(),
                            std::numeric_limits<float>::denorm_min(),
                            std::numeric_limits<float>::max(),
                            -std::numeric_limits<float>::max(),
                            88.72f,
                            88.73f,
                            -87.4f,
                            -103.9f,
                            -104.0f,
                            20.0f,
                            20.000002f,
                            1e-30f,
                            -1e-30f};
  for (std::uint64_t b = 0; b < (std::uint64_t{1} << 32); b += 4099)
    values.push_back(std::bit_cast<float>(static_cast<std::uint32_t>(b)));
  const tensor<float> x{shape{static_cast<std::int64_t>(values.size())}, values};
  // The distance to the exact value in units of the float spacing there (2^-149 below the normals).
  auto ulps = [](float got, double exact) {
    const float rounded = static_cast<float>(exact);
    const double spacing = std::max(static_cast<double>(std::nextafter(std::abs(rounded), inf) - std::abs(rounded)),
                                    std::ldexp(1.0, -149));
    return std::abs(static_cast<double>(got) - exact) / spacing;
  };
  auto check = [&](const char* name, const tensor<float>& y, double (*exact)(double), double bound) {
    double worst = 0;
    float worst_at = 0;
    std::size_t specials = 0, wrong_specials = 0;
    for (std::size_t i = 0; i < values.size(); ++i) {
      const double e = exact(static_cast<double>(values[i]));
      const float got = y.data()[i];
      if (std::isnan(e) || std::abs(e) > std::numeric_limits<float>::max()) {  // NaN, or beyond float: exactly so
        ++specials;
        const bool same = std::isnan(e) ? std::isnan(got) : got == static_cast<float>(e);
        if (!same) {
          ++wrong_specials;
          BOOST_TEST_MESSAGE(name << " at " << values[i] << ": " << got << ", exact " << e);
        }
        continue;
      }
      const double u = ulps(got, e);
      if (!(u <= worst)) worst = u, worst_at = values[i];
    }
    BOOST_TEST(wrong_specials == 0u, name << ": " << wrong_specials << " of " << specials << " special values wrong");
    BOOST_TEST(worst <= bound, name << ": worst " << worst << " ulp at x = " << worst_at);
    BOOST_TEST_MESSAGE(name << ": worst " << worst << " ulp over " << values.size() << " values");
  };
  check("exp", nn::exp(r, x), [](double v) { return std::exp(v); }, 1.5);
  check("log", nn::log(r, x), [](double v) { return std::log(v); }, 1.5);
  check("sigmoid", nn::sigmoid(r, x), [](double v) { return 1 / (1 + std::exp(-v)); }, 3.0);
  check("softplus", nn::softplus(r, x), [](double v) { return v > 20 ? v : std::log1p(std::exp(v)); }, 3.0);
  // Of beta x as float rounds it (as PyTorch's does): e^(beta x) is exact to that product.
  check(
      "softplus, beta 2.5, threshold 4", nn::softplus(r, x, 2.5f, 4.0f),
      [](double v) {
        const double z = static_cast<double>(2.5f * static_cast<float>(v));
        return z > 4 ? v : std::log1p(std::exp(z)) / 2.5;
      },
      3.5);
  tensor<float> ones{x.shape()};
  std::fill(ones.begin(), ones.end(), 1.0f);
  check(
      "softplus' (its backward)", nn::softplus_backward(r, x, nn::softplus(r, x), ones),
      [](double v) { return v > 20 ? 1.0 : (std::isnan(v) ? v : 1 / (1 + std::exp(-v))); }, 3.0);
}

// A value's bits do not depend on where it lies: one by one (the functions' value(x), as a
// recorded gradient recomputes it) = in bulk on 1 or 2 threads = in a tensor that starts 5 values
// later = the serial engine's; forward, backward by hand and on a tape.
BOOST_AUTO_TEST_CASE(float_functions_have_the_same_bits_wherever_a_value_lies) {
  namespace k = nn::detail::kernels;
  const std::int64_t n = 50'007;  // past the engine's parallel grain (2^15), not a multiple of a block
  auto x = random_tensor<float>(shape{n}, 11, -30.0, 30.0);
  const auto dy = random_tensor<float>(shape{n}, 12);
  x.data()[3] = std::numeric_limits<float>::infinity();
  x.data()[n - 2] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> positive(x.begin(), x.end());
  for (auto& v : positive) v = std::abs(v) + 1e-3f;
  auto bits_equal = [](const float* a, const float* b, std::int64_t count) {
    for (std::int64_t i = 0; i < count; ++i)
      if (std::bit_cast<std::uint32_t>(a[i]) != std::bit_cast<std::uint32_t>(b[i])) return false;
    return true;
  };
  dist::engine<dist::cpu> one{{.threads = 1}}, two{{.threads = 2}};
  auto check = [&](const std::string& name, auto op, const std::vector<float>& in) {
    using Op = decltype(op);
    static_assert(dist::block_functor<k::unary_forward<float, Op>>, "float functions run a block at a time on the CPU");
    static_assert(!dist::block_functor<k::unary_forward<double, k::exp_op<double>>>,
                  "double ones one value at a time, through <cmath>");
    std::vector<float> alone(in.size()), bulk(in.size()), derivative(in.size());
    for (std::size_t i = 0; i < in.size(); ++i) alone[i] = op.value(in[i]);
    for (auto* e : {&one, &two}) {
      e->for_each(n, k::unary_forward<float, Op>{in.data(), bulk.data(), op});
      BOOST_TEST(bits_equal(bulk.data(), alone.data(), n), name << " on " << e->threads() << " thread(s)");
      e->for_each(n - 5, k::unary_forward<float, Op>{in.data() + 5, bulk.data(), op});
      BOOST_TEST(bits_equal(bulk.data(), alone.data() + 5, n - 5), name << ", 5 values later");
    }
    dist::serial_engine{}.for_each(n, k::unary_forward<float, Op>{in.data(), bulk.data(), op});
    BOOST_TEST(bits_equal(bulk.data(), alone.data(), n), name << " on the serial engine");
    // dL/dx = dy f'(x): from x and y by hand, from x alone on a tape.
    for (std::int64_t i = 0; i < n; ++i) derivative[i] = dy.data()[i] * op.derivative(in[i], alone[i]);
    two.for_each(n, k::unary_backward<float, Op>{in.data(), alone.data(), dy.data(), bulk.data(), op});
    BOOST_TEST(bits_equal(bulk.data(), derivative.data(), n), name << "'s backward");
    two.for_each(n, nn::detail::unary_backward_from_x<float, Op>{in.data(), dy.data(), bulk.data(), op});
    BOOST_TEST(bits_equal(bulk.data(), derivative.data(), n), name << "'s backward from x alone (a tape's)");
  };
  const std::vector<float> xs(x.begin(), x.end());
  check("exp", k::exp_op<float>{}, xs);
  check("log", k::log_op<float>{}, positive);
  check("sigmoid", k::sigmoid_op<float>{}, xs);
  check("softplus", k::softplus_op<float>{1.0f, 20.0f}, xs);
  check("softplus, beta 2.5, threshold 4", k::softplus_op<float>{2.5f, 4.0f}, xs);
  // Through the public functions and a tape on a replica: the same values.
  auto r = nn::local();
  const auto y = nn::softplus(r, x);
  std::vector<float> alone(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) alone[i] = k::softplus_op<float>{1.0f, 20.0f}.value(x.data()[i]);
  BOOST_TEST(bits_equal(y.data(), alone.data(), n));
  nn::tape<replica, float> t{r};
  const auto v = t.watch(x);
  t.backward(nn::softplus(t, v), dy);
  const auto by_hand = nn::softplus_backward(r, x, y, dy);
  BOOST_TEST(bits_equal(t.gradient(v).data(), by_hand.data(), n), "the tape's gradient is the one by hand");
}

BOOST_AUTO_TEST_CASE(broadcasting_follows_numpy_and_sums_the_gradients_back) {
  auto r = nn::local();
  const auto a = random_tensor<double>(shape{2, 3, 4, 5}, 3);
  struct pair_case {
    shape other;
    const char* name;
  };
  for (const auto& c :
       {pair_case{shape{3, 1, 1}, "[C,1,1]"}, pair_case{shape{2, 3, 1, 1}, "[N,C,1,1]"},
        pair_case{shape{2, 1, 4, 5}, "[N,1,H,W]"}, pair_case{shape{1}, "[1]"}, pair_case{shape{5}, "[W]"}}) {
    const auto b = random_tensor<double>(c.other, 4, 0.5, 1.5);
    // Values: element (n, ch, h, w) pairs with b at the same place where b's extent is not 1.
    const auto sum = nn::add(r, a, b), diff = nn::sub(r, b, a), prod = nn::mul(r, a, b), quot = nn::div(r, a, b);
    BOOST_REQUIRE_EQUAL(sum.shape(), a.shape());
    BOOST_REQUIRE_EQUAL(diff.shape(), a.shape());
    // b's element for a's (n, ch, h, w): b aligned at the last axis, its axes of extent 1 read at 0.
    auto b_at = [&](std::int64_t i) {
      const std::int64_t at[4] = {i / 60, i / 20 % 3, i / 5 % 4, i % 5};
      std::int64_t index = 0;
      for (std::size_t k = 4 - b.shape().rank(); k < 4; ++k) {
        const std::int64_t extent = b.shape()[k - (4 - b.shape().rank())];
        index = index * extent + (extent == 1 ? 0 : at[k]);
      }
      return index;
    };
    for (std::int64_t i = 0; i < a.shape().numel(); ++i) {
      const double va = a.data()[i], vb = b.data()[b_at(i)];
      BOOST_TEST(sum.data()[i] == va + vb);
      BOOST_TEST(diff.data()[i] == vb - va);
      BOOST_TEST(prod.data()[i] == va * vb);
      BOOST_TEST(quot.data()[i] == va / vb);
    }
  }
  // Gradients, on a smaller [N, C, H, W] against each kind of operand.
  const auto ap = random_tensor<double>(shape{2, 3, 2, 2}, 5);
  for (const auto& c : {pair_case{shape{3, 1, 1}, "[C,1,1]"}, pair_case{shape{2, 3, 1, 1}, "[N,C,1,1]"},
                        pair_case{shape{2, 1, 2, 2}, "[N,1,H,W]"}, pair_case{shape{1}, "[1]"},
                        pair_case{shape{2}, "[W]"}, pair_case{shape{2, 3, 2, 2}, "the same shape"}}) {
    const auto bp = random_tensor<double>(c.other, 6, 0.5, 1.5);
    for (auto [name, op] : {std::pair<const char*, int>{"add", 0}, {"sub", 1}, {"mul", 2}, {"div", 3}}) {
      auto f = [op](tape_d& t, var u, var v) {
        return op == 0 ? nn::add(t, u, v) : op == 1 ? nn::sub(t, u, v) : op == 2 ? nn::mul(t, u, v) : nn::div(t, u, v);
      };
      check_tape_gradients([&](tape_d& t, const std::vector<var>& v) { return f(t, v[0], v[1]); }, {ap, bp},
                           std::string(name) + " with " + c.name);
      check_tape_gradients([&](tape_d& t, const std::vector<var>& v) { return f(t, v[1], v[0]); }, {ap, bp},
                           std::string(name) + " with " + c.name + " first");
    }
  }
  // Both operands broadcast: [2, 1, 3] and [4, 1] give [2, 4, 3].
  const auto p = random_tensor<double>(shape{2, 1, 3}, 7), q = random_tensor<double>(shape{4, 1}, 8, 0.5, 1.5);
  BOOST_TEST(nn::mul(r, p, q).shape() == (shape{2, 4, 3}));
  check_tape_gradients([](tape_d& t, const std::vector<var>& v) { return nn::mul(t, v[0], v[1]); }, {p, q},
                       "mul of [2,1,3] and [4,1]");
  // By hand: mul_backward gives the operands' shapes.
  const auto [da, db] = nn::mul_backward(r, p, q, random_tensor<double>(shape{2, 4, 3}, 9));
  BOOST_TEST(da.shape() == p.shape());
  BOOST_TEST(db.shape() == q.shape());

  const std::string e = error_of([&] { nn::add(r, a, random_tensor<double>(shape{3, 4, 4}, 1)); });
  BOOST_TEST(mentions(e, "add"), e);
  BOOST_TEST(mentions(e, "(2, 3, 4, 5)"), e);
  BOOST_TEST(mentions(e, "(3, 4, 4)"), e);
  BOOST_TEST(mentions(e, "broadcast"), e);
}

BOOST_AUTO_TEST_CASE(reductions_over_chosen_axes_with_and_without_keepdim) {
  auto r = nn::local();
  const auto x = random_tensor<double>(shape{2, 3, 4, 5}, 11);
  auto at = [&](std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
    return x.data()[((n * 3 + c) * 4 + h) * 5 + w];
  };
  const auto s = nn::sum(r, x, {2, 3}, true);
  BOOST_TEST(s.shape() == (shape{2, 3, 1, 1}));
  const auto s2 = nn::sum(r, x, {-1, -2});
  BOOST_TEST(s2.shape() == (shape{2, 3}));
  const auto m = nn::mean(r, x, 1);
  BOOST_TEST(m.shape() == (shape{2, 4, 5}));
  const auto mx = nn::max(r, x, {0, 2}, true);
  BOOST_TEST(mx.shape() == (shape{1, 3, 1, 5}));
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t c = 0; c < 3; ++c) {
      double plane = 0;
      for (std::int64_t h = 0; h < 4; ++h)
        for (std::int64_t w = 0; w < 5; ++w) plane += at(n, c, h, w);
      BOOST_TEST(std::abs(s.data()[n * 3 + c] - plane) < 1e-12);
      BOOST_TEST(s2.data()[n * 3 + c] == s.data()[n * 3 + c]);
    }
  for (std::int64_t c = 0; c < 3; ++c)
    for (std::int64_t w = 0; w < 5; ++w) {
      double best = -1e300;
      for (std::int64_t n = 0; n < 2; ++n)
        for (std::int64_t h = 0; h < 4; ++h) best = std::max(best, at(n, c, h, w));
      BOOST_TEST(mx.data()[c * 5 + w] == best);
    }
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t h = 0; h < 4; ++h)
      for (std::int64_t w = 0; w < 5; ++w)
        BOOST_TEST(std::abs(m.data()[(n * 4 + h) * 5 + w] - (at(n, 0, h, w) + at(n, 1, h, w) + at(n, 2, h, w)) / 3) <
                   1e-12);
  // Over all: rank 0, one element.
  const auto all = nn::sum(r, x);
  BOOST_TEST(all.shape().rank() == 0u);
  BOOST_TEST(all.size() == 1u);
  BOOST_TEST(std::abs(nn::mean(r, x).data()[0] - all.data()[0] / 120) < 1e-14);
  BOOST_TEST(nn::max(r, x).data()[0] == *std::max_element(x.data(), x.data() + x.size()));

  // argmax: the first of equal maxima; over more terms than one chunk (the passes of 256) too.
  const tensor<float> logits{shape{2, 4}, std::vector<float>{0, 3, 3, 1, -1, -2, -0.5f, -3}};
  const auto am = nn::argmax(r, logits, 1);
  BOOST_TEST(am.shape() == (shape{2}));
  BOOST_TEST((am.data()[0] == 1 && am.data()[1] == 2));
  std::vector<float> long_row(70'000, 0.0f);
  long_row[51'234] = 5;
  long_row[60'000] = 5;
  const tensor<float> lr{shape{1, 70'000}, long_row};
  BOOST_TEST(nn::argmax(r, lr, 1).data()[0] == 51'234);
  BOOST_TEST(nn::argmax(r, lr).data()[0] == 51'234);
  BOOST_TEST(nn::max(r, lr, 1).data()[0] == 5.0f);
  // A large sum against a double loop.
  double total = 0;
  for (float v : long_row) total += v;
  BOOST_TEST(nn::sum(r, lr).data()[0] == static_cast<float>(total));

  // Gradients.
  const auto small = random_tensor<double>(shape{2, 3, 2, 3}, 12);
  check_unary([](tape_d& t, var v) { return nn::sum(t, v, {2, 3}, true); }, small, "sum over H, W, keepdim");
  check_unary([](tape_d& t, var v) { return nn::sum(t, v, 1); }, small, "sum over C");
  check_unary([](tape_d& t, var v) { return nn::sum(t, v); }, small, "sum over all");
  check_unary([](tape_d& t, var v) { return nn::mean(t, v, {0, -1}); }, small, "mean over N and W");
  check_unary([](tape_d& t, var v) { return nn::mean(t, v); }, small, "mean over all");
  check_unary([](tape_d& t, var v) { return nn::max(t, v, 1, true); }, small, "max over C, keepdim");
  check_unary([](tape_d& t, var v) { return nn::max(t, v, {2, 3}); }, small, "max over H, W");
  check_unary([](tape_d& t, var v) { return nn::max(t, v); }, small, "max over all");

  std::string e = error_of([&] { nn::sum(r, x, 4); });
  BOOST_TEST((mentions(e, "sum") && mentions(e, "axis 4") && mentions(e, "(2, 3, 4, 5)")), e);
  e = error_of([&] { nn::mean(r, x, {1, -3}); });
  BOOST_TEST((mentions(e, "twice") && mentions(e, "(2, 3, 4, 5)")), e);
  e = error_of([&] { nn::sum_to(r, x, shape{4, 4}); });
  BOOST_TEST((mentions(e, "(2, 3, 4, 5)") && mentions(e, "(4, 4)")), e);
}

// The maximum keeps the term a walk in index order keeps (the GPU's one pass walks so): the first of
// equal maxima, -0 and +0 being equal, and the first NaN where there is one. Rows with many ties and
// a rare largest value, shorter and longer than the host's chunks (256 terms) and blocks (16),
// contiguous (the last axis) and strided (the first), over one thread's worth and over several.
BOOST_AUTO_TEST_CASE(max_and_argmax_keep_the_first_maximum_or_the_first_nan) {
  auto r = nn::local();
  std::mt19937 gen(5);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto walk = [](const float* p, std::int64_t n, std::int64_t step) {
    float best = 0;
    std::int64_t where = -1;
    for (std::int64_t k = 0; k < n; ++k) {
      const float v = p[k * step];
      const bool v_nan = v != v, best_nan = where >= 0 && best != best;
      if (where < 0 || (!best_nan && (v_nan || v > best))) {
        best = v;
        where = k;
      }
    }
    return std::pair{best, where};
  };
  std::uniform_int_distribution<int> pick(0, 599);
  for (const std::int64_t length : {1, 15, 16, 17, 33, 255, 256, 257, 4096, 5000}) {
    const std::int64_t rows = 48;
    std::vector<float> v(static_cast<std::size_t>(rows * length));
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t k = 0; k < length; ++k) {
        const int u = pick(gen);
        float& e = v[static_cast<std::size_t>(row * length + k)];
        // Rows 0-7 are zeros of both signs only; rows 8-15 have NaNs; the others ties of 1 and a rare 2.
        e = row < 8 ? (u % 2 ? 0.0f : -0.0f) : u < 2 ? 2.0f : u < 300 ? 1.0f : u % 2 ? 0.0f : -0.0f;
        if (row >= 8 && row < 16 && u < 4) e = nan;
      }
    const tensor<float> x{shape{rows, length}, v};
    const auto values = nn::max(r, x, 1);
    const auto places = nn::argmax(r, x, 1);
    std::vector<float> t(v.size());  // the transpose: the same rows down axis 0
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t k = 0; k < length; ++k)
        t[static_cast<std::size_t>(k * rows + row)] = v[static_cast<std::size_t>(row * length + k)];
    const tensor<float> xt{shape{length, rows}, t};
    const auto values_t = nn::max(r, xt, 0);
    const auto places_t = nn::argmax(r, xt, 0);
    for (std::int64_t row = 0; row < rows; ++row) {
      const auto [best, where] = walk(v.data() + row * length, length, 1);
      const auto i = static_cast<std::size_t>(row);
      BOOST_TEST(places.data()[i] == where, "length " << length << ", row " << row);
      BOOST_TEST(std::bit_cast<std::uint32_t>(values.data()[i]) == std::bit_cast<std::uint32_t>(best),
                 "length " << length << ", row " << row << ": " << values.data()[i] << " against " << best);
      BOOST_TEST(places_t.data()[i] == where, "strided, length " << length << ", row " << row);
      BOOST_TEST(std::bit_cast<std::uint32_t>(values_t.data()[i]) == std::bit_cast<std::uint32_t>(best),
                 "strided, length " << length << ", row " << row);
    }
    const auto [best, where] = walk(v.data(), static_cast<std::int64_t>(v.size()), 1);
    BOOST_TEST(nn::argmax(r, x).data()[0] == where, "over all, length " << length);
  }
}

BOOST_AUTO_TEST_CASE(reshape_permute_and_transpose) {
  auto r = nn::local();
  const auto x = random_tensor<double>(shape{2, 3, 4, 5}, 13);
  BOOST_TEST(nn::reshape(r, x, {-1, 20}).shape() == (shape{6, 20}));
  BOOST_TEST(nn::view(r, x, {2, -1}).shape() == (shape{2, 60}));
  const auto p = nn::permute(r, x, {0, 2, 3, 1});
  BOOST_TEST(p.shape() == (shape{2, 4, 5, 3}));
  const auto tr = nn::transpose(r, x, 1, -1);
  BOOST_TEST(tr.shape() == (shape{2, 5, 4, 3}));
  for (std::int64_t n = 0; n < 2; ++n)
    for (std::int64_t c = 0; c < 3; ++c)
      for (std::int64_t h = 0; h < 4; ++h)
        for (std::int64_t w = 0; w < 5; ++w) {
          const double v = x.data()[((n * 3 + c) * 4 + h) * 5 + w];
          BOOST_TEST(p.data()[((n * 4 + h) * 5 + w) * 3 + c] == v);
          BOOST_TEST(tr.data()[((n * 5 + w) * 4 + h) * 3 + c] == v);
        }
  const auto small = random_tensor<double>(shape{2, 3, 2}, 14);
  check_unary([](tape_d& t, var v) { return nn::reshape(t, v, {3, -1}); }, small, "reshape");
  check_unary([](tape_d& t, var v) { return nn::permute(t, v, {2, 0, 1}); }, small, "permute");
  check_unary([](tape_d& t, var v) { return nn::transpose(t, v, 0, 2); }, small, "transpose");

  std::string e = error_of([&] { nn::reshape(r, x, {7, -1}); });
  BOOST_TEST((mentions(e, "reshape") && mentions(e, "(2, 3, 4, 5)") && mentions(e, "(7, -1)")), e);
  e = error_of([&] { nn::reshape(r, x, {-1, -1}); });
  BOOST_TEST(mentions(e, "two -1s"), e);
  e = error_of([&] { nn::permute(r, x, {0, 1, 1, 2}); });
  BOOST_TEST((mentions(e, "permute") && mentions(e, "(0, 1, 1, 2)") && mentions(e, "(2, 3, 4, 5)")), e);
}

BOOST_AUTO_TEST_CASE(one_hot_rows_and_their_errors) {
  auto r = nn::local();
  const auto y = nn::one_hot<float>(r, std::vector<int>{2, 0, 1}, 3);
  BOOST_TEST(y.shape() == (shape{3, 3}));
  const std::vector<float> want{0, 0, 1, 1, 0, 0, 0, 1, 0};
  BOOST_TEST(std::vector<float>(y.data(), y.data() + y.size()) == want, boost::test_tools::per_element());
  const std::string e = error_of([&] { nn::one_hot<float>(r, std::vector<int>{1, 3}, 3); });
  BOOST_TEST((mentions(e, "label 3") && mentions(e, "position 1") && mentions(e, "[0, 3)")), e);
}

BOOST_AUTO_TEST_CASE(a_loss_written_from_operations_trains_a_layer) {
  // A projection term and a softplus loss, written from the operations on a tape, in float; the
  // backward from the one-element mean (dL/dL = 1) reaches the layer's parameters.
  auto r = nn::local();
  nn::linear<float> lin{{.in_features = 4, .out_features = 3}, 5};
  const auto x = random_tensor<float>(shape{6, 4}, 15), e = random_tensor<float>(shape{6, 3}, 16);
  nn::tape t{r};
  const auto h = t(lin, t.constant(x));
  const auto score = nn::sum(t, nn::mul(t, h, t.constant(e)), 1);
  const auto loss = nn::mean(t, nn::softplus(t, nn::scale(t, score, -1.0)));
  BOOST_TEST(loss.shape().rank() == 0u);
  t.backward(loss);
  double norm = 0;
  lin.for_each_parameter([&](std::span<float>, std::span<float> g) {
    for (float v : g) norm += std::abs(v);
  });
  BOOST_TEST(norm > 0.0);
  nn::tape t2{r};
  const auto v = t2.watch(x);
  const std::string err = error_of([&] { t2.backward(v); });
  BOOST_TEST((mentions(err, "(6, 4)") && mentions(err, "one element")), err);
}

namespace {
// A model of two inputs written for a tape: out = linear(x) + <embed(y), linear(x)> per example.
struct two_input_model {
  nn::linear<double> features{{.in_features = 3, .out_features = 4}, 21};
  nn::linear<double> embed{{.in_features = 2, .out_features = 4, .bias = false}, 22};
  var operator()(tape_d& t, var x, var y) {
    const var h = t(features, x);
    return nn::sum(t, nn::mul(t, h, t(embed, y)), 1, true);
  }
  template <class F>
  void for_each_parameter(F&& f) {
    features.for_each_parameter(f);
    embed.for_each_parameter(f);
  }
};
std::vector<double> all_gradients(two_input_model& m) {
  std::vector<double> g;
  m.for_each_parameter([&](std::span<double>, std::span<double> grad) { g.insert(g.end(), grad.begin(), grad.end()); });
  return g;
}
}  // namespace

BOOST_AUTO_TEST_CASE(models_of_several_inputs_and_their_frozen_calls) {
  auto r = nn::local();
  two_input_model m;
  const auto x = random_tensor<double>(shape{5, 3}, 23), y = random_tensor<double>(shape{5, 2}, 24);
  // Its input gradients, against differences.
  check_tape_gradients([&m](tape_d& t, const std::vector<var>& v) { return t(m, v[0], v[1]); }, {x, y},
                       "a model of two inputs");
  // Not frozen: the parameters get gradients.
  {
    tape_d t{r};
    t.backward(t(m, t.constant(x), t.constant(y)), random_tensor<double>(shape{5, 1}, 25));
  }
  const auto trained = all_gradients(m);
  BOOST_TEST(std::any_of(trained.begin(), trained.end(), [](double g) { return g != 0.0; }));
  // Frozen: every layer the model calls leaves its gradients as they were; the inputs' still flow.
  tape_d t{r};
  const var vx = t.watch(x);
  t.backward(t(m, vx, t.constant(y), nn::frozen), random_tensor<double>(shape{5, 1}, 25));
  BOOST_TEST(all_gradients(m) == trained, boost::test_tools::per_element());
  BOOST_TEST(!t.gradient(vx).empty());
}

BOOST_AUTO_TEST_SUITE_END()

namespace {
// docs/nn.md's "Writing your own layer", as printed there.
template <class T = float, dist::device D = dist::cpu>
class scaled_softsign {  // y = a x / (1 + |x|), one parameter a
 public:
  using scalar_type = T;
  using device_type = D;
  using tensor_type = dist::tensor<T, D>;
  struct state_type {
    tensor_type x, d;
  };  // what backward needs: x and 1 + |x|

  explicit scaled_softsign(std::uint64_t seed, const D& device = {})
      : a_{dist::shape{1}, nn::init::scale, seed, device},
        one_{tensor_type::from_host(dist::shape{1}, std::vector<T>{T(1)}, device)} {}

  template <class R>
  tensor_type forward(R& r, const tensor_type& x, state_type& s) {
    s.x = x;
    s.d = nn::add(r, nn::abs(r, x), one_);  // [1] broadcasts
    return nn::mul(r, nn::div(r, x, s.d), a_.value);
  }
  template <class R>
  tensor_type backward(R& r, state_type& s, const tensor_type& dy) {
    auto [du, da] = nn::mul_backward(r, nn::div(r, s.x, s.d), a_.value, dy);
    nn::axpy(r, T(1), da, a_.grad);             // gradients accumulate
    return nn::div(r, du, nn::square(r, s.d));  // d(x / (1 + |x|))/dx
  }
  template <class R>
  tensor_type forward(R& r, const tensor_type& x) {
    return forward(r, x, kept_);
  }
  template <class R>
  tensor_type backward(R& r, const tensor_type& dy) {
    return backward(r, kept_, dy);
  }

  template <class F>
  void for_each_parameter(F&& f) {
    a_.visit(f);
  }
  void zero_grad() { a_.zero_grad(); }
  void set_training(bool) {}
  template <class S>
  void name_state(S& s) {
    s.parameter("a", a_);
  }  // its state-dict name

 private:
  nn::parameter<T, D> a_;
  tensor_type one_;
  state_type kept_;
};
}  // namespace

BOOST_AUTO_TEST_SUITE(operations)

BOOST_AUTO_TEST_CASE(the_documented_layer_of_ones_own_checks_and_trains_on_a_tape) {
  static_assert(nn::layer_with_state<scaled_softsign<float>>);
  scaled_softsign<double> exact{3};
  const auto report = nn::check_gradients(exact, random_tensor<double>(shape{4, 5}, 31));
  (void)report;
  // Called twice on one tape, its gradient of a gets both calls' parts.
  auto r = nn::local();
  scaled_softsign<float> layer{3};
  const auto x = random_tensor<float>(shape{4, 5}, 32);
  nn::tape t{r};
  const auto v = t.watch(x);
  t.backward(nn::mean(t, nn::square(t, nn::sub(t, t(layer, v), t(layer, nn::scale(t, v, 2.0f))))));
  float ga = 0;
  layer.for_each_parameter([&](std::span<float>, std::span<float> g) { ga = g[0]; });
  BOOST_TEST(ga != 0.0f);
  BOOST_TEST(t.gradient(v).shape() == x.shape());
}

BOOST_AUTO_TEST_SUITE_END()
