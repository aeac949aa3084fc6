// The layers' element-wise functors (nn/detail/kernels.hpp) run through the Thrust loops of
// cuda/engine/detail/thrust_for_each.hpp, on the host (Thrust's CPP system, thrust::cpp::par), against what
// the CPU layers, losses and optimisers compute for the same inputs: what a GPU engine that runs the
// same functors through the same loops on a CUDA policy builds on. Every value is compared element by
// element to 1e-6 relative; the message of each comparison (--log_level=message) says how many values
// were not identical and the largest relative difference.
//
// Sizes are odd and not multiples of each other: NCHW 3x5x7x9 and 2x3x11x13, logits 7x11, parameters
// of 91 and 7 values.
#define BOOST_TEST_MODULE distribute_thrust_host
#ifndef BOOST_TEST_DYN_LINK  // CMake already defines it; the guard avoids a redefinition warning
#  define BOOST_TEST_DYN_LINK
#endif
#include <boost/test/unit_test.hpp>

#include "segmented_sums.hpp"

#include <distribute/cuda/engine/detail/thrust_for_each.hpp>
#include <distribute/detail/element_kernels.hpp>
#include <distribute/nn/activations.hpp>
#include <distribute/nn/batch_norm.hpp>
#include <distribute/nn/classification_losses.hpp>
#include <distribute/nn/conv2d.hpp>
#include <distribute/nn/conv_transpose2d.hpp>
#include <distribute/nn/detail/kernels.hpp>
#include <distribute/nn/dropout.hpp>
#include <distribute/nn/instance_norm.hpp>
#include <distribute/nn/linear.hpp>
#include <distribute/nn/losses.hpp>
#include <distribute/nn/pooling.hpp>
#include <distribute/nn/residual_block.hpp>
#include <distribute/optim/adam.hpp>
#include <distribute/optim/sgd.hpp>
#include <distribute/optim/detail/update_kernels.hpp>

#include <thrust/iterator/counting_iterator.h>
#include <thrust/iterator/tabulate_output_iterator.h>
#include <thrust/iterator/transform_iterator.h>
#include <thrust/system/cpp/execution_policy.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;
namespace optim = distribute::optim;
namespace kernels = distribute::nn::detail::kernels;
namespace element_kernels = distribute::detail::kernels;
namespace update_kernels = distribute::optim::detail::kernels;
using dist::shape;
using dist::tensor;
using dist::detail::for_each_index;
using dist::detail::for_each_plane_index;

namespace {

constexpr double tolerance = 1e-6;  // relative, per element
const auto& par = thrust::cpp::par;
const shape shapes[] = {shape::nchw(3, 5, 7, 9), shape::nchw(2, 3, 11, 13)};

tensor<float> random_tensor(shape s, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  tensor<float> t{s};
  for (auto& x : t) x = static_cast<float>(d(gen));
  return t;
}
std::int64_t size_of(const tensor<float>& t) { return static_cast<std::int64_t>(t.size()); }

// |got - expected| <= tolerance * max(|got|, |expected|) for every element (zero only against zero).
void check_close(const std::string& what, std::span<const float> got, std::span<const float> expected) {
  BOOST_TEST_REQUIRE(got.size() == expected.size(),
                     what << ": " << got.size() << " values against " << expected.size());
  BOOST_TEST_REQUIRE(!got.empty(), what << ": nothing to compare");
  std::size_t bad = 0, not_identical = 0;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double a = got[i], b = expected[i], diff = std::abs(a - b), scale = std::max(std::abs(a), std::abs(b));
    if (a != b) ++not_identical;
    if (diff > 0) worst = std::max(worst, diff / scale);
    if (!(diff <= tolerance * scale)) {
      if (bad < 5) BOOST_ERROR(what << "[" << i << "]: Thrust " << a << " against the layer's " << b);
      ++bad;
    }
  }
  BOOST_TEST(bad == 0,
             what << ": " << bad << " of " << got.size() << " values differ by more than " << tolerance << " relative");
  BOOST_TEST_MESSAGE(what << ": " << got.size() << " values, " << not_identical
                          << " not identical, largest relative difference " << worst);
}
void check_close(const std::string& what, float got, float expected) {
  check_close(what, std::span<const float>(&got, 1), std::span<const float>(&expected, 1));
}

// --- normalisation through the Thrust loops --------------------------------------------------------

// Per plane: mean and M2 (the sum of squared deviations), two passes of plane sums.
struct plane_moments {
  std::vector<double> mean, m2;
};
plane_moments moments_of(const tensor<float>& x, std::int64_t planes, std::int64_t plane) {
  plane_moments m{std::vector<double>(static_cast<std::size_t>(planes)),
                  std::vector<double>(static_cast<std::size_t>(planes))};
  thrust_host::segmented_sum(planes, plane, kernels::value_of<float>{x.data(), plane}, m.mean.data());
  for (auto& v : m.mean) v /= static_cast<double>(plane);
  thrust_host::segmented_sum(planes, plane, kernels::squared_deviation<float>{x.data(), m.mean.data(), plane},
                             m.m2.data());
  return m;
}

// Per plane: [sum dy | sum dy * xhat].
std::vector<double> gradient_sums_of(const tensor<float>& dy, const std::vector<float>& xhat, std::int64_t planes,
                                     std::int64_t plane) {
  std::vector<double> sums(2 * static_cast<std::size_t>(planes));
  thrust_host::segmented_sum(planes, plane, kernels::value_of<float>{dy.data(), plane}, sums.data());
  thrust_host::segmented_sum(planes, plane, kernels::product_of<float>{dy.data(), xhat.data(), plane},
                             sums.data() + planes);
  return sums;
}

struct normalized {
  std::vector<float> y, xhat;
};
// y = gamma * (x - mean) * invstd + beta, the statistics per plane or per channel.
normalized normalize(const tensor<float>& x, const std::vector<double>& mean, const std::vector<double>& invstd,
                     const float* gamma, const float* beta, bool per_channel) {
  const shape& s = x.shape();
  normalized out{std::vector<float>(x.size()), std::vector<float>(x.size())};
  for_each_plane_index(par, s.n() * s.c(), s.h() * s.w(),
                       kernels::normalize<float>{x.data(), out.y.data(), out.xhat.data(), mean.data(), invstd.data(),
                                                 gamma, beta, s.c(), s.h() * s.w(), per_channel});
  return out;
}
// dx from the coefficients (k, mean(dy), mean(dy xhat)) per plane or per channel.
std::vector<float> input_gradient(const tensor<float>& dy, const std::vector<float>& xhat,
                                  const std::vector<float>& coef, bool per_channel) {
  const shape& s = dy.shape();
  std::vector<float> dx(dy.size());
  for_each_plane_index(par, s.n() * s.c(), s.h() * s.w(),
                       kernels::normalized_input_gradient<float>{dy.data(), xhat.data(), dx.data(), coef.data(), s.c(),
                                                                 s.h() * s.w(), per_channel});
  return dx;
}

// --- losses through the Thrust loops -----------------------------------------------------------------

// Per example: the mean of the functor's values over its elements; the gradient written alongside.
template <template <class> class Kernel>
nn::loss_result<float> per_example_loss(const tensor<float>& pred, const tensor<float>& target, std::int64_t global) {
  const std::int64_t n = pred.shape()[0], per = size_of(pred) / n;
  nn::loss_result<float> out{0.0f, tensor<float>{pred.shape()}};
  std::vector<double> sums(static_cast<std::size_t>(n));
  thrust_host::segmented_sum(n, per,
                             Kernel<float>{pred.data(), target.data(), out.grad.data(),
                                           1.0 / (static_cast<double>(per) * static_cast<double>(global)), per},
                             sums.data());
  std::vector<float> losses(sums.size());
  for (std::size_t i = 0; i < sums.size(); ++i) losses[i] = static_cast<float>(sums[i] / static_cast<double>(per));
  out.value = nn::compute_average_loss(losses, global);
  return out;
}

void check_loss(const std::string& what, const nn::loss_result<float>& thrust, const nn::loss_result<float>& layer) {
  check_close(what + " value", thrust.value, layer.value);
  check_close(what + " gradient", thrust.grad.values(), layer.grad.values());
}

// A parameter's values after each step, per parameter of the model.
using parameter_values = std::vector<std::vector<float>>;
template <class M>
parameter_values values_of(M& model) {
  parameter_values out;
  model.for_each_parameter(
      [&](std::span<float> value, std::span<float>) { out.emplace_back(value.begin(), value.end()); });
  return out;
}
// Fresh gradients for every parameter, written into the model and returned.
template <class M>
parameter_values set_random_gradients(M& model, std::uint32_t seed) {
  parameter_values out;
  model.for_each_parameter([&](std::span<float>, std::span<float> grad) {
    const auto g = random_tensor(shape{static_cast<std::int64_t>(grad.size())}, seed++);
    std::copy(g.begin(), g.end(), grad.begin());
    out.emplace_back(g.begin(), g.end());
  });
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(elementwise)

BOOST_AUTO_TEST_CASE(activations_match_the_layers) {
  auto r = nn::local();
  for (const shape& s : shapes) {
    auto x = random_tensor(s, 1, -2.0, 2.0);
    for (std::size_t i = 0; i < x.size(); i += 17) x[i] = 0.0f;  // the edge of the piecewise-linear ones
    const auto dy = random_tensor(s, 2);
    const std::int64_t n = size_of(x);
    const std::string at = " " + s.to_string();
    std::vector<float> y(x.size()), dx(x.size());
    {
      nn::relu<float> layer;
      const auto ly = layer.forward(r, x);
      const auto ldx = layer.backward(r, dy);
      for_each_index(par, n, kernels::relu_forward<float>{x.data(), y.data()});
      for_each_index(par, n, kernels::relu_backward<float>{x.data(), dy.data(), dx.data()});
      check_close("relu forward" + at, y, ly.values());
      check_close("relu backward" + at, dx, ldx.values());
    }
    for (const float slope : {0.2f, 0.01f}) {
      nn::leaky_relu<float> layer{slope};
      const auto ly = layer.forward(r, x);
      const auto ldx = layer.backward(r, dy);
      for_each_index(par, n, kernels::leaky_relu_forward<float>{x.data(), y.data(), slope});
      for_each_index(par, n, kernels::leaky_relu_backward<float>{x.data(), dy.data(), dx.data(), slope});
      check_close("leaky_relu " + std::to_string(slope) + " forward" + at, y, ly.values());
      check_close("leaky_relu " + std::to_string(slope) + " backward" + at, dx, ldx.values());
    }
    {
      nn::tanh<float> layer;
      const auto ly = layer.forward(r, x);
      const auto ldx = layer.backward(r, dy);
      for_each_index(par, n, kernels::tanh_forward<float>{x.data(), y.data()});
      for_each_index(par, n, kernels::tanh_backward<float>{y.data(), dy.data(), dx.data()});
      check_close("tanh forward" + at, y, ly.values());
      check_close("tanh backward" + at, dx, ldx.values());
    }
  }
}

// add_to: the residual block's skip connection, forward (y = body(x) + x) and backward (dx = body'(dy) + dy).
BOOST_AUTO_TEST_CASE(residual_sum_matches_the_block) {
  auto r = nn::local();
  const shape s = shape::nchw(2, 3, 11, 13);
  const auto x = random_tensor(s, 3), dy = random_tensor(s, 4);
  nn::residual_block<float> block{3, 11};
  const auto ly = block.forward(r, x);
  const auto ldx = block.backward(r, dy);
  auto y = block.body().forward(r, x);  // the body alone: the same bits as inside the block
  auto dx = block.body().backward(r, dy);
  for_each_index(par, size_of(y), element_kernels::add_to<float>{y.data(), x.data()});
  for_each_index(par, size_of(dx), element_kernels::add_to<float>{dx.data(), dy.data()});
  check_close("residual_block forward", y.values(), ly.values());
  check_close("residual_block backward", dx.values(), ldx.values());
}

// dropout_forward and multiply: the layer's masks of two passes (the key: seed, replica, pass).
BOOST_AUTO_TEST_CASE(dropout_matches_the_layer) {
  auto r = nn::local();
  for (const shape& s : shapes) {
    const double rate = 0.3;
    const std::uint64_t seed = 7;
    nn::dropout<float> layer{{.rate = rate}, seed};
    for (std::uint64_t pass = 0; pass < 2; ++pass) {
      const auto x = random_tensor(s, 10 + static_cast<std::uint32_t>(pass)),
                 dy = random_tensor(s, 20 + static_cast<std::uint32_t>(pass));
      const auto ly = layer.forward(r, x);
      const auto ldx = layer.backward(r, dy);
      const std::uint64_t key =
          nn::detail::sub_seed(nn::detail::sub_seed(seed, static_cast<std::uint64_t>(r.replica_id())), pass);
      const auto threshold = static_cast<std::uint64_t>(std::ldexp(rate, 53));
      const std::int64_t n = size_of(x);
      std::vector<float> y(x.size()), mask(x.size()), dx(x.size());
      for_each_index(par, n,
                     kernels::dropout_forward<float>{x.data(), y.data(), mask.data(), key, threshold,
                                                     static_cast<float>(1.0 / (1.0 - rate))});
      for_each_index(par, n, element_kernels::multiply<float>{dy.data(), mask.data(), dx.data()});
      const std::string at = " pass " + std::to_string(pass) + " " + s.to_string();
      check_close("dropout forward" + at, y, ly.values());
      check_close("dropout backward" + at, dx, ldx.values());
      const auto kept = static_cast<double>(std::count_if(mask.begin(), mask.end(), [](float m) { return m != 0.0f; }));
      BOOST_TEST((kept > 0.6 * n && kept < 0.8 * n),
                 "dropout" << at << ": " << kept << " of " << n << " kept at rate " << rate);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(planes)

// avg_pool_forward and avg_pool_backward: overlapping windows (3/2, 3/1) and windows that leave the
// last row and column out (2/2 over odd planes).
BOOST_AUTO_TEST_CASE(average_pooling_matches_the_layer) {
  auto r = nn::local();
  struct window {
    std::int64_t kernel, stride;
  };
  for (const window w : {window{3, 2}, window{2, 0}, window{3, 1}})
    for (const shape& s : shapes) {
      nn::avg_pool2d<float> pool{{.kernel = w.kernel, .stride = w.stride}};
      const shape out = pool.output_shape(s);
      const auto x = random_tensor(s, 5), dy = random_tensor(out, 6);
      const auto ly = pool.forward(r, x);
      const auto ldx = pool.backward(r, dy);
      const kernels::pool_geometry g{s.h(), s.w(), out.h(), out.w(), w.kernel, pool.stride()};
      std::vector<float> y(static_cast<std::size_t>(out.numel())), dx(x.size());
      for_each_plane_index(par, out.n() * out.c(), out.h() * out.w(),
                           kernels::avg_pool_forward<float>{x.data(), y.data(), g});
      for_each_plane_index(par, s.n() * s.c(), s.h() * s.w(),
                           kernels::avg_pool_backward<float>{dy.data(), dx.data(), g});
      const std::string at =
          " kernel " + std::to_string(w.kernel) + " stride " + std::to_string(pool.stride()) + " " + s.to_string();
      check_close("avg_pool2d forward" + at, y, ly.values());
      check_close("avg_pool2d backward" + at, dx, ldx.values());
    }
}

// reflect_pad and reflect_pad_backward, one call per element as the GPU engine runs them: a 1x1
// convolution with identity weights and reflection padding returns the padded input, and its input
// gradient is the padding's adjoint. The layer runs on the CPU engine (a plane per call, through the
// functors' whole_segment); the bits must be the same.
BOOST_AUTO_TEST_CASE(reflection_padding_matches_conv2d) {
  auto r = nn::local();
  for (const std::int64_t p : {1, 3})
    for (const shape& s : shapes) {
      const std::int64_t C = s.c(), H = s.h(), W = s.w();
      nn::conv2d<float> conv{{.in_channels = C,
                              .out_channels = C,
                              .kernel = 1,
                              .stride = 1,
                              .padding = p,
                              .pad_mode = nn::padding_mode::reflect,
                              .bias = false},
                             5};
      auto& weight = conv.weight().value;
      weight.fill(0.0f);
      for (std::int64_t c = 0; c < C; ++c) weight[static_cast<std::size_t>(c * C + c)] = 1.0f;
      const shape padded = shape::nchw(s.n(), C, H + 2 * p, W + 2 * p);
      const auto x = random_tensor(s, 7), dy = random_tensor(padded, 8);
      const auto ly = conv.forward(r, x);
      BOOST_TEST_REQUIRE((ly.shape() == padded), "conv2d 1x1 gave " << ly.shape() << ", expected " << padded);
      const auto ldx = conv.backward(r, dy);
      std::vector<float> y(static_cast<std::size_t>(padded.numel())), dx(x.size());
      for_each_plane_index(par, s.n() * C, (H + 2 * p) * (W + 2 * p),
                           kernels::reflect_pad<float>{x.data(), y.data(), H, W, p});
      for_each_plane_index(par, s.n() * C, H * W, kernels::reflect_pad_backward<float>{dy.data(), dx.data(), H, W, p});
      const std::string at = " pad " + std::to_string(p) + " " + s.to_string();
      check_close("reflection padding forward" + at, y, ly.values());
      check_close("reflection padding backward" + at, dx, ldx.values());
      BOOST_TEST(std::memcmp(y.data(), ly.data(), y.size() * sizeof(float)) == 0, "forward not bit for bit" << at);
      BOOST_TEST(std::memcmp(dx.data(), ldx.data(), dx.size() * sizeof(float)) == 0, "backward not bit for bit" << at);
    }
}

// The per-element passes against the CPU engine's per-plane loops (whole_segment), bit for bit, on
// the shapes where a position has the most sources: padding of half the plane or more (a source
// row copied into both borders, so up to nine padded positions add onto it), planes of 2, and the
// paper's 7x7 and 3x3 reflection paddings at sizes that are not multiples of the vector width.
BOOST_AUTO_TEST_CASE(reflection_padding_per_element_has_the_cpu_bits) {
  dist::engine<dist::cpu> e{{.threads = 2}};
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (const auto& [planes, h, w, p] : {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>{3, 3, 3, 2},
                                        {2, 2, 9, 1},
                                        {4, 5, 3, 2},
                                        {2, 4, 7, 3},
                                        {3, 9, 5, 4},
                                        {5, 37, 41, 3},
                                        {2, 64, 64, 1},
                                        {70, 17, 19, 3}}) {
    const std::int64_t ph = h + 2 * p, pw = w + 2 * p;
    std::vector<float> x(static_cast<std::size_t>(planes * h * w)), dy(static_cast<std::size_t>(planes * ph * pw));
    for (float& v : x) v = d(gen);
    for (float& v : dy) v = d(gen);
    dy[0] = -0.0f;  // both forms add onto +0: a negative zero must not survive in one of them only
    std::vector<float> y_cpu(dy.size()), y_elem(dy.size()), dx_cpu(x.size(), 7.0f), dx_elem(x.size(), 7.0f);
    e.for_each_in_segments(planes, ph * pw, kernels::reflect_pad<float>{x.data(), y_cpu.data(), h, w, p});
    e.for_each_in_segments(planes, h * w, kernels::reflect_pad_backward<float>{dy.data(), dx_cpu.data(), h, w, p});
    for_each_plane_index(par, planes, ph * pw, kernels::reflect_pad<float>{x.data(), y_elem.data(), h, w, p});
    for_each_plane_index(par, planes, h * w, kernels::reflect_pad_backward<float>{dy.data(), dx_elem.data(), h, w, p});
    BOOST_TEST_CONTEXT(planes << " planes " << h << "x" << w << " pad " << p) {
      BOOST_TEST(std::memcmp(y_cpu.data(), y_elem.data(), y_cpu.size() * sizeof(float)) == 0);
      BOOST_TEST(std::memcmp(dx_cpu.data(), dx_elem.data(), dx_cpu.size() * sizeof(float)) == 0);
      // And the definition: each padded position's gradient added onto its source, in row-major order.
      std::vector<float> want(x.size(), 0.0f);
      for (std::int64_t s = 0; s < planes; ++s)
        for (std::int64_t i = 0; i < ph; ++i)
          for (std::int64_t j = 0; j < pw; ++j)
            want[static_cast<std::size_t>((s * h + kernels::reflect(i - p, h)) * w + kernels::reflect(j - p, w))] +=
                dy[static_cast<std::size_t>((s * ph + i) * pw + j)];
      BOOST_TEST(std::memcmp(want.data(), dx_elem.data(), want.size() * sizeof(float)) == 0);
    }
  }
}

// add_channel_bias: conv_transpose2d's output with its bias against the same without it, plus the
// bias; value_of plane sums and add_to: its bias gradient, accumulated over two backward passes.
BOOST_AUTO_TEST_CASE(channel_bias_matches_conv_transpose2d) {
  auto r = nn::local();
  const shape s = shape::nchw(2, 3, 7, 9);
  nn::conv_transpose2d<float> layer{
      {.in_channels = 3, .out_channels = 5, .stride = 2, .padding = 1, .output_padding = 1}, 9};
  const auto x = random_tensor(s, 9), bias = random_tensor(shape{5}, 10);
  std::copy(bias.begin(), bias.end(), layer.bias().value.begin());
  const auto ly = layer.forward(r, x);
  layer.bias().value.fill(0.0f);
  auto y = layer.forward(r, x);
  const shape out = y.shape();
  const std::int64_t C = out.c(), planes = out.n() * C, plane = out.h() * out.w();
  for_each_plane_index(par, planes, plane, kernels::add_channel_bias<float>{y.data(), bias.data(), C, plane});
  check_close("conv_transpose2d bias " + out.to_string(), y.values(), ly.values());

  layer.zero_grad();
  std::vector<float> grad(static_cast<std::size_t>(C), 0.0f);
  for (const std::uint32_t seed : {11u, 12u}) {
    const auto dy = random_tensor(out, seed);
    if (seed != 11u) layer.forward(r, x);  // each backward has a forward of its own
    layer.backward(r, dy, nn::no_input_gradient);
    std::vector<double> sums(static_cast<std::size_t>(planes));
    thrust_host::segmented_sum(planes, plane, kernels::value_of<float>{dy.data(), plane}, sums.data());
    std::vector<float> db(static_cast<std::size_t>(C));
    for (std::int64_t c = 0; c < C; ++c) {
      double acc = 0;  // in example order, as the layer adds
      for (std::int64_t n = 0; n < out.n(); ++n) acc += sums[static_cast<std::size_t>(n * C + c)];
      db[static_cast<std::size_t>(c)] = static_cast<float>(acc);
    }
    for_each_index(par, C, element_kernels::add_to<float>{grad.data(), db.data()});
    check_close("conv_transpose2d bias gradient after dy " + std::to_string(seed), grad, layer.bias().grad.values());
    // The layer's own pass: the per-channel totals in example order, added on the device.
    std::vector<float> totals(static_cast<std::size_t>(C), 0.0f);
    for_each_index(par, C, kernels::add_channel_totals<float>{sums.data(), totals.data(), out.n(), C});
    check_close("conv_transpose2d add_channel_totals after dy " + std::to_string(seed), totals, db);
  }
}

// A convolution's bias gradient as the GPU engine's cuDNN path computes it
// (cuda/engine/detail/cudnn_conv.cuh): channel_term's per-channel sums of dy in double, cut into
// chunks as the engine's sums are, added to db by add_sum_to in the last stage. Checked over two
// backward passes against: the channels' sums in double taken directly (within double rounding of
// the sum's length), the epilogue's += (bit for bit), and conv2d's own gradient, which oneDNN sums
// in float (within the bound of a float sum of that length: length * 2^-24 * the sum of |dy|). One
// geometry of short channels (one stage) and one whose 3 channels of 2 x 96 x 96 values are cut into
// chunks (two stages).
BOOST_AUTO_TEST_CASE(channel_sums_match_the_conv2d_bias_gradient) {
  namespace loops = dist::detail::thrust_loops;
  auto r = nn::local();
  for (const shape s : {shape::nchw(3, 2, 5, 7), shape::nchw(2, 4, 96, 96)}) {
    nn::conv2d<float> layer{{.in_channels = s.c(), .out_channels = 3, .kernel = 3, .padding = 1}, 15};
    const auto x = random_tensor(s, 16);
    const shape out = layer.forward(r, x).shape();
    const std::int64_t C = out.c(), plane = out.h() * out.w(), length = out.n() * plane;
    BOOST_TEST_MESSAGE(out.to_string() << ": " << dist::detail::plan_segmented_sum(C, length).chunks
                                       << " chunks per channel");
    layer.zero_grad();
    std::vector<float> db(static_cast<std::size_t>(C), 0.0f), expected_db = db;
    std::vector<double> float_bound(static_cast<std::size_t>(C), 0.0);
    for (const std::uint32_t seed : {17u, 18u}) {
      const auto dy = random_tensor(out, seed);
      if (seed != 17u) layer.forward(r, x);
      layer.backward(r, dy, nn::no_input_gradient);
      const auto terms = thrust::make_transform_iterator(thrust::counting_iterator<std::int64_t>(0),
                                                         loops::channel_term<float>{dy.data(), out.n(), C, plane});
      std::vector<double> sums(static_cast<std::size_t>(C));
      thrust_host::planned_sum(C, length, terms, sums.data());
      thrust_host::planned_sum(C, length, terms,
                               thrust::make_tabulate_output_iterator(loops::add_sum_to<float>{db.data()}));
      for (std::int64_t c = 0; c < C; ++c) {
        const auto k = static_cast<std::size_t>(c);
        double direct = 0, magnitude = 0;
        for (std::int64_t n = 0; n < out.n(); ++n)
          for (std::int64_t i = 0; i < plane; ++i) {
            const double v = dy.data()[(n * C + c) * plane + i];
            direct += v;
            magnitude += std::abs(v);
          }
        BOOST_TEST(std::abs(sums[k] - direct) <= static_cast<double>(length) * 0x1p-52 * magnitude,
                   "channel " << c << ": planned sum " << sums[k] << " against " << direct);
        expected_db[k] += static_cast<float>(sums[k]);
        float_bound[k] += static_cast<double>(length + 1) * 0x1p-24 * magnitude;
      }
    }
    for (std::int64_t c = 0; c < C; ++c) {
      const auto k = static_cast<std::size_t>(c);
      const float layer_db = layer.bias().grad.values()[k];
      BOOST_TEST(db[k] == expected_db[k], "channel " << c << ": the epilogue's += gave " << db[k]);
      BOOST_TEST(std::abs(static_cast<double>(db[k]) - layer_db) <= float_bound[k],
                 out.to_string() << " channel " << c << ": " << db[k] << " against the layer's " << layer_db
                                 << " (bound " << float_bound[k] << ")");
    }
  }
}

// add_row_bias: linear's output with its bias against the same without it, plus the bias;
// column_of sums and add_sums: its bias gradient, accumulated over two backward passes.
BOOST_AUTO_TEST_CASE(row_bias_matches_linear) {
  auto r = nn::local();
  const std::int64_t n = 5, in = 13, out = 7;
  nn::linear<float> layer{{.in_features = in, .out_features = out}, 12};
  const auto x = random_tensor(shape{n, in}, 13), bias = random_tensor(shape{out}, 14);
  std::copy(bias.begin(), bias.end(), layer.bias().value.begin());
  const auto ly = layer.forward(r, x);
  layer.bias().value.fill(0.0f);
  auto y = layer.forward(r, x);
  for_each_plane_index(par, n, out, kernels::add_row_bias<float>{y.data(), bias.data(), out});
  check_close("linear bias", y.values(), ly.values());

  layer.zero_grad();
  std::vector<float> grad(static_cast<std::size_t>(out), 0.0f);
  for (const std::uint32_t seed : {15u, 16u}) {
    const auto dy = random_tensor(shape{n, out}, seed);
    if (seed != 15u) layer.forward(r, x);  // each backward has a forward of its own
    layer.backward(r, dy, nn::no_input_gradient);
    std::vector<double> sums(static_cast<std::size_t>(out));
    thrust_host::segmented_sum(out, n, kernels::column_of<float>{dy.data(), out}, sums.data());
    for_each_index(par, out, kernels::add_sums<float>{grad.data(), sums.data()});
    check_close("linear bias gradient after dy " + std::to_string(seed), grad, layer.bias().grad.values());
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(normalisation)

// normalize and normalized_input_gradient per plane, the statistics by plane sums (value_of,
// squared_deviation, product_of) and the layer's device passes (divide_by, inverse_std_of_squares,
// plane_gradient_coefficients, add_plane_sums_per_channel), against the host arithmetic the layer
// had before and against the layer itself.
BOOST_AUTO_TEST_CASE(instance_norm_matches_the_layer) {
  auto r = nn::local();
  const double eps = 1e-5;
  for (const bool affine : {false, true})
    for (const shape& s : shapes) {
      const std::int64_t C = s.c(), planes = s.n() * C, plane = s.h() * s.w();
      const auto up = static_cast<std::size_t>(planes), uc = static_cast<std::size_t>(C);
      nn::instance_norm<float> layer{{.channels = C, .eps = eps, .affine = affine}, 13};
      if (affine) {
        const auto beta = random_tensor(shape{C}, 14, -0.5, 0.5);
        std::copy(beta.begin(), beta.end(), layer.beta().value.begin());
      }
      const std::vector<float> gamma(layer.gamma().value.begin(), layer.gamma().value.end()),
          beta(layer.beta().value.begin(), layer.beta().value.end());
      const auto x = random_tensor(s, 15, -3.0, 5.0), dy = random_tensor(s, 16);
      const auto ly = layer.forward(r, x);
      layer.zero_grad();
      const auto ldx = layer.backward(r, dy);

      const auto m = moments_of(x, planes, plane);
      std::vector<double> invstd(up);
      for (std::size_t p = 0; p < up; ++p) invstd[p] = 1.0 / std::sqrt(m.m2[p] / static_cast<double>(plane) + eps);
      const auto f =
          normalize(x, m.mean, invstd, affine ? gamma.data() : nullptr, affine ? beta.data() : nullptr, false);
      const auto sums = gradient_sums_of(dy, f.xhat, planes, plane);
      std::vector<float> coef(3 * up);
      for (std::size_t p = 0; p < up; ++p) {
        const double g = affine ? static_cast<double>(gamma[p % uc]) : 1.0;
        coef[3 * p] = static_cast<float>(g * invstd[p]);
        coef[3 * p + 1] = static_cast<float>(sums[p] / static_cast<double>(plane));
        coef[3 * p + 2] = static_cast<float>(sums[up + p] / static_cast<double>(plane));
      }
      const auto dx = input_gradient(dy, f.xhat, coef, false);
      const std::string at = std::string(affine ? " affine " : " ") + s.to_string();
      // The same statistics and coefficients as the layer computes them, in device passes: the
      // host's bits.
      std::vector<double> stats(2 * up);
      thrust_host::segmented_sum(planes, plane, kernels::value_of<float>{x.data(), plane}, stats.data(),
                                 kernels::divide_by{static_cast<double>(plane)});
      thrust_host::segmented_sum(planes, plane, kernels::squared_deviation<float>{x.data(), stats.data(), plane},
                                 stats.data() + planes,
                                 kernels::inverse_std_of_squares<>{static_cast<double>(plane), eps});
      BOOST_TEST((std::vector<double>(stats.begin(), stats.begin() + planes) == m.mean), "means" << at);
      BOOST_TEST((std::vector<double>(stats.begin() + planes, stats.end()) == invstd), "inverse deviations" << at);
      // The coefficients as the second gradient sum's epilogue (here on the host's sums): the host's bits,
      // and the sum kept.
      std::vector<float> device_coef(3 * up);
      std::vector<double> second(sums.begin() + planes, sums.end());
      for_each_index(par, planes,
                     nn::detail::finish_in_place<kernels::plane_gradient_coefficients<float>>{
                         second.data(),
                         {affine ? gamma.data() : nullptr, stats.data() + planes, sums.data(), device_coef.data(), C,
                          static_cast<double>(plane)}});
      BOOST_TEST((device_coef == coef), "backward's coefficients" << at);
      BOOST_TEST((second == std::vector<double>(sums.begin() + planes, sums.end())), "the sum it finishes" << at);
      check_close("instance_norm forward" + at, f.y, ly.values());
      check_close("instance_norm backward" + at, dx, ldx.values());
      if (affine) {
        std::vector<float> dgamma(uc, 0.0f), dbeta(uc, 0.0f), gamma_grad(uc), beta_grad(uc);
        for (std::size_t p = 0; p < up; ++p) {  // in example order, as the layer adds
          dgamma[p % uc] += static_cast<float>(sums[up + p]);
          dbeta[p % uc] += static_cast<float>(sums[p]);
        }
        for_each_index(par, C, element_kernels::scale<float>{dgamma.data(), gamma_grad.data(), 1.0f});
        for_each_index(par, C, element_kernels::scale<float>{dbeta.data(), beta_grad.data(), 1.0f});
        check_close("instance_norm gamma gradient" + at, gamma_grad, layer.gamma().grad.values());
        check_close("instance_norm beta gradient" + at, beta_grad, layer.beta().grad.values());
        // The layer's pass, onto gradients holding earlier values: the host loop's bits.
        std::vector<float> g_dev(uc, 0.25f), b_dev(uc, -0.5f), g_host(g_dev), b_host(b_dev);
        for (std::size_t p = 0; p < up; ++p) {
          g_host[p % uc] += static_cast<float>(sums[up + p]);
          b_host[p % uc] += static_cast<float>(sums[p]);
        }
        for_each_index(par, C,
                       kernels::add_plane_sums_per_channel<float>{sums.data(), g_dev.data(), b_dev.data(), planes, C});
        BOOST_TEST((g_dev == g_host), "gamma gradient added per channel" << at);
        BOOST_TEST((b_dev == b_host), "beta gradient added per channel" << at);
      }
    }
}

// The fused passes (plane_norm_output with a ReLU and a residual add, plane_norm_gradient sums and
// plane_norm_input_gradient) as a GPU runs them, against a sequential of instance_norm and relu, and
// with plus_input, on the CPU engine.
BOOST_AUTO_TEST_CASE(fused_instance_norm_passes_match_the_sequential) {
  auto r = nn::local();
  const double eps = 1e-5;
  for (const bool affine : {false, true})
    for (const shape& s : shapes) {
      const std::int64_t C = s.c(), planes = s.n() * C, plane = s.h() * s.w();
      const auto up = static_cast<std::size_t>(planes);
      nn::sequential layers{nn::instance_norm<float>{{.channels = C, .eps = eps, .affine = affine}, 17},
                            nn::relu<float>{}};
      auto& norm = layers.get<0>();
      if (affine) {
        const auto beta = random_tensor(shape{C}, 18, -0.5, 0.5);
        std::copy(beta.begin(), beta.end(), norm.beta().value.begin());
      }
      const float* gamma = affine ? norm.gamma().value.data() : nullptr;
      const float* beta = affine ? norm.beta().value.data() : nullptr;
      const auto x = random_tensor(s, 19, -3.0, 5.0), dy = random_tensor(s, 20);
      const auto ly = layers.forward(r, x, nn::plus_input);
      const auto ldx = layers.backward(r, dy);

      // The passes as the layer runs them: the per-plane scale and shift with the second sum's epilogue.
      std::vector<double> stats(2 * up);
      std::vector<float> affine_terms(2 * up);
      const float* scale = affine_terms.data();
      const float* shift = scale + planes;
      thrust_host::segmented_sum(planes, plane, kernels::value_of<float>{x.data(), plane}, stats.data(),
                                 kernels::divide_by{static_cast<double>(plane)});
      thrust_host::segmented_sum(
          planes, plane, kernels::squared_deviation<float>{x.data(), stats.data(), plane}, stats.data() + planes,
          kernels::inverse_std_of_squares<kernels::plane_affine<float>>{
              static_cast<double>(plane), eps,
              kernels::plane_affine<float>{gamma, beta, affine_terms.data(), affine_terms.data() + planes, C}});
      std::vector<float> y(x.size()), xhat(x.size());
      for_each_plane_index(
          par, planes, plane,
          kernels::plane_norm_output<float, true, true>{x.data(), stats.data(), stats.data() + planes, scale, shift,
                                                        xhat.data(), y.data(), x.data(), plane});
      const kernels::plane_norm_terms<float> t{xhat.data(), scale, shift, plane};
      std::vector<double> sums(2 * up);
      std::vector<float> coef(3 * up), dx(x.size());
      thrust_host::segmented_sum(planes, plane, kernels::plane_norm_gradient<float, true>{t, dy.data()}, sums.data());
      thrust_host::segmented_sum(
          planes, plane, kernels::plane_norm_gradient_times_xhat<float, true>{t, dy.data()}, sums.data() + planes,
          kernels::plane_gradient_coefficients<float>{gamma, stats.data() + planes, sums.data(), coef.data(), C,
                                                      static_cast<double>(plane)});
      for_each_plane_index(par, planes, plane,
                           kernels::plane_norm_input_gradient<float, true>{t, dy.data(), coef.data(), dx.data()});
      const std::string at = std::string(affine ? " affine " : " ") + s.to_string();
      check_close("instance_norm + relu + input forward" + at, y, ly.values());
      check_close("instance_norm + relu backward" + at, dx, ldx.values());
    }
}

// normalize and normalized_input_gradient per channel: training (the planes' moments merged per
// channel in example order) and evaluation (the running statistics); add_to for gamma and beta.
BOOST_AUTO_TEST_CASE(batch_norm_matches_the_layer) {
  auto r = nn::local();
  const double eps = 1e-5;
  for (const shape& s : shapes) {
    const std::int64_t N = s.n(), C = s.c(), plane = s.h() * s.w();
    const auto uc = static_cast<std::size_t>(C);
    nn::batch_norm<float> layer{{.channels = C, .eps = eps}, 17};
    const auto beta_values = random_tensor(shape{C}, 18, -0.5, 0.5);
    std::copy(beta_values.begin(), beta_values.end(), layer.beta().value.begin());
    const std::vector<float> gamma(layer.gamma().value.begin(), layer.gamma().value.end()),
        beta(layer.beta().value.begin(), layer.beta().value.end());

    for (const bool training : {true, false}) {
      layer.set_training(training);
      const auto x = random_tensor(s, training ? 19 : 20, -2.0, 4.0), dy = random_tensor(s, training ? 21 : 22);
      const auto ly = layer.forward(r, x);
      layer.zero_grad();
      const auto ldx = layer.backward(r, dy);

      std::vector<double> mean(uc), invstd(uc);
      double count = 0;
      if (training) {
        const auto m = moments_of(x, N * C, plane);
        std::vector<nn::detail::moments> merged(uc);
        for (std::int64_t n = 0; n < N; ++n)
          for (std::size_t c = 0; c < uc; ++c) {
            const auto p = static_cast<std::size_t>(n) * uc + c;
            merged[c] = nn::detail::merge(merged[c], {static_cast<double>(plane), m.mean[p], m.m2[p]});
          }
        for (std::size_t c = 0; c < uc; ++c) {
          mean[c] = merged[c].mean;
          invstd[c] = 1.0 / std::sqrt(merged[c].m2 / merged[c].count + eps);
        }
        count = merged[0].count;
      } else {
        for (std::size_t c = 0; c < uc; ++c) {
          mean[c] = layer.running_mean()[c];
          invstd[c] = 1.0 / std::sqrt(layer.running_var()[c] + eps);
        }
      }
      const auto f = normalize(x, mean, invstd, gamma.data(), beta.data(), true);
      const auto per_plane = gradient_sums_of(dy, f.xhat, N * C, plane);
      std::vector<double> sums(2 * uc, 0.0);  // [sum dy | sum dy xhat] per channel, in example order
      for (std::int64_t n = 0; n < N; ++n)
        for (std::size_t c = 0; c < uc; ++c) {
          sums[c] += per_plane[static_cast<std::size_t>(n) * uc + c];
          sums[uc + c] += per_plane[static_cast<std::size_t>(N) * uc + static_cast<std::size_t>(n) * uc + c];
        }
      std::vector<float> coef(3 * uc, 0.0f), dgamma(uc), dbeta(uc), gamma_grad(uc, 0.0f), beta_grad(uc, 0.0f);
      for (std::size_t c = 0; c < uc; ++c) {
        dbeta[c] = static_cast<float>(sums[c]);
        dgamma[c] = static_cast<float>(sums[uc + c]);
        coef[3 * c] = static_cast<float>(static_cast<double>(gamma[c]) * invstd[c]);
        if (training) {
          coef[3 * c + 1] = static_cast<float>(sums[c] / count);
          coef[3 * c + 2] = static_cast<float>(sums[uc + c] / count);
        }
      }
      for_each_index(par, C, element_kernels::add_to<float>{gamma_grad.data(), dgamma.data()});
      for_each_index(par, C, element_kernels::add_to<float>{beta_grad.data(), dbeta.data()});
      const auto dx = input_gradient(dy, f.xhat, coef, true);
      const std::string at = std::string(training ? " training " : " evaluation ") + s.to_string();
      check_close("batch_norm forward" + at, f.y, ly.values());
      check_close("batch_norm backward" + at, dx, ldx.values());
      check_close("batch_norm gamma gradient" + at, gamma_grad, layer.gamma().grad.values());
      check_close("batch_norm beta gradient" + at, beta_grad, layer.beta().grad.values());
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(losses)

// squared_error, absolute_error and sigmoid_cross_entropy as plane sums per example (the value) with
// the gradient written alongside: mse, l1 and bce_with_logits, for a replica's share of a larger
// global batch.
BOOST_AUTO_TEST_CASE(elementwise_losses_match) {
  auto r = nn::local();
  for (const shape& s : shapes) {
    const std::int64_t global = s.n() + 2;
    const std::string at = " " + s.to_string();
    const auto pred = random_tensor(s, 23);
    auto target = random_tensor(s, 24);
    for (std::size_t i = 0; i < target.size(); i += 13) target[i] = pred[i];  // d = 0: l1's gradient is 0 there
    check_loss("mse" + at, per_example_loss<kernels::squared_error>(pred, target, global),
               nn::mse(r, pred, target, global));
    check_loss("l1" + at, per_example_loss<kernels::absolute_error>(pred, target, global),
               nn::l1(r, pred, target, global));

    auto logits = random_tensor(s, 25, -20.0, 20.0);
    auto labels = random_tensor(s, 26, 0.0, 1.0);  // soft targets, and hard ones below
    for (std::size_t i = 0; i < logits.size(); i += 11) logits[i] = 0.0f;
    for (std::size_t i = 0; i < labels.size(); i += 7) labels[i] = i % 2 ? 1.0f : 0.0f;
    check_loss("bce_with_logits" + at, per_example_loss<kernels::sigmoid_cross_entropy>(logits, labels, global),
               nn::bce_with_logits(r, logits, labels, global));
  }
}

// row_max, shifted_exp (plane sums), softmax_cross_entropy_value and _gradient: softmax_cross_entropy;
// row_argmax: accuracy (ties go to the first).
BOOST_AUTO_TEST_CASE(softmax_cross_entropy_and_accuracy_match) {
  auto r = nn::local();
  const std::int64_t n = 7, k = 11, global = 9;
  auto logits = random_tensor(shape{n, k}, 27, -30.0, 30.0);
  for (std::int64_t i = 0; i < k; ++i)
    logits[static_cast<std::size_t>(3 * k + i)] += 80.0f;  // far from 0: the shift matters
  logits[2] = logits[5] = 100.0f;                          // row 0: a tie at 2 and 5
  logits[static_cast<std::size_t>(k + 10)] = 100.0f;       // row 1: the last
  logits[static_cast<std::size_t>(2 * k + 4)] = 100.0f;    // row 2: at 4, labelled 7
  const std::vector<std::int32_t> labels{2, 10, 7, 5, 0, 9, 3};
  const auto layer = nn::softmax_cross_entropy(r, logits, std::span<const std::int32_t>(labels), global);

  std::vector<double> shift(static_cast<std::size_t>(n)), denominator(shift.size()), values(shift.size());
  nn::loss_result<float> thrust{0.0f, tensor<float>{logits.shape()}};
  for_each_index(par, n, kernels::row_max<float>{logits.data(), shift.data(), k});
  thrust_host::segmented_sum(n, k, kernels::shifted_exp<float>{logits.data(), shift.data(), k}, denominator.data());
  for_each_index(par, n,
                 kernels::softmax_cross_entropy_value<float>{logits.data(), labels.data(), shift.data(),
                                                             denominator.data(), values.data(), k});
  for_each_index(
      par, n * k,
      kernels::softmax_cross_entropy_gradient<float>{logits.data(), labels.data(), shift.data(), denominator.data(),
                                                     thrust.grad.data(), 1.0 / static_cast<double>(global), k});
  thrust.value = nn::compute_average_loss(std::vector<float>(values.begin(), values.end()), global);
  check_loss("softmax_cross_entropy", thrust, layer);

  std::vector<std::int32_t> argmax(static_cast<std::size_t>(n));
  for_each_index(par, n, kernels::row_argmax<float>{logits.data(), argmax.data(), k});
  std::int64_t correct = 0;
  for (std::size_t i = 0; i < argmax.size(); ++i) correct += argmax[i] == labels[i] ? 1 : 0;
  BOOST_TEST(argmax[0] == 2);
  BOOST_TEST(argmax[1] == 10);
  BOOST_TEST(argmax[2] == 4);
  BOOST_TEST(correct == nn::accuracy(r, logits, std::span<const std::int32_t>(labels)));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(optimisers)

// adam_update over every parameter of a linear layer (91 and 7 values), five steps with fresh
// gradients, against optim::adam stepping the layer (on the replica's engine and on the calling
// thread, alternately); the bias corrections of step t as adam computes them. And the capturable
// form: the step's scalars advanced by adam_step_scalars through Thrust's loop, read by adam_update
// from there, the same bits.
BOOST_AUTO_TEST_CASE(adam_matches_the_optimiser) {
  auto r = nn::local();
  const optim::adam_options cases[] = {{.lr = 2e-4, .beta1 = 0.5, .beta2 = 0.999},
                                       {.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-6, .weight_decay = 1e-2}};
  for (const auto& o : cases) {
    nn::linear<float> model{{.in_features = 13, .out_features = 7}, 28};
    optim::adam<float> opt{o};
    auto p = values_of(model);
    parameter_values m, v;
    for (const auto& q : p) {
      m.emplace_back(q.size(), 0.0f);
      v.emplace_back(q.size(), 0.0f);
    }
    auto p_cap = p, m_cap = m, v_cap = v;
    std::vector<double> scalars{0.0, o.lr, 0.0, 0.0};
    for (int t = 1; t <= 5; ++t) {
      const auto g = set_random_gradients(model, 100 * static_cast<std::uint32_t>(t));
      for_each_index(par, 1, update_kernels::adam_step_scalars{scalars.data(), o.beta1, o.beta2});
      for (std::size_t j = 0; j < p.size(); ++j)
        for_each_index(par, static_cast<std::int64_t>(p[j].size()),
                       update_kernels::adam_update<float>{
                           p_cap[j].data(), g[j].data(), m_cap[j].data(), v_cap[j].data(), static_cast<float>(o.beta1),
                           static_cast<float>(o.beta2), static_cast<float>(o.weight_decay), 0.0f, 0.0f,
                           static_cast<float>(o.eps), scalars.data()});
      if (t % 2) opt.step(r, model);
      else opt.step(model);
      const double tt = t;
      const auto step_size = static_cast<float>(o.lr / (1 - std::pow(o.beta1, tt)));
      const auto sqrt_bc2 = static_cast<float>(std::sqrt(1 - std::pow(o.beta2, tt)));
      for (std::size_t j = 0; j < p.size(); ++j)
        for_each_index(par, static_cast<std::int64_t>(p[j].size()),
                       update_kernels::adam_update<float>{p[j].data(), g[j].data(), m[j].data(), v[j].data(),
                                                          static_cast<float>(o.beta1), static_cast<float>(o.beta2),
                                                          static_cast<float>(o.weight_decay), step_size, sqrt_bc2,
                                                          static_cast<float>(o.eps), nullptr});
      const auto layer = values_of(model);
      BOOST_TEST(scalars[0] == tt);
      for (std::size_t j = 0; j < p.size(); ++j) {
        check_close(
            "adam lr " + std::to_string(o.lr) + " step " + std::to_string(t) + " parameter " + std::to_string(j), p[j],
            layer[j]);
        BOOST_TEST(std::memcmp(p_cap[j].data(), p[j].data(), p[j].size() * sizeof(float)) == 0,
                   "capturable, step " << t);
      }
    }
  }
}

// sgd_update likewise, with and without momentum and weight decay.
BOOST_AUTO_TEST_CASE(sgd_matches_the_optimiser) {
  auto r = nn::local();
  const optim::sgd_options cases[] = {{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4}, {.lr = 0.1}};
  for (const auto& o : cases) {
    nn::linear<float> model{{.in_features = 13, .out_features = 7}, 29};
    optim::sgd<float> opt{o};
    auto p = values_of(model);
    parameter_values velocity;
    for (const auto& q : p) velocity.emplace_back(q.size(), 0.0f);
    for (int t = 1; t <= 5; ++t) {
      const auto g = set_random_gradients(model, 200 * static_cast<std::uint32_t>(t));
      if (t % 2) opt.step(r, model);
      else opt.step(model);
      for (std::size_t j = 0; j < p.size(); ++j)
        for_each_index(par, static_cast<std::int64_t>(p[j].size()),
                       update_kernels::sgd_update<float>{p[j].data(), g[j].data(), velocity[j].data(),
                                                         static_cast<float>(o.lr), static_cast<float>(o.momentum),
                                                         static_cast<float>(o.weight_decay), nullptr});
      const auto layer = values_of(model);
      for (std::size_t j = 0; j < p.size(); ++j)
        check_close("sgd momentum " + std::to_string(o.momentum) + " step " + std::to_string(t) + " parameter " +
                        std::to_string(j),
                    p[j], layer[j]);
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
