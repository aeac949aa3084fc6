// The operations between layers (nn/shape_ops.hpp, reductions.hpp, broadcasting.hpp,
// elementwise.hpp, tape_ops.hpp) computed by an engine whose passes are the Thrust loops of
// cuda/engine/detail/thrust_for_each.hpp on the host: the calls, functors and index arithmetic a GPU
// engine runs, against the CPU engine's results, element by element (the same bits: each element is
// computed by the same functor, and the sums add in double here in index order against the CPU's
// fixed order, so those are compared to 1e-12 relative before the rounding to float).
//
// Also R1 and WGAN-GP (nn/penalties.hpp) through a discriminator written for a tape, with the layers'
// recorded backwards (nn::create_graph) on the Thrust loops: the element-wise and segmented passes
// are Thrust's, the convolutions and matrix products the CPU engine's (cuDNN's and cuBLAS's on a GPU).

#include <boost/test/unit_test.hpp>

#include "segmented_sums.hpp"
#include "../nn/penalty_discriminator.hpp"

#include <distribute/cuda/engine/detail/thrust_for_each.hpp>
#include <distribute/engine/cpu.hpp>
#include <distribute/nn/activations.hpp>
#include <distribute/nn/conv2d.hpp>
#include <distribute/nn/flatten.hpp>
#include <distribute/nn/instance_norm.hpp>
#include <distribute/nn/layer_norm.hpp>
#include <distribute/nn/linear.hpp>
#include <distribute/nn/module.hpp>
#include <distribute/nn/penalties.hpp>
#include <distribute/nn/pooling.hpp>
#include <distribute/nn/spectral_norm.hpp>
#include <distribute/nn/tape_ops.hpp>

#include <thrust/system/cpp/execution_policy.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::shape;
using dist::tensor;

namespace {

// The elementwise engine's passes through Thrust's loops on the host (thrust::cpp::par).
struct thrust_host_engine {
  template <class F>
  void for_each(std::int64_t n, F f) const {
    dist::detail::for_each_index(thrust::cpp::par, n, f);
  }
  template <class F>
  void for_each_in_segments(std::int64_t segments, std::int64_t length, F f) const {
    dist::detail::for_each_plane_index(thrust::cpp::par, segments, length, f);
  }
  // The GPU engine's sums, planned as it plans them (segmented_sums.hpp).
  template <class F>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out) const {
    thrust_host::segmented_sum(segments, length, f, out);
  }
  template <class F, class Finish>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out, Finish finish) const {
    thrust_host::segmented_sum(segments, length, f, out, finish);
  }
  template <class T>
  void to_host(const T* src, std::size_t n, T* dst) const {
    std::copy(src, src + n, dst);
  }
};
// A replica of the CPU device whose engine is the one above.
struct thrust_replica {
  using device_type = dist::cpu;
  thrust_host_engine e;
  thrust_host_engine& engine() { return e; }
  dist::cpu device() const { return {}; }
};

// The same element-wise passes over the CPU engine, whose convolutions and matrix products the layers
// use (a GPU engine's are cuDNN's and cuBLAS's): what the layers compute on a GPU replica, but those.
// `passes` counts the passes through Thrust.
struct thrust_host_compute_engine : dist::engine<dist::cpu> {
  std::int64_t passes = 0;
  template <class F>
  void for_each(std::int64_t n, F f) {
    ++passes;
    thrust_host_engine{}.for_each(n, f);
  }
  template <class F>
  void for_each_in_segments(std::int64_t segments, std::int64_t length, F f) {
    ++passes;
    thrust_host_engine{}.for_each_in_segments(segments, length, f);
  }
  template <class F>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out) {
    ++passes;
    thrust_host_engine{}.segmented_sum(segments, length, f, out);
  }
  template <class F, class Finish>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out, Finish finish) {
    ++passes;
    thrust_host_engine{}.segmented_sum(segments, length, f, out, finish);
  }
};
struct thrust_layer_replica {
  using device_type = dist::cpu;
  thrust_host_compute_engine e;
  thrust_host_compute_engine& engine() { return e; }
  dist::cpu device() const { return {}; }
};

tensor<float> random_tensor(shape s, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  tensor<float> t{s};
  for (auto& x : t) x = static_cast<float>(d(gen));
  return t;
}

template <class T>
void check_same(const std::string& what, const tensor<T>& got, const tensor<T>& want, double tolerance = 0) {
  BOOST_TEST_CONTEXT(what) {
    BOOST_TEST_REQUIRE(got.shape() == want.shape());
    BOOST_TEST_REQUIRE(got.size() > 0u);
    std::size_t bad = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double a = static_cast<double>(got.data()[i]), b = static_cast<double>(want.data()[i]);
      if (!(std::abs(a - b) <= tolerance * std::max(std::abs(a), std::abs(b))) && !(a == b)) ++bad;
    }
    BOOST_TEST(bad == 0u, bad << " of " << got.size() << " values differ");
  }
}

// penalty_discriminator (tests/nn/penalty_discriminator.hpp): a discriminator written for a tape.

// R1 at `real`, then WGAN-GP at `points`, each with its own backward on replica `r`: the two
// penalties, then every parameter gradient of each (in member order).
template <class R>
std::vector<std::vector<float>> penalties_on(R& r, const tensor<float>& real, const tensor<float>& points) {
  std::vector<std::vector<float>> out;
  penalty_discriminator<> d;
  auto keep_gradients = [&] { d.for_each_parameter([&](auto, auto g) { out.emplace_back(g.begin(), g.end()); }); };
  {
    nn::tape<R, float> t{r};
    const auto p = nn::r1_penalty(t, real, [&](auto v) { return d(t, v); }, {.weight = 10.0});
    out.push_back({p.value()[0]});
    t.backward(p);
  }
  keep_gradients();
  d.zero_grad();
  {
    nn::tape<R, float> t{r};
    const auto p = nn::gradient_penalty_at(t, points, [&](auto v) { return d(t, v); }, {.weight = 10.0});
    out.push_back({p.value()[0]});
    t.backward(p);
  }
  keep_gradients();
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(operations)

BOOST_AUTO_TEST_CASE(the_operations_through_thrust_give_the_cpu_engines_values) {
  thrust_replica g;
  auto c = nn::local();
  const auto x = random_tensor(shape{3, 5, 7, 9}, 1), pos = random_tensor(shape{3, 5, 7, 9}, 2, 0.1, 2.0);
  const auto per_channel = random_tensor(shape{5, 1, 1}, 3, 0.5, 1.5), mask = random_tensor(shape{3, 1, 7, 9}, 4);
  check_same("square", nn::square(g, x), nn::square(c, x));
  check_same("sqrt", nn::sqrt(g, pos), nn::sqrt(c, pos));
  check_same("exp", nn::exp(g, x), nn::exp(c, x));
  check_same("log", nn::log(g, pos), nn::log(c, pos));
  check_same("abs", nn::abs(g, x), nn::abs(c, x));
  check_same("sigmoid", nn::sigmoid(g, x), nn::sigmoid(c, x));
  check_same("softplus", nn::softplus(g, x, 2.0f, 1.0f), nn::softplus(c, x, 2.0f, 1.0f));
  check_same("clamp", nn::clamp(g, x, -0.3f, 0.4f), nn::clamp(c, x, -0.3f, 0.4f));
  check_same("pow", nn::pow(g, pos, 1.5f), nn::pow(c, pos, 1.5f));
  check_same("mul by [C,1,1]", nn::mul(g, x, per_channel), nn::mul(c, x, per_channel));
  check_same("div by [N,1,H,W]", nn::div(g, x, mask), nn::div(c, x, mask));
  check_same("sub of [C,1,1]", nn::sub(g, per_channel, x), nn::sub(c, per_channel, x));
  check_same("permute", nn::permute(g, x, {0, 2, 3, 1}), nn::permute(c, x, {0, 2, 3, 1}));
  check_same("transpose", nn::transpose(g, x, 0, 2), nn::transpose(c, x, 0, 2));
  check_same("sum over H, W", nn::sum(g, x, {2, 3}, true), nn::sum(c, x, {2, 3}, true), 1e-7);
  check_same("mean over N, C", nn::mean(g, x, {0, 1}), nn::mean(c, x, {0, 1}), 1e-7);
  check_same("sum over all", nn::sum(g, x), nn::sum(c, x), 1e-7);
  check_same("max over C", nn::max(g, x, 1), nn::max(c, x, 1));
  check_same("max over all", nn::max(g, x), nn::max(c, x));
  check_same("argmax over W", nn::argmax(g, x, -1), nn::argmax(c, x, -1));
  check_same("broadcast_to", nn::broadcast_to(g, per_channel, x.shape()), nn::broadcast_to(c, per_channel, x.shape()));
  check_same("sum_to", nn::sum_to(g, x, shape{5, 1, 1}), nn::sum_to(c, x, shape{5, 1, 1}), 1e-7);
  check_same("one_hot", nn::one_hot<float>(g, std::vector<int>{4, 0, 2}, 5),
             nn::one_hot<float>(c, std::vector<int>{4, 0, 2}, 5));
  // A maximum over more terms than one chunk pass (256): the passes that fold the chunks.
  const auto wide = random_tensor(shape{2, 3, 40, 50}, 5);
  check_same("max over H, W of 2,000 terms", nn::max(g, wide, {2, 3}), nn::max(c, wide, {2, 3}));
  check_same("argmax over all of 12,000 terms", nn::argmax(g, wide), nn::argmax(c, wide));
}

BOOST_AUTO_TEST_CASE(the_gradients_through_thrust_give_the_cpu_engines) {
  const auto x = random_tensor(shape{3, 5, 7, 9}, 6), b = random_tensor(shape{5, 1, 1}, 7, 0.5, 1.5);
  const auto dy = random_tensor(shape{3, 5}, 8);
  auto grads = [&](auto& r) {
    nn::tape t{r};
    const auto vx = t.watch(x), vb = t.watch(b);
    const auto h = nn::softplus(t, nn::div(t, nn::square(t, vx), vb));
    const auto y = nn::add(t, nn::sum(t, h, {2, 3}), nn::max(t, nn::permute(t, vx, {0, 1, 3, 2}), {2, 3}));
    t.backward(y, dy);
    return std::pair{t.gradient(vx), t.gradient(vb)};
  };
  thrust_replica g;
  auto c = nn::local();
  const auto [gx, gb] = grads(g);
  const auto [cx, cb] = grads(c);
  check_same("dx", gx, cx, 1e-6);
  check_same("db", gb, cb, 1e-6);
}

// R1 and WGAN-GP through the discriminator above: the penalties' values and every parameter gradient
// the Thrust loops give against the CPU engine's, within 1e-5 of the largest magnitude in each
// tensor. The functors are the same; only the segmented sums add in another order (index order here,
// 32 lanes on the CPU for the sums of 36 and 144 terms of spectral norm), both in double: a
// difference near 1e-16 that shows in float only where a value lies on a rounding boundary (an ulp,
// 6e-8), carried through the normalisations' divisions by their deviations in two passes of
// derivatives. A wrong index or functor gives differences of order one. (These sizes give the same
// bits.)
BOOST_AUTO_TEST_CASE(penalties_through_thrust_give_the_cpu_engines) {
  const auto real = random_tensor(shape::nchw(3, 2, 9, 9), 9), points = random_tensor(shape::nchw(3, 2, 9, 9), 10);
  thrust_layer_replica g;
  auto c = nn::local();
  const auto got = penalties_on(g, real, points);
  const auto want = penalties_on(c, real, points);
  BOOST_TEST(g.e.passes > 0);
  BOOST_TEST_REQUIRE(got.size() == want.size());
  BOOST_TEST_REQUIRE(want.size() == 2u * (1 + 12));  // per penalty: its value, 12 parameter gradients
  auto largest = [](const std::vector<float>& v) {
    double m = 0;
    for (const float e : v) m = std::max(m, std::abs(static_cast<double>(e)));
    return m;
  };
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    BOOST_TEST_REQUIRE(got[i].size() == want[i].size());
    const std::size_t first = i - i % 13;  // the penalty's value; its gradients follow
    double everything = 0;                 // the largest magnitude in the penalty's gradients
    for (std::size_t j = first + 1; j < first + 13; ++j) everything = std::max(everything, largest(want[j]));
    const double scale = largest(want[i]);
    double diff = 0;
    for (std::size_t k = 0; k < want[i].size(); ++k) {
      const double d = std::abs(static_cast<double>(got[i][k]) - static_cast<double>(want[i][k]));
      if (!(d <= diff)) diff = d;  // also NaN
    }
    BOOST_TEST_CONTEXT((i % 13 == 0 ? "the value" : "parameter gradient " + std::to_string(i % 13 - 1))
                       << " of " << (i < 13 ? "R1" : "WGAN-GP")) {
      if (i % 13 == 4) {
        // The strided convolution's bias, which instance norm takes out: zero up to rounding on both
        // (rounding that differs with the order of any sum: not compared to itself).
        BOOST_TEST(std::max(scale, largest(got[i])) <= 1e-5 * everything);
      } else {
        // The last layer's bias does not move dD/dx: no gradient reaches it from a penalty.
        if (i % 13 == 12) BOOST_TEST(scale == 0.0);
        else BOOST_TEST(scale > 0.0);
        BOOST_TEST(diff <= 1e-5 * scale, diff << " apart, the largest magnitude " << scale);
        worst = std::max(worst, diff / std::max(scale, 1e-30));
      }
    }
  }
  BOOST_TEST_MESSAGE("penalties through Thrust: largest difference " << worst << " of its tensor's largest magnitude");
}

BOOST_AUTO_TEST_SUITE_END()
