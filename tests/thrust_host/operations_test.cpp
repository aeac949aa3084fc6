// The operations between layers (nn/shape_ops.hpp, reductions.hpp, broadcasting.hpp,
// elementwise.hpp, tape_ops.hpp) computed by an engine whose passes are the Thrust loops of
// cuda/engine/detail/thrust_for_each.hpp on the host: the calls, functors and index arithmetic a GPU
// engine runs, against the CPU engine's results, element by element (the same bits: each element is
// computed by the same functor, and the sums add in double here in index order against the CPU's
// fixed order, so those are compared to 1e-12 relative before the rounding to float).

#include <boost/test/unit_test.hpp>

#include <distribute/cuda/engine/detail/thrust_for_each.hpp>
#include <distribute/nn/tape_ops.hpp>

#include <thrust/fill.h>
#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/discard_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/reduce.h>
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

struct segment_of {
  std::int64_t size;
  std::int64_t operator()(std::int64_t j) const { return j / size; }
};

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
  template <class F>
  void segmented_sum(std::int64_t segments, std::int64_t length, F f, double* out) const {
    if (segments <= 0) return;
    if (length <= 0) {
      thrust::fill_n(thrust::cpp::par, out, segments, 0.0);
      return;
    }
    const thrust::counting_iterator<std::int64_t> first(0);
    const auto keys = thrust::make_transform_iterator(first, segment_of{length});
    const auto terms = thrust::make_transform_iterator(first, dist::detail::thrust_loops::plane_term<F>{f, length});
    thrust::reduce_by_key(thrust::cpp::par, keys, keys + segments * length, terms, thrust::make_discard_iterator(),
                          out);
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

BOOST_AUTO_TEST_SUITE_END()
