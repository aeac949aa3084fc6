// Average pooling against PyTorch's values and central finite differences; dropout's masks: their
// rate and scale, the same mask in backward, the identity in evaluation, and draws that depend on the
// seed, the replica and the pass but not on the thread count; the errors of both.

#include "nn_test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
using dist::shape;
using dist::tensor;

namespace {

using distribute::test::error_of;
using distribute::test::mentions;
template <class T>
bool same_bits(const tensor<T>& a, const tensor<T>& b) {
  return a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

void check_close(std::span<const double> got, const std::vector<double>& expected, const std::string& what) {
  BOOST_TEST_REQUIRE(got.size() == expected.size(), what);
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double scale = std::max({std::abs(got[i]), std::abs(expected[i]), 1e-12});
    BOOST_TEST(std::abs(got[i] - expected[i]) <= 1e-6 * scale,
               what << "[" << i << "]: " << got[i] << " against " << expected[i]);
  }
}

// x = torch.arange(40, dtype=torch.float64).reshape(1, 2, 4, 5) * 0.1 - 1.45;
// y = torch.nn.AvgPool2d(k, stride=s)(x); dy = torch.arange(y.numel()).reshape(y.shape) * 0.5 - 1.0;
// y.backward(dy). The literals are PyTorch's (2.15) printed y and x.grad.
const std::vector<double> pytorch_pool_k3_s1_y{-0.85,
                                               -0.75,
                                               -0.6499999999999999,
                                               -0.3499999999999999,
                                               -0.24999999999999994,
                                               -0.1499999999999998,
                                               1.15,
                                               1.2500000000000002,
                                               1.3500000000000003,
                                               1.65,
                                               1.7500000000000004,
                                               1.8500000000000003};
const std::vector<double> pytorch_pool_k3_s1_dx{-0.1111111111111111,
                                                -0.16666666666666666,
                                                -0.16666666666666666,
                                                -0.05555555555555555,
                                                0.0,
                                                -0.05555555555555555,
                                                0.0,
                                                0.16666666666666666,
                                                0.2222222222222222,
                                                0.16666666666666666,
                                                -0.05555555555555555,
                                                0.0,
                                                0.16666666666666666,
                                                0.2222222222222222,
                                                0.16666666666666666,
                                                0.05555555555555555,
                                                0.16666666666666666,
                                                0.3333333333333333,
                                                0.2777777777777778,
                                                0.16666666666666666,
                                                0.2222222222222222,
                                                0.5,
                                                0.8333333333333333,
                                                0.6111111111111112,
                                                0.3333333333333333,
                                                0.6111111111111112,
                                                1.3333333333333333,
                                                2.1666666666666665,
                                                1.5555555555555556,
                                                0.8333333333333333,
                                                0.6111111111111112,
                                                1.3333333333333333,
                                                2.1666666666666665,
                                                1.5555555555555556,
                                                0.8333333333333333,
                                                0.3888888888888889,
                                                0.8333333333333333,
                                                1.3333333333333333,
                                                0.9444444444444444,
                                                0.5};
const std::vector<double> pytorch_pool_k2_y{-1.15,
                                            -0.95,
                                            -0.1499999999999999,
                                            0.050000000000000155,
                                            0.8500000000000001,
                                            1.0500000000000003,
                                            1.85,
                                            2.0500000000000003};
const std::vector<double> pytorch_pool_k2_dx{-0.25, -0.25, -0.125, -0.125, 0.0, -0.25, -0.25, -0.125, -0.125, 0.0,
                                             0.0,   0.0,   0.125,  0.125,  0.0, 0.0,   0.0,   0.125,  0.125,  0.0,
                                             0.25,  0.25,  0.375,  0.375,  0.0, 0.25,  0.25,  0.375,  0.375,  0.0,
                                             0.5,   0.5,   0.625,  0.625,  0.0, 0.5,   0.5,   0.625,  0.625,  0.0};

}  // namespace

BOOST_AUTO_TEST_SUITE(pooling_dropout)

BOOST_AUTO_TEST_CASE(avg_pool2d_matches_pytorch) {
  tensor<double> x{shape::nchw(1, 2, 4, 5)};
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(i) * 0.1 - 1.45;
  auto r = nn::local();
  struct row {
    std::int64_t kernel, stride;
    shape out;
    const std::vector<double>& y;
    const std::vector<double>& dx;
  };
  for (const row& t : {row{3, 1, shape::nchw(1, 2, 2, 3), pytorch_pool_k3_s1_y, pytorch_pool_k3_s1_dx},
                       row{2, 0, shape::nchw(1, 2, 2, 2), pytorch_pool_k2_y, pytorch_pool_k2_dx}}) {
    nn::avg_pool2d<double> pool{{.kernel = t.kernel, .stride = t.stride}};
    const auto y = pool.forward(r, x);
    BOOST_TEST_REQUIRE((y.shape() == t.out));
    tensor<double> dy{y.shape()};
    for (std::size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<double>(i) * 0.5 - 1.0;
    const auto dx = pool.backward(r, dy);
    const std::string what = "kernel " + std::to_string(t.kernel) + " stride " + std::to_string(pool.stride());
    check_close(y.values(), t.y, what + ": y");
    check_close(dx.values(), t.dx, what + ": dx");
  }
}

BOOST_AUTO_TEST_CASE(avg_pool2d_backward) {
  using dist::test::check_gradients;
  const auto x = dist::test::random_tensor<double>(shape::nchw(2, 3, 7, 6), 31);
  nn::avg_pool2d<double> overlapping{{.kernel = 3, .stride = 2}};
  check_gradients(overlapping, x, "avg_pool2d kernel 3 stride 2");
  nn::avg_pool2d<double> halving;
  check_gradients(halving, x, "avg_pool2d 2x2");
  nn::avg_pool2d<double> global{{.kernel = 6}};
  check_gradients(global, x, "avg_pool2d over the whole 6x6 of a 7x6 plane");
  nn::sequential net{nn::conv2d<double>{{.in_channels = 3, .out_channels = 4, .kernel = 3, .padding = 1}, 1},
                     nn::avg_pool2d<double>{}, nn::flatten<double>{},
                     nn::linear<double>{{.in_features = 4 * 3 * 3, .out_features = 2}, 2}};
  check_gradients(net, x, "conv, avg_pool2d, flatten, linear");
}

// The CPU engine runs a plane at a time (whole_segment); a GPU runs each element on its own thread
// (operator()). Both must give the same bits, for windows that overlap, tile, leave gaps and leave
// rows and columns uncovered.
BOOST_AUTO_TEST_CASE(avg_pool2d_plane_loops_match_the_per_element_calls) {
  namespace k = nn::detail::kernels;
  struct pool_case {
    std::int64_t h, w, kernel, stride;
  };
  for (const pool_case c : {pool_case{28, 28, 2, 2}, pool_case{7, 6, 3, 2}, pool_case{9, 11, 3, 1},
                            pool_case{10, 7, 2, 3}, pool_case{5, 5, 5, 5}, pool_case{13, 8, 4, 3}}) {
    const std::int64_t oh = (c.h - c.kernel) / c.stride + 1, ow = (c.w - c.kernel) / c.stride + 1, planes = 3;
    const k::pool_geometry g{c.h, c.w, oh, ow, c.kernel, c.stride};
    const auto x = dist::test::random_tensor<float>(shape::nchw(1, planes, c.h, c.w), 5);
    auto dy = dist::test::random_tensor<float>(shape::nchw(1, planes, oh, ow), 6);
    dy.data()[0] = -0.0F;  // 0 + (-0) is +0: the plane loops must sum as the calls do
    tensor<float> y_each{dy.shape()}, y_plane{dy.shape()}, dx_each{x.shape()}, dx_plane{x.shape()};
    for (std::int64_t s = 0; s < planes; ++s) {
      const k::avg_pool_forward<float> fe{x.data(), y_each.data(), g}, fp{x.data(), y_plane.data(), g};
      const k::avg_pool_backward<float> be{dy.data(), dx_each.data(), g}, bp{dy.data(), dx_plane.data(), g};
      for (std::int64_t i = 0; i < oh * ow; ++i) fe(s, i);
      for (std::int64_t i = 0; i < c.h * c.w; ++i) be(s, i);
      fp.whole_segment(s);
      bp.whole_segment(s);
    }
    const std::string what = std::to_string(c.h) + "x" + std::to_string(c.w) + " kernel " + std::to_string(c.kernel) +
                             " stride " + std::to_string(c.stride);
    BOOST_TEST(same_bits(y_each, y_plane), what + ": forward");
    BOOST_TEST(same_bits(dx_each, dx_plane), what + ": backward");
  }
}

BOOST_AUTO_TEST_CASE(avg_pool2d_misuse_is_reported) {
  auto r = nn::local();
  nn::avg_pool2d<float> pool{{.kernel = 3}};
  std::string what = error_of([&] { pool.backward(r, tensor<float>{shape::nchw(1, 1, 1, 1)}); });
  BOOST_TEST(mentions(what, "avg_pool2d::backward called without a forward pass"), what);
  what = error_of([&] { pool.forward(r, tensor<float>{shape{2, 9}}); });
  BOOST_TEST(mentions(what, "avg_pool2d {kernel 3, stride 0 (the kernel size)} got a tensor of shape (2, 9)"), what);
  what = error_of([&] { pool.forward(r, tensor<float>{shape::nchw(1, 1, 2, 5)}); });
  BOOST_TEST(mentions(what, "kernel larger than the planes of (1, 1, 2, 5)"), what);
  pool.forward(r, tensor<float>{shape::nchw(1, 2, 6, 6)});
  what = error_of([&] { pool.backward(r, tensor<float>{shape::nchw(1, 2, 3, 3)}); });
  BOOST_TEST(mentions(what, "backward got dy of shape (1, 2, 3, 3), expected (1, 2, 2, 2)"), what);
  what = error_of([] { nn::avg_pool2d<float>{{.kernel = 0}}; });
  BOOST_TEST(mentions(what, "avg_pool2d {kernel 0, stride 0 (the kernel size)}: kernel is 0 but must be at least 1"),
             what);
  what = error_of([] { nn::avg_pool2d<float>{{.kernel = 2, .stride = -1}}; });
  BOOST_TEST(mentions(what, "stride is -1 but must be at least 1"), what);
}

BOOST_AUTO_TEST_CASE(dropout_drops_at_its_rate_and_scales_what_it_keeps) {
  auto r = nn::local();
  const double rate = 0.3;
  nn::dropout<float> drop{{.rate = rate}, 7};
  const auto x = dist::test::random_tensor<float>(shape{200, 1000}, 41, 0.5, 1.5);  // no zeros
  const auto y = drop.forward(r, x);
  const auto dy = dist::test::random_tensor<float>(x.shape(), 42);
  const auto dx = drop.backward(r, dy);
  const auto scale = static_cast<float>(1.0 / (1.0 - rate));
  std::size_t dropped = 0;
  bool kept_scaled = true, same_mask = true;
  for (std::size_t i = 0; i < x.size(); ++i) {
    const bool kept = y[i] != 0.0f;
    dropped += kept ? 0 : 1;
    kept_scaled = kept_scaled && (!kept || y[i] == x[i] * scale);
    same_mask = same_mask && dx[i] == (kept ? dy[i] * scale : 0.0f);
  }
  const double fraction = static_cast<double>(dropped) / static_cast<double>(x.size());
  BOOST_TEST(std::abs(fraction - rate) < 0.005, "dropped " << fraction);  // 200000 draws: sd 0.001
  BOOST_TEST(kept_scaled);
  BOOST_TEST(same_mask);
  BOOST_TEST(drop.passes() == 1u);
}

BOOST_AUTO_TEST_CASE(dropout_is_the_identity_in_evaluation_and_at_rate_zero) {
  auto r = nn::local();
  const auto x = dist::test::random_tensor<float>(shape::nchw(2, 3, 4, 4), 43);
  nn::dropout<float> drop{{}, 1};
  BOOST_TEST(drop.options().rate == 0.5);
  drop.set_training(false);
  BOOST_TEST(same_bits(drop.forward(r, x), x));
  BOOST_TEST(same_bits(drop.backward(r, x), x));
  BOOST_TEST(drop.passes() == 0u);  // evaluation draws nothing
  nn::dropout<float> none{{.rate = 0.0}, 1};
  BOOST_TEST(same_bits(none.forward(r, x), x));
  BOOST_TEST(same_bits(none.backward(r, x), x));
}

BOOST_AUTO_TEST_CASE(dropout_masks_follow_the_seed_the_pass_and_the_replica) {
  const auto x = dist::test::random_tensor<float>(shape{64, 1024}, 44, 0.5, 1.5);  // above the parallel grain
  auto r = nn::local();
  nn::dropout<float> a{{.rate = 0.5}, 3}, b{{.rate = 0.5}, 3}, c{{.rate = 0.5}, 4};
  const auto a1 = a.forward(r, x), b1 = b.forward(r, x), c1 = c.forward(r, x);
  BOOST_TEST(same_bits(a1, b1));   // the same seed, the same pass
  BOOST_TEST(!same_bits(a1, c1));  // another seed
  const auto a2 = a.forward(r, x);
  BOOST_TEST(!same_bits(a1, a2));  // the next pass
  // A copy that resumes from the pass count (a checkpoint's buffer) draws what the original draws.
  nn::dropout<float> resumed{{.rate = 0.5}, 3};
  resumed.for_each_buffer([](std::span<double> passes) { passes[0] = 2; });
  BOOST_TEST(same_bits(resumed.forward(r, x), a.forward(r, x)));

  // Thread counts do not change the draws; replicas draw differently from one another.
  auto masks = [&](int replicas, int threads) {
    dist::mirrored_strategy<> s{dist::cpu_replicas(replicas)};
    s.set_compute_options({.threads = threads});
    auto layers = s.mirror([](auto&) { return nn::dropout<float>{{.rate = 0.5}, 3}; });
    auto out = s.run([&](dist::replica auto& rr, nn::dropout<float>& d) { return d.forward(rr, x); }, layers);
    s.verify_mirrored(layers);  // every copy counted one pass
    return std::vector<tensor<float>>(out.begin(), out.end());
  };
  const auto one_thread = masks(2, 1), two_threads = masks(2, 2);
  BOOST_TEST(same_bits(one_thread[0], two_threads[0]));
  BOOST_TEST(same_bits(one_thread[1], two_threads[1]));
  BOOST_TEST(same_bits(one_thread[0], a1));  // replica 0 draws what a layer outside any strategy draws
  BOOST_TEST(!same_bits(one_thread[0], one_thread[1]));
}

BOOST_AUTO_TEST_CASE(dropout_misuse_is_reported) {
  auto r = nn::local();
  nn::dropout<float> drop{{.rate = 0.25}, 1};
  std::string what = error_of([&] { drop.backward(r, tensor<float>{shape{2, 3}}); });
  BOOST_TEST(mentions(what, "dropout::backward called without a forward pass"), what);
  drop.forward(r, tensor<float>{shape{2, 3}});
  what = error_of([&] { drop.backward(r, tensor<float>{shape{3, 2}}); });
  BOOST_TEST(mentions(what, "dropout {rate 0.25} backward got dy of shape (3, 2), expected (2, 3)"), what);
  what = error_of([] { nn::dropout<float>{{.rate = 1.0}, 1}; });
  BOOST_TEST(mentions(what, "dropout {rate 1}: rate is 1 but must be in [0, 1)"), what);
  what = error_of([] { nn::dropout<float>{{.rate = -0.1}, 1}; });
  BOOST_TEST(mentions(what, "rate is -0.1 but must be in [0, 1)"), what);
  what = error_of([] { nn::dropout<float>{{.rate = std::nan("")}, 1}; });
  BOOST_TEST(mentions(what, "rate is nan but must be in [0, 1)"), what);
}

BOOST_AUTO_TEST_SUITE_END()
