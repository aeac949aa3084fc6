// The GPU compute engine, in one file because it is the one that includes the cudnn-frontend.
//
// Suite `layers`: the engine (cuda/engine/cuda.cuh) under the CPU layers: every layer, loss and optimiser
// the example CycleGAN uses, its whole generator and discriminator, and SyncBatchNorm across two GPU
// replicas, and R1 and WGAN-GP through a discriminator written for a tape (the layers' recorded
// backwards), run on a GPU replica and on the CPU from the same seed and input; outputs, input
// gradients and every parameter gradient agree within 1e-3 of the CPU value relative to the largest
// magnitude in that tensor (float32 on both sides, TF32 off; the GPU sums in another order). Also its
// matrix products against the CPU engine's and its passes on the replica's stream, and Adam's state on
// a GPU: checkpointed there and resumed on either device, and copied to another replica.
//
// Suite `cudnn`: the engine's cuDNN convolutions (cuda/engine/detail/cudnn_conv.cuh) against the CPU
// engine's reference (im2col + Eigen): every convolution the CycleGAN example runs, at small
// sizes, in its three passes (forward with and without a bias, the data gradient, the weight and
// bias gradients added to non-zero values), in float32 (within 1e-4 relative) and with TF32 allowed
// (within 1e-2 relative: TF32 keeps 10 bits of mantissa in the products). Relative to each value,
// with a floor of a tenth of the largest magnitude, so that values that cancel to near zero are
// judged on the scale of their tensor. Also: the plan cache, pointers off a 16-byte boundary, an empty
// batch, and the errors of a geometry cuDNN cannot compute.
//
// Suite `passes`: the per-element passes the launch-shape tests (tests/launch_shape) hold the CPU
// engine to, on the GPU: reflection padding with the CPU's bits, chunked segmented sums, and cuDNN's
// engines with compute_options::deterministic on and off within conv_workspace_limit. Here rather
// than in a binary of its own, so that the cudnn-frontend is compiled once.
//
// It includes the cudnn-frontend (through the engine), and compiles in over a minute and a half on a
// 2-core machine. Without cuDNN in the build, the suite holds one
// case, reported as skipped.

#include "gpu_test_support.cuh"

#include <distribute/checkpoint/archive.hpp>
#include <distribute/config.hpp>
#include <distribute/cuda/engine/cuda.cuh>
#include <distribute/cuda/nn/graphed.cuh>
#include <distribute/cuda/nn/graphed_step.cuh>
#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/cpu.hpp>
#include <distribute/engine/detail/segmented_sum_plan.hpp>
#include <distribute/engine/serial.hpp>
#include <distribute/nn.hpp>
#include <distribute/nn/detail/kernels.hpp>
#include <distribute/optim/adam.hpp>
#if DISTRIBUTE_HAS_CUDNN
#  include <distribute/cuda/engine/detail/cudnn_conv.cuh>
#endif

#include "../../examples/cyclegan/models.hpp"
#include "../nn/precision_case.hpp"
#include "../nn/penalty_discriminator.hpp"
#include "summation_bound.hpp"

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <span>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace dist = distribute;
namespace dt = distribute::test;
namespace nn = distribute::nn;

BOOST_AUTO_TEST_SUITE(cudnn)

#if DISTRIBUTE_HAS_CUDNN

namespace {

// The example's convolutions, batch 2 (the engine's view: a transposed convolution is the adjoint of
// the convolution whose input is its output).
struct named_geometry {
  const char* name;
  dist::conv_geometry g;
};

std::vector<named_geometry> cyclegan_geometries() {
  using G = dist::conv_geometry;
  return {
      // Generator: c7s1 after a reflection pad of 3 (so no zero padding), in and out.
      {"generator c7s1 3->8 (16x16 padded to 22x22)", G::of(2, 3, 22, 22, 8, 7, 1, 0)},
      {"generator c7s1 8->3 (16x16 padded to 22x22)", G::of(2, 8, 22, 22, 3, 7, 1, 0)},
      // Downsampling: 3x3, stride 2, zero padding 1.
      {"generator d 8->16 3x3 stride 2", G::of(2, 8, 16, 16, 16, 3, 2, 1)},
      {"generator d 3->4 3x3 stride 2, 28x28", G::of(2, 3, 28, 28, 4, 3, 2, 1)},
      // Residual blocks: 3x3, stride 1, after a reflection pad of 1.
      {"generator residual 16->16 3x3 (8x8 padded to 10x10)", G::of(2, 16, 10, 10, 16, 3, 1, 0)},
      // Upsampling: a transposed 3x3, stride 2, padding 1, output padding 1, 16 -> 8 channels,
      // 8x8 -> 16x16; as the engine sees it, a convolution 8 x 16x16 -> 16 x 8x8.
      {"generator u 16->8 transposed 3x3 stride 2", G{2, 8, 16, 16, 16, 3, 2, 1, 8, 8}},
      // Discriminator: 4x4 stride 2 padding 1, and the last 4x4 stride 1 padding 1 to one channel.
      {"discriminator 3->8 4x4 stride 2", G::of(2, 3, 32, 32, 8, 4, 2, 1)},
      {"discriminator 8->16 4x4 stride 2", G::of(2, 8, 16, 16, 16, 4, 2, 1)},
      {"discriminator 16->1 4x4 stride 1", G::of(2, 16, 8, 8, 1, 4, 1, 1)},
  };
}

std::vector<float> random_values(std::int64_t n, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(gen);
  return v;
}

using device_tensor = dist::tensor<float, dist::cuda>;

device_tensor upload(const std::vector<float>& v, const dist::cuda& d) {
  return device_tensor::from_host(dist::shape{static_cast<std::int64_t>(v.size())}, v, d);
}

// The largest error of `got` against `want`, relative to each value with a floor of a tenth of the
// largest magnitude in `want`; where it is, in words, when it exceeds `tolerance`.
std::string compare(const std::vector<float>& got, const std::vector<float>& want, double tolerance) {
  if (got.size() != want.size())
    return "sizes differ: " + std::to_string(got.size()) + " vs " + std::to_string(want.size());
  double largest = 0;
  for (const float w : want) largest = std::max(largest, std::abs(static_cast<double>(w)));
  double worst = 0;
  std::size_t at = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double scale = std::max(std::abs(static_cast<double>(want[i])), 0.1 * largest);
    const double err =
        scale > 0 ? std::abs(static_cast<double>(got[i]) - want[i]) / scale : std::abs(static_cast<double>(got[i]));
    if (!(err <= worst)) {  // NaN counts as worst
      worst = std::isnan(err) ? INFINITY : err;
      at = i;
    }
  }
  if (worst <= tolerance) return "";
  std::ostringstream s;
  s << "relative error " << worst << " > " << tolerance << " at element " << at << " of " << want.size() << ": "
    << got[at] << " instead of " << want[at];
  return s.str();
}

// Every pass of `g` on the GPU against the CPU reference; with `autotune`, each plan's engine chosen by
// timing (the outputs the timing runs write are written again, and dw still takes one gradient).
void check_against_reference(const named_geometry& ng, dist::compute_precision precision, double tolerance,
                             bool autotune = false) {
  const dist::conv_geometry& g = ng.g;
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  dist::detail::cudnn_convolutions gpu(0, stream.get(), autotune);
  dist::engine<dist::cpu> cpu{dist::compute_options{.reference = true}};

  const auto x = random_values(g.input_size(), 1);
  const auto w = random_values(g.weight_size(), 2);
  const auto bias = random_values(g.out_channels, 3);
  const auto dy = random_values(g.output_size(), 4);
  const auto dw0 = random_values(g.weight_size(), 5);
  const auto db0 = random_values(g.out_channels, 6);
  const auto dx_garbage = random_values(g.input_size(), 7);  // backward data overwrites

  const auto dx_ = upload(x, d), dw_ = upload(w, d), dbias = upload(bias, d), ddy = upload(dy, d);
  const std::string where =
      std::string(ng.name) + " " + g.to_string() + " (" + std::string(dist::to_string(precision)) + ")";

  for (const bool with_bias : {false, true}) {
    std::vector<float> want(static_cast<std::size_t>(g.output_size()));
    cpu.conv_forward(g, x.data(), w.data(), with_bias ? bias.data() : nullptr, want.data());
    device_tensor y(dist::shape{g.output_size()}, d);
    gpu.forward(g, dx_.data(), dw_.data(), with_bias ? dbias.data() : nullptr, y.data(), precision);
    const std::string err = compare(y.to_vector(), want, tolerance);
    BOOST_TEST(err.empty(), where << ": forward" << (with_bias ? " with a bias: " : ": ") << err);
  }
  {
    std::vector<float> want(static_cast<std::size_t>(g.input_size()));
    cpu.conv_backward_data(g, dy.data(), w.data(), want.data());
    auto dx = upload(dx_garbage, d);
    gpu.backward_data(g, ddy.data(), dw_.data(), dx.data(), precision);
    const std::string err = compare(dx.to_vector(), want, tolerance);
    BOOST_TEST(err.empty(), where << ": backward data: " << err);
  }
  for (const bool with_db : {true, false}) {
    std::vector<float> want_dw = dw0, want_db = db0;
    cpu.conv_backward_weights(g, x.data(), dy.data(), want_dw.data(), with_db ? want_db.data() : nullptr);
    auto dw = upload(dw0, d), db = upload(db0, d);
    gpu.backward_weights(g, dx_.data(), ddy.data(), dw.data(), with_db ? db.data() : nullptr, precision);
    const std::string err_w = compare(dw.to_vector(), want_dw, tolerance);
    BOOST_TEST(err_w.empty(), where << ": backward weights (dw +=)" << (with_db ? ": " : " without db: ") << err_w);
    const std::string err_b = compare(db.to_vector(), want_db, tolerance);
    BOOST_TEST(err_b.empty(), where << ": backward weights (db " << (with_db ? "+=): " : "untouched): ") << err_b);
  }
  // forward, forward with a bias, backward data, backward weights (16 bits: the bias is added after
  // the convolution, so one forward plan serves both; a pass that fell back to TF32 has the TF32
  // plans instead, the forward pass two).
  if (gpu.precision_fallbacks().empty()) BOOST_TEST(gpu.cached_plans() == (dist::is_half(precision) ? 3u : 4u), where);
  else BOOST_TEST((gpu.cached_plans() >= 3u && gpu.cached_plans() <= 4u), where);
  // Timed either way: autotune, or the default deterministic choice (deterministic_conv_slowdown).
  BOOST_TEST(gpu.tuned_plans() == gpu.cached_plans(), where);
  for (const auto& why : gpu.nondeterministic_convolutions()) BOOST_TEST_MESSAGE(where << ": " << why);
  BOOST_TEST(gpu.tuned_candidates() >= gpu.tuned_plans(), where);
  for (const auto& why : gpu.precision_fallbacks()) BOOST_TEST_MESSAGE(where << ": TF32 instead of 16 bits: " << why);
  BOOST_TEST((cudaGetLastError() == cudaSuccess));
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_pass_of_the_cyclegan_convolutions_matches_the_cpu_in_float32) {
  for (const auto& ng : cyclegan_geometries()) check_against_reference(ng, dist::compute_precision::float32, 1e-4);
}

BOOST_AUTO_TEST_CASE(every_pass_of_the_cyclegan_convolutions_matches_the_cpu_with_tf32) {
  for (const auto& ng : cyclegan_geometries()) check_against_reference(ng, dist::compute_precision::tf32, 1e-2);
}

// Mixed precision: 16-bit operands (bfloat16: an 8-bit significand, float16: 11 bits), float32
// accumulation and results. The tolerances are those of rounding each operand once.
BOOST_AUTO_TEST_CASE(every_pass_of_the_cyclegan_convolutions_matches_the_cpu_in_bfloat16_and_float16) {
  for (const auto& ng : cyclegan_geometries()) {
    check_against_reference(ng, dist::compute_precision::bfloat16, 3e-2);
    check_against_reference(ng, dist::compute_precision::float16, 5e-3);
  }
}

// conv_autotune: every pass computes what the heuristics' engine computes, within the same tolerances.
BOOST_AUTO_TEST_CASE(autotuned_convolutions_match_the_cpu) {
  for (const auto& ng : cyclegan_geometries()) {
    check_against_reference(ng, dist::compute_precision::float32, 1e-4, true);
    check_against_reference(ng, dist::compute_precision::bfloat16, 3e-2, true);
  }
}

// A tuned plan is timed once: later runs of its shape use the engine chosen, with the same bits.
BOOST_AUTO_TEST_CASE(a_plan_is_tuned_once_and_then_reused) {
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  dist::detail::cudnn_convolutions gpu(0, stream.get(), true);
  const auto g = dist::conv_geometry::of(2, 16, 10, 10, 16, 3, 1, 0);
  const auto x = upload(random_values(g.input_size(), 1), d), w = upload(random_values(g.weight_size(), 2), d);
  device_tensor y(dist::shape{g.output_size()}, d);
  gpu.forward(g, x.data(), w.data(), nullptr, y.data());
  BOOST_TEST(gpu.tuned_plans() == 1u);
  const std::size_t candidates = gpu.tuned_candidates();
  BOOST_TEST(candidates >= 1u);
  const auto first = y.to_vector();
  gpu.forward(g, x.data(), w.data(), nullptr, y.data());
  BOOST_TEST(gpu.tuned_plans() == 1u);
  BOOST_TEST(gpu.tuned_candidates() == candidates);
  BOOST_TEST(y.to_vector() == first);
}

// The default deterministic choice (compute_options::deterministic_conv_slowdown): every plan is
// timed once, and a plan computes with the same bits at every later call, whichever engine won; 0
// times nothing (cuDNN's first deterministic engine); infinity never takes the rival.
BOOST_AUTO_TEST_CASE(the_deterministic_choice_is_timed_once_and_kept) {
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  const auto g = dist::conv_geometry::of(2, 16, 12, 12, 32, 3, 1, 1);
  const auto x = upload(random_values(g.input_size(), 1), d), w = upload(random_values(g.weight_size(), 2), d);
  const auto dy = upload(random_values(g.output_size(), 3), d);
  for (const double slowdown : {1.5, 0.0, std::numeric_limits<double>::infinity()}) {
    BOOST_TEST_CONTEXT("deterministic_conv_slowdown " << slowdown) {
      dist::detail::cudnn_convolutions gpu(0, stream.get(),
                                           dist::compute_options{.deterministic_conv_slowdown = slowdown});
      device_tensor y(dist::shape{g.output_size()}, d), dx(dist::shape{g.input_size()}, d);
      gpu.forward(g, x.data(), w.data(), nullptr, y.data());
      gpu.backward_data(g, dy.data(), w.data(), dx.data());
      const auto y1 = y.to_vector(), dx1 = dx.to_vector();
      BOOST_TEST(gpu.tuned_plans() == (slowdown > 0 ? 2u : 0u));
      const std::size_t candidates = gpu.tuned_candidates();
      for (int again = 0; again < 2; ++again) {
        gpu.forward(g, x.data(), w.data(), nullptr, y.data());
        gpu.backward_data(g, dy.data(), w.data(), dx.data());
        BOOST_TEST(y.to_vector() == y1);
        BOOST_TEST(dx.to_vector() == dx1);
      }
      BOOST_TEST(gpu.tuned_candidates() == candidates);
      if (!(slowdown > 0 && slowdown < std::numeric_limits<double>::infinity()))
        BOOST_TEST(gpu.nondeterministic_convolutions().empty());
      for (const auto& why : gpu.nondeterministic_convolutions()) {
        BOOST_TEST_MESSAGE(why);
        BOOST_TEST(why.find("compute_options::deterministic_conv_slowdown") != std::string::npos, why);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(plans_are_built_once_per_geometry_and_pass) {
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  dist::detail::cudnn_convolutions gpu(0, stream.get());
  const auto g = dist::conv_geometry::of(2, 8, 16, 16, 16, 3, 2, 1);
  const auto x = upload(random_values(g.input_size(), 1), d), w = upload(random_values(g.weight_size(), 2), d);
  device_tensor y(dist::shape{g.output_size()}, d);
  BOOST_TEST(gpu.cached_plans() == 0u);
  gpu.forward(g, x.data(), w.data(), nullptr, y.data());
  BOOST_TEST(gpu.cached_plans() == 1u);
  const auto first = y.to_vector();
  const std::size_t workspace = gpu.workspace_bytes();
  gpu.forward(g, x.data(), w.data(), nullptr, y.data());  // the same geometry and pass: the cached plan
  BOOST_TEST(gpu.cached_plans() == 1u);
  BOOST_TEST(gpu.workspace_bytes() == workspace);
  BOOST_TEST(y.to_vector() == first);                                     // the same plan, the same bits
  const auto other = dist::conv_geometry::of(1, 8, 16, 16, 16, 3, 2, 1);  // another batch: another plan
  gpu.forward(other, x.data(), w.data(), nullptr, y.data());
  BOOST_TEST(gpu.cached_plans() == 2u);
  device_tensor dx(dist::shape{g.input_size()}, d);
  gpu.backward_data(g, y.data(), w.data(), dx.data());  // another pass
  BOOST_TEST(gpu.cached_plans() == 3u);
  gpu.backward_data(g, y.data(), w.data(), dx.data());
  BOOST_TEST(gpu.cached_plans() == 3u);
}

// Tensors inside a larger buffer (4 bytes past a 16-byte boundary) get plans built for that
// alignment, with the same values.
BOOST_AUTO_TEST_CASE(pointers_off_a_16_byte_boundary_get_plans_of_their_own) {
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  dist::detail::cudnn_convolutions gpu(0, stream.get());
  dist::engine<dist::cpu> cpu{dist::compute_options{.reference = true}};
  const auto g = dist::conv_geometry::of(2, 3, 12, 12, 5, 3, 1, 1);
  const auto x = random_values(g.input_size(), 11), w = random_values(g.weight_size(), 12), bias = random_values(5, 13);
  const auto dy = random_values(g.output_size(), 14), dw0 = random_values(g.weight_size(), 15);
  // Each on the device one element into its buffer.
  const auto shifted = [&](const std::vector<float>& v) {
    std::vector<float> s(v.size() + 1, 0.0f);
    std::copy(v.begin(), v.end(), s.begin() + 1);
    return upload(s, d);
  };
  const auto sx = shifted(x), sw = shifted(w), sb = shifted(bias), sdy = shifted(dy);
  auto sy = shifted(std::vector<float>(static_cast<std::size_t>(g.output_size()))), sdw = shifted(dw0);
  gpu.forward(g, sx.data() + 1, sw.data() + 1, sb.data() + 1, sy.data() + 1);
  gpu.backward_weights(g, sx.data() + 1, sdy.data() + 1, sdw.data() + 1, nullptr);
  BOOST_TEST(gpu.cached_plans() == 2u);

  std::vector<float> want_y(static_cast<std::size_t>(g.output_size())), want_dw = dw0;
  cpu.conv_forward(g, x.data(), w.data(), bias.data(), want_y.data());
  cpu.conv_backward_weights(g, x.data(), dy.data(), want_dw.data(), static_cast<float*>(nullptr));
  const auto y = sy.to_vector(), dw = sdw.to_vector();
  BOOST_TEST(y[0] == 0.0f);  // the element before the tensor is untouched
  BOOST_TEST(dw[0] == 0.0f);
  const std::string err_y = compare(std::vector<float>(y.begin() + 1, y.end()), want_y, 1e-4);
  BOOST_TEST(err_y.empty(), "forward: " << err_y);
  const std::string err_w = compare(std::vector<float>(dw.begin() + 1, dw.end()), want_dw, 1e-4);
  BOOST_TEST(err_w.empty(), "backward weights: " << err_w);

  // The aligned tensors of the same geometry have plans of their own.
  const auto ax = upload(x, d), aw = upload(w, d);
  device_tensor ay(dist::shape{g.output_size()}, d);
  gpu.forward(g, ax.data(), aw.data(), nullptr, ay.data());
  BOOST_TEST(gpu.cached_plans() == 3u);
}

BOOST_AUTO_TEST_CASE(an_empty_batch_changes_nothing) {
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  dist::detail::cudnn_convolutions gpu(0, stream.get());
  const auto g = dist::conv_geometry::of(0, 3, 8, 8, 4, 3, 1, 1);
  const auto w = upload(random_values(g.weight_size(), 1), d);
  const auto dw0 = random_values(g.weight_size(), 2);
  auto dw = upload(dw0, d), db = upload(std::vector<float>(4, 1.0f), d);
  gpu.forward(g, nullptr, w.data(), nullptr, nullptr);
  gpu.backward_data(g, nullptr, w.data(), nullptr);
  gpu.backward_weights(g, nullptr, nullptr, dw.data(), db.data());
  BOOST_TEST(dw.to_vector() == dw0);
  BOOST_TEST(db.to_vector() == std::vector<float>(4, 1.0f));
  BOOST_TEST(gpu.cached_plans() == 0u);
}

// A geometry cuDNN cannot compute is an std::invalid_argument naming the pass and the geometry,
// before anything reaches cuDNN.
BOOST_AUTO_TEST_CASE(a_bad_geometry_is_a_clear_error) {
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  dist::detail::cudnn_convolutions gpu(0, stream.get());
  device_tensor buffer(dist::shape{4096}, d);
  float* p = buffer.data();

  // Output extents that do not follow from the input's: cuDNN computes floor((16 + 2 - 3) / 2) + 1 = 8.
  dist::conv_geometry wrong = dist::conv_geometry::of(1, 2, 16, 16, 2, 3, 2, 1);
  wrong.out_height = wrong.out_width = 9;
  try {
    gpu.forward(wrong, p, p, nullptr, p);
    BOOST_FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    BOOST_TEST(dt::contains(what, "distribute: cuDNN conv forward " + wrong.to_string() + " on cuda:0 failed: "), what);
    BOOST_TEST(dt::contains(what, "its output is 9x9, but this input, kernel, stride and padding give 8x8"), what);
  }
  // An invalid geometry (a kernel larger than the padded input).
  dist::conv_geometry invalid{1, 2, 4, 4, 2, 7, 1, 0, 1, 1};
  try {
    gpu.backward_weights(invalid, p, p, p, nullptr);
    BOOST_FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    BOOST_TEST(
        dt::contains(what, "distribute: cuDNN conv backward weights " + invalid.to_string() + " on cuda:0 failed: "),
        what);
  }
  BOOST_TEST(gpu.cached_plans() == 0u);
  // Nothing was left behind: the object still works.
  const auto g = dist::conv_geometry::of(1, 2, 16, 16, 2, 3, 2, 1);
  gpu.backward_data(g, p, p + 1024, p + 2048);
  d.synchronize();
  BOOST_TEST(gpu.cached_plans() == 1u);
}

#else  // !DISTRIBUTE_HAS_CUDNN

namespace {
boost::test_tools::assertion_result built_with_cudnn(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(false);
  r.message() << "this build has no cuDNN convolutions (cuDNN, nvrtc or the cudnn-frontend headers were not found)";
  return r;
}
}  // namespace

BOOST_TEST_DECORATOR(*boost::unit_test::precondition(built_with_cudnn))
BOOST_AUTO_TEST_CASE(skipped_without_cudnn) {}

#endif  // DISTRIBUTE_HAS_CUDNN

BOOST_AUTO_TEST_SUITE_END()

// --- the engine under the layers --------------------------------------------------------------------
using dist::shape;

namespace {

constexpr double tolerance = 1e-3;

std::vector<float> random_values(std::size_t n, std::uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

std::vector<float> on_host(const dist::tensor<float, dist::cpu>& t) { return {t.values().begin(), t.values().end()}; }
std::vector<float> on_host(const dist::tensor<float, dist::cuda>& t) { return t.to_vector(); }
// A span the layers hand out (a parameter's value or gradient), wherever it lives.
std::vector<float> on_host(std::span<const float> s) {
  std::vector<float> out(s.size());
  if (!s.empty())
    dist::detail::cuda_check(cudaMemcpy(out.data(), s.data(), s.size_bytes(), cudaMemcpyDefault), "cudaMemcpy (test)");
  return out;
}

// Each element of `gpu` within `tol` of `cpu`'s, relative to cpu's largest magnitude.
void check_close(const std::vector<float>& cpu, const std::vector<float>& gpu, const std::string& what,
                 double tol = tolerance) {
  BOOST_TEST_REQUIRE(cpu.size() == gpu.size(), what << ": " << cpu.size() << " vs " << gpu.size() << " elements");
  double scale = 0;
  for (float v : cpu) scale = std::max(scale, std::abs(static_cast<double>(v)));
  if (scale == 0) scale = 1;
  std::size_t worst = 0;
  double worst_err = 0;
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const double err = std::abs(static_cast<double>(cpu[i]) - static_cast<double>(gpu[i])) / scale;
    if (!(err <= worst_err)) {  // also catches NaN
      worst_err = err;
      worst = i;
    }
  }
  BOOST_TEST(worst_err <= tol, what << ": element " << worst << " is " << gpu[worst] << " on the GPU, " << cpu[worst]
                                    << " on the CPU (relative error " << worst_err << ")");
}

// Every parameter gradient (and value) of a model, in enumeration order.
template <class M>
std::vector<std::vector<float>> gradients_of(M& m) {
  std::vector<std::vector<float>> out;
  m.for_each_parameter(
      [&](auto, auto grad) { out.push_back(on_host(std::span<const float>(grad.data(), grad.size()))); });
  return out;
}
template <class M>
std::vector<std::vector<float>> values_of(M& m) {
  std::vector<std::vector<float>> out;
  m.for_each_parameter(
      [&](auto value, auto) { out.push_back(on_host(std::span<const float>(value.data(), value.size()))); });
  return out;
}

// One forward and backward pass of `make(device)` on the CPU and on cuda:0 from the same input and
// output gradient; everything compared. `train`: the mode of the layers (batch norm's statistics).
template <class Make>
void compare_model(Make make, const shape& in, const std::string& name, bool train = true) {
  auto cpu_model = make(dist::cpu{});
  auto x_values = random_values(static_cast<std::size_t>(in.numel()), 7);
  const dist::tensor<float, dist::cpu> x{in, x_values};
  auto r = nn::local();
  cpu_model.set_training(train);
  const auto y = cpu_model.forward(r, x);
  const auto dy_values = random_values(y.size(), 11);
  const dist::tensor<float, dist::cpu> dy{y.shape(), dy_values};
  cpu_model.zero_grad();
  const auto dx = cpu_model.backward(r, dy);

  dist::one_device_strategy<dist::cuda> s;
  auto gpu_model = make(s.device());
  // Every parameter made the same on both devices (a layer without parameters has none to compare).
  const auto cpu_values = values_of(cpu_model), gpu_values = values_of(gpu_model);
  BOOST_TEST_REQUIRE(cpu_values.size() == gpu_values.size(), name << ": " << cpu_values.size()
                                                                  << " parameters on the CPU, " << gpu_values.size()
                                                                  << " on the GPU");
  for (std::size_t p = 0; p < cpu_values.size(); ++p)
    check_close(cpu_values[p], gpu_values[p], name + ": initial value of parameter " + std::to_string(p), 0.0);
  gpu_model.set_training(train);
  std::vector<float> gy, gdx;
  s.run([&](dist::replica auto& rg) {
    const auto xg = dist::tensor<float, dist::cuda>::from_host(in, std::span<const float>(x_values), rg.device());
    const auto yg = gpu_model.forward(rg, xg);
    gy = on_host(yg);
    const auto dyg =
        dist::tensor<float, dist::cuda>::from_host(yg.shape(), std::span<const float>(dy_values), rg.device());
    gpu_model.zero_grad();
    gdx = on_host(gpu_model.backward(rg, dyg));
  });
  check_close(on_host(y), gy, name + ": output");
  check_close(on_host(dx), gdx, name + ": input gradient");
  const auto cg = gradients_of(cpu_model), gg = gradients_of(gpu_model);
  BOOST_TEST_REQUIRE(cg.size() == gg.size());
  for (std::size_t p = 0; p < cg.size(); ++p)
    check_close(cg[p], gg[p], name + ": gradient of parameter " + std::to_string(p));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(layers)

BOOST_AUTO_TEST_CASE(the_engine_is_the_replicas) {
  static_assert(dist::compute_engine<dist::engine<dist::cuda>>);
  dist::mirrored_strategy<dist::cuda> s{dist::cuda_replicas(2), {}, dist::cuda_collective_engine::cuda_peer};
  s.set_compute_options({.tf32 = true});
  const auto seen = s.run([](dist::replica auto& r) {
    auto& e = r.engine();
    return std::tuple{e.stream() == r.device().stream(), e.options().tf32, &e == &r.engine()};
  });
  for (const auto& [same_stream, tf32, kept] : seen) {
    BOOST_TEST(same_stream);
    BOOST_TEST(tf32);
    BOOST_TEST(kept);
  }
}

// In float32 to float rounding; in 16 bits (bfloat16: an 8-bit significand, float16: 11 bits) to
// the rounding of each operand once, the accumulation float32 either way.
BOOST_AUTO_TEST_CASE(matrix_products_match_the_cpu_engine) {
  dist::engine<dist::cpu> cpu_engine;
  for (const auto [precision, tol] :
       {std::pair{dist::compute_precision::float32, tolerance}, std::pair{dist::compute_precision::bfloat16, 3e-2},
        std::pair{dist::compute_precision::float16, 5e-3}}) {
    dist::engine<dist::cuda> gpu_engine{{.precision = precision}, 0, dist::cuda{0}};
    BOOST_TEST((gpu_engine.precision() == precision));
    for (const bool ta : {false, true})
      for (const bool tb : {false, true})
        for (const bool acc : {false, true}) {
          const dist::gemm_geometry g{
              .m = 37, .n = 29, .k = 53, .transpose_a = ta, .transpose_b = tb, .accumulate = acc};
          const auto a = random_values(static_cast<std::size_t>(g.a_size()), 1),
                     b = random_values(static_cast<std::size_t>(g.b_size()), 2);
          auto c = random_values(static_cast<std::size_t>(g.c_size()), 3);
          auto da = dist::tensor<float, dist::cuda>::from_host(shape{g.a_size()}, std::span<const float>(a));
          auto db = dist::tensor<float, dist::cuda>::from_host(shape{g.b_size()}, std::span<const float>(b));
          auto dc = dist::tensor<float, dist::cuda>::from_host(shape{g.c_size()}, std::span<const float>(c));
          cpu_engine.gemm(g, a.data(), b.data(), c.data());
          gpu_engine.gemm(g, da.data(), db.data(), dc.data());
          check_close(c, dc.to_vector(), std::string(dist::to_string(precision)) + " gemm " + g.to_string(), tol);
        }
  }
}

BOOST_AUTO_TEST_CASE(a_model_with_a_precision_of_its_own_tracks_float32_and_restores_the_engine,
                     *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  // A small model on cuda:0, three Adam steps in float32 and wrapped in bfloat16 and float16
  // (with_precision): the parameters stay within the distance each 16-bit format's rounding allows
  // (tests/nn/precision_case.hpp says why, and the CPU suite checks the same bounds on the CPU's
  // arithmetic), bfloat16 lands where the CPU engine's bfloat16 lands (where this host computes
  // bfloat16), and the engine is float32 again after each pass.
  namespace pc = dist::test::precision_case;
  dist::one_device_strategy<dist::cuda> s{dist::cuda{0}};
  const auto to_device = [](auto& r, const std::vector<float>& x) {
    return dist::tensor<float, dist::cuda>::from_host(pc::input_shape, std::span<const float>(x), r.device());
  };
  const auto to_host = [](auto v) { return on_host(std::span<const float>(v.data(), v.size())); };
  std::vector<std::vector<float>> results;
  for (const auto precision :
       {dist::compute_precision::float32, dist::compute_precision::bfloat16, dist::compute_precision::float16}) {
    const auto [p, restored] = pc::train(s, precision, to_device, to_host);
    BOOST_TEST(restored, dist::to_string(precision) << ": the engine's precision was not restored");
    results.push_back(p);
  }
  const double bf16 = pc::relative_distance(results[0], results[1]),
               fp16 = pc::relative_distance(results[0], results[2]);
  BOOST_TEST_MESSAGE("after 3 Adam steps, relative to float32: bfloat16 " << bf16 << ", float16 " << fp16);
  BOOST_TEST(bf16 <= pc::bfloat16_from_float32, "bfloat16 against float32 after 3 steps: " << bf16);
  BOOST_TEST(fp16 <= pc::float16_from_float32, "float16 against float32 after 3 steps: " << fp16);
  BOOST_TEST((results[1] != results[0]));  // bfloat16 did compute in bfloat16
  if (dist::detail::cpu_has_bf16_units()) {
    dist::one_device_strategy<dist::cpu> cpu;
    const auto [on_cpu, cpu_restored] = pc::train(
        cpu, dist::compute_precision::bfloat16,
        [](auto&, const std::vector<float>& x) { return dist::tensor<float, dist::cpu>{pc::input_shape, x}; },
        [](auto v) { return std::vector<float>(v.begin(), v.end()); });
    const double between = pc::relative_distance(on_cpu, results[1]);
    BOOST_TEST(between <= pc::bfloat16_between_engines, "bfloat16 on the GPU against bfloat16 on the CPU: " << between);
  } else {
    BOOST_TEST_MESSAGE("this host has no bf16 units: bfloat16 on the GPU not compared with the CPU engine's");
  }
}

// A layer of cuda:0 that passes its input through and, in backward, records how many gradient
// buckets its replica's open overlap had started: it runs after every other layer's backward.
struct started_probe : nn::detail::stateless {
  using scalar_type = float;
  using device_type = dist::cuda;
  std::function<std::size_t()> started;
  std::size_t seen = 0;
  template <class R>
  dist::tensor<float, dist::cuda> forward(R&, const dist::tensor<float, dist::cuda>& x) {
    return x;
  }
  template <class R>
  dist::tensor<float, dist::cuda> backward(R&, const dist::tensor<float, dist::cuda>& dy) {
    if (started) seen = started();
    return dy;
  }
};

// The gradient all-reduce overlapped with backward on GPU replicas: on NCCL every bucket starts on
// the communication stream while backward is still queueing (all of them before the first layer's
// backward), on cuda_peer they run in wait; either way the parameters after three Adam steps have
// the bits of the blocking all-reduce.
template <class M>
void check_overlap_on_gpus(bool overlapped_in_backward) {
  const dist::gradient_reduction small_buckets{.bucket_bytes = 1200, .first_bucket_bytes = 200};
  auto s = M::make();
  const int n = M::replicas;
  const auto x = random_values(static_cast<std::size_t>(2 * n * 2 * 8 * 8), 17);
  auto train = [&](bool overlap) {
    auto nets = s.mirror([&](auto& device) {
      return nn::sequential{
          started_probe{},
          nn::conv2d<float, dist::cuda>{{.in_channels = 2, .out_channels = 8, .kernel = 3, .padding = 1}, 1, device},
          nn::relu<float, dist::cuda>{},
          nn::conv2d<float, dist::cuda>{{.in_channels = 8, .out_channels = 8, .kernel = 3, .padding = 1}, 2, device},
          nn::relu<float, dist::cuda>{},
          nn::conv2d<float, dist::cuda>{{.in_channels = 8, .out_channels = 2, .kernel = 3, .padding = 1}, 3, device}};
    });
    auto opts = s.mirror([](auto&) { return dist::optim::adam<float>{{.lr = 1e-2}}; });
    auto xs = s.scatter(x, 2 * 8 * 8);
    std::pair<std::size_t, std::size_t> counts;
    for (int step = 0; step < 3; ++step) {
      const auto out = s.run(
          [&](dist::replica auto& r, const std::vector<float>& xl, auto& net, dist::optim::adam<float>& opt) {
            const auto input = dist::tensor<float, dist::cuda>::from_host(
                dist::shape::nchw(static_cast<std::int64_t>(xl.size()) / 128, 2, 8, 8), std::span<const float>(xl),
                r.device());
            net.zero_grad();
            const auto loss = nn::mse(r, net.forward(r, input), input, 2 * n);
            std::size_t collectives = 0;
            if (overlap) {
              auto sync = r.overlap_gradients(small_buckets);
              sync.add(net);
              net.template get<0>().started = [&sync] { return sync.started(); };
              net.backward(r, loss.grad);
              net.template get<0>().started = nullptr;
              collectives = sync.wait();
            } else {
              net.backward(r, loss.grad);
              collectives = r.all_reduce_gradients(net, small_buckets);
            }
            opt.step(r, net);
            return std::pair{collectives, net.template get<0>().seen};
          },
          xs, nets, opts);
      counts = out[0];
    }
    s.verify_mirrored(nets);
    return std::pair{values_of(nets[0]), counts};
  };
  const auto [blocking, blocking_counts] = train(false);
  const auto [overlapped, overlapped_counts] = train(true);
  BOOST_TEST(blocking_counts.first > 2u, "the net's gradients take several buckets");
  BOOST_TEST(overlapped_counts.first == blocking_counts.first);
  BOOST_TEST(overlapped_counts.second == (overlapped_in_backward ? overlapped_counts.first : 0u), M::name);
  BOOST_TEST_REQUIRE(blocking.size() == overlapped.size());
  for (std::size_t p = 0; p < blocking.size(); ++p)
    BOOST_TEST(dt::bit_equal(overlapped[p], blocking[p]), M::name << ": parameter " << p);
}

BOOST_AUTO_TEST_CASE(overlapped_gradient_all_reduce_on_gpu_replicas_has_the_bits_of_the_blocking_one,
                     *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  check_overlap_on_gpus<dt::peer_n<2>>(false);
#if DISTRIBUTE_HAS_NCCL
  check_overlap_on_gpus<dt::nccl_1>(true);
#endif
}

// --- CUDA graphs (cuda/nn/graphed.cuh) ---

// The CycleGAN's kinds of layers (convolutions, reflection padding, instance norm, a transposed
// convolution, activations): nothing in either pass reads the device from the host.
auto make_graphable(dist::cuda device) {
  return nn::sequential{
      nn::conv2d<float, dist::cuda>{{.in_channels = 2, .out_channels = 8, .kernel = 3, .padding = 1}, 1, device},
      nn::leaky_relu<float, dist::cuda>{0.2f},
      nn::conv2d<float, dist::cuda>{
          {.in_channels = 8, .out_channels = 8, .kernel = 4, .stride = 2, .padding = 1}, 2, device},
      nn::instance_norm<float, dist::cuda>{{.channels = 8, .affine = true}, 3, device},
      nn::relu<float, dist::cuda>{},
      nn::conv_transpose2d<float, dist::cuda>{
          {.in_channels = 8, .out_channels = 4, .kernel = 3, .stride = 2, .padding = 1, .output_padding = 1},
          4,
          device},
      nn::conv2d<float, dist::cuda>{
          {.in_channels = 4, .out_channels = 2, .kernel = 3, .padding = 1, .pad_mode = nn::padding_mode::reflect},
          5,
          device},
      nn::tanh<float, dist::cuda>{}};
}

struct graph_run {
  std::vector<std::vector<float>> outputs, input_gradients, parameters;
  std::vector<bool> replaying;  // after each step (graphed runs)
  std::size_t captures = 0;
  std::string eager_reason;
};

// Adam steps of `make(device)` (plain or graphed), made on the replica's device of a one_device
// strategy on cuda:0 (on a stream of its own unless `legacy_stream`), one batch size per step: every
// step's output and input gradient, and the parameters at the end.
template <class Make>
graph_run steps_of(Make make, const std::vector<std::int64_t>& batches, bool legacy_stream = false) {
  const dist::cuda_stream stream(0);
  dist::one_device_strategy<dist::cuda> s{legacy_stream ? dist::cuda{0} : dist::cuda{0}.on(stream.get())};
  auto net = make(s.device());
  auto opt = dist::optim::adam<float>{{.lr = 1e-2}};
  graph_run out;
  for (std::size_t step = 0; step < batches.size(); ++step) {
    const std::int64_t n = batches[step];
    const auto x = random_values(static_cast<std::size_t>(n * 2 * 8 * 8), static_cast<std::uint32_t>(100 + step));
    const auto t = random_values(static_cast<std::size_t>(n * 2 * 8 * 8), static_cast<std::uint32_t>(200 + step), 0.5f);
    s.run([&](dist::replica auto& r) {
      const auto xg = dist::tensor<float, dist::cuda>::from_host(dist::shape::nchw(n, 2, 8, 8),
                                                                 std::span<const float>(x), r.device());
      const auto tg = dist::tensor<float, dist::cuda>::from_host(dist::shape::nchw(n, 2, 8, 8),
                                                                 std::span<const float>(t), r.device());
      net.zero_grad();
      const auto y = net.forward(r, xg);
      const auto loss = nn::mse(r, y, tg, n);
      const auto dx = net.backward(r, loss.grad);
      opt.step(r, net);
      out.outputs.push_back(on_host(y));
      out.input_gradients.push_back(on_host(dx));
    });
    if constexpr (requires { net.replaying(); }) out.replaying.push_back(net.replaying());
  }
  for (auto& v : values_of(net)) out.parameters.push_back(std::move(v));
  if constexpr (requires { net.captures(); }) {
    out.captures = net.captures();
    out.eager_reason = net.eager_reason();
  }
  return out;
}

void check_same_bits(const graph_run& graphed, const graph_run& eager) {
  BOOST_TEST_REQUIRE(graphed.outputs.size() == eager.outputs.size());
  for (std::size_t i = 0; i < eager.outputs.size(); ++i) {
    BOOST_TEST(dt::bit_equal(graphed.outputs[i], eager.outputs[i]), "output of step " << i);
    BOOST_TEST(dt::bit_equal(graphed.input_gradients[i], eager.input_gradients[i]), "input gradient of step " << i);
  }
  BOOST_TEST_REQUIRE(graphed.parameters.size() == eager.parameters.size());
  for (std::size_t p = 0; p < eager.parameters.size(); ++p)
    BOOST_TEST(dt::bit_equal(graphed.parameters[p], eager.parameters[p]), "parameter " << p);
}

BOOST_AUTO_TEST_CASE(graphed_passes_replay_the_eager_ones_bit_for_bit, *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  // Batch 2 for four steps (warm-up, capture, two replays), 3 for three (a new shape: warm-up,
  // capture, replay), 2 again (warm-up once more): the outputs, input gradients and parameters of
  // every step are the eager model's, bit for bit.
  const std::vector<std::int64_t> batches{2, 2, 2, 2, 3, 3, 3, 2};
  const auto eager = steps_of([](dist::cuda d) { return make_graphable(d); }, batches);
  const auto graphed = steps_of([](dist::cuda d) { return nn::graphed{make_graphable(d)}; }, batches);
  BOOST_TEST(graphed.eager_reason == "");
  BOOST_TEST(graphed.captures == 2u);
  BOOST_TEST((graphed.replaying == std::vector<bool>{false, true, true, true, false, true, true, false}));
  check_same_bits(graphed, eager);
}

BOOST_AUTO_TEST_CASE(on_the_legacy_default_stream_graphs_fall_back_to_eager_and_say_how_to_capture,
                     *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  // CUDA refuses to capture the legacy default stream (a one_device strategy given cuda{0} alone):
  // the model runs eagerly, with the eager results, and the reason names the remedy.
  const std::vector<std::int64_t> batches{2, 2, 2};
  const auto eager = steps_of([](dist::cuda d) { return make_graphable(d); }, batches, /*legacy_stream=*/true);
  const auto graphed =
      steps_of([](dist::cuda d) { return nn::graphed{make_graphable(d)}; }, batches, /*legacy_stream=*/true);
  BOOST_TEST(graphed.captures == 0u);
  BOOST_TEST((graphed.replaying == std::vector<bool>(3, false)));
  BOOST_TEST(dt::contains(graphed.eager_reason, "legacy default stream"), graphed.eager_reason);
  BOOST_TEST(dt::contains(graphed.eager_reason, "cuda{0}.on(stream)"), graphed.eager_reason);
  check_same_bits(graphed, eager);
}

BOOST_AUTO_TEST_CASE(a_graphed_copy_warms_up_before_it_captures, *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  // Assigning a graphed model drops its graphs and its warm-up count: the next pass is eager.
  const dist::cuda_stream stream(0);
  dist::one_device_strategy<dist::cuda> s{dist::cuda{0}.on(stream.get())};
  auto a = nn::graphed{make_graphable(s.device())};
  const auto b = nn::graphed{make_graphable(s.device())};
  const auto x = random_values(2 * 2 * 8 * 8, 7);
  auto pass = [&](auto& net) {
    s.run([&](dist::replica auto& r) {
      const auto xg = dist::tensor<float, dist::cuda>::from_host(dist::shape::nchw(2, 2, 8, 8),
                                                                 std::span<const float>(x), r.device());
      net.backward(r, net.forward(r, xg));
    });
  };
  pass(a);
  pass(a);
  BOOST_TEST_REQUIRE(a.replaying());
  a = b;
  BOOST_TEST(!a.replaying());
  pass(a);
  BOOST_TEST(!a.replaying(), "the first pass after the assignment is a warm-up");
  pass(a);
  BOOST_TEST(a.replaying());
}

BOOST_AUTO_TEST_CASE(a_model_a_graph_cannot_hold_runs_eagerly_and_says_why, *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  // batch_norm reads its statistics on the host: the capture fails, the pass runs again eagerly, and
  // so does every later one, with the eager results.
  auto make = [](dist::cuda device) {
    return nn::sequential{
        nn::conv2d<float, dist::cuda>{{.in_channels = 2, .out_channels = 4, .kernel = 3, .padding = 1}, 1, device},
        nn::batch_norm<float, dist::cuda>{{.channels = 4}, 2, device},
        nn::conv2d<float, dist::cuda>{{.in_channels = 4, .out_channels = 2, .kernel = 3, .padding = 1}, 3, device}};
  };
  const std::vector<std::int64_t> batches{2, 2, 2, 2};
  const auto eager = steps_of(make, batches);
  const auto graphed = steps_of([&](dist::cuda d) { return nn::graphed{make(d)}; }, batches);
  BOOST_TEST(graphed.captures == 0u);
  BOOST_TEST((graphed.replaying == std::vector<bool>(4, false)));
  BOOST_TEST(dt::contains(graphed.eager_reason, "capturing the forward pass failed"), graphed.eager_reason);
  BOOST_TEST(dt::contains(graphed.eager_reason, "engine<cuda>::to_host"), graphed.eager_reason);
  check_same_bits(graphed, eager);
}

// A layer that sums its input (and its output gradient) across replicas, as sync_batch_norm sums
// its statistics.
struct all_reducing_layer : nn::detail::stateless {
  using scalar_type = float;
  using device_type = dist::cuda;
  template <class R>
  dist::tensor<float, dist::cuda> forward(R& r, const dist::tensor<float, dist::cuda>& x) {
    dist::tensor<float, dist::cuda> y{x};
    r.all_reduce(dist::reduce_op::sum, y.values());
    return y;
  }
  template <class R>
  dist::tensor<float, dist::cuda> backward(R& r, const dist::tensor<float, dist::cuda>& dy) {
    dist::tensor<float, dist::cuda> dx{dy};
    r.all_reduce(dist::reduce_op::sum, dx.values());
    return dx;
  }
};

BOOST_AUTO_TEST_CASE(a_graphed_model_that_calls_collectives_runs_eagerly, *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  // A collective inside a pass is refused while capturing, on every replica alike, which all go on
  // eagerly and stay in step.
  auto s = dt::peer_n<2>::make();
  auto nets = s.mirror([](auto& device) {
    return nn::graphed{nn::sequential{
        nn::conv2d<float, dist::cuda>{{.in_channels = 2, .out_channels = 4, .kernel = 3, .padding = 1}, 1, device},
        all_reducing_layer{}}};
  });
  const auto x = random_values(4 * 2 * 8 * 8, 5);
  auto xs = s.scatter(x, 2 * 8 * 8);
  for (int step = 0; step < 3; ++step) {
    s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, auto& net) {
          const auto xg = dist::tensor<float, dist::cuda>::from_host(dist::shape::nchw(2, 2, 8, 8),
                                                                     std::span<const float>(xl), r.device());
          net.zero_grad();
          const auto y = net.forward(r, xg);
          net.backward(r, y);
          r.all_reduce_gradients(net);
        },
        xs, nets);
  }
  for (std::size_t i = 0; i < 2; ++i) {
    BOOST_TEST(nets[i].captures() == 0u);
    BOOST_TEST(dt::contains(nets[i].eager_reason(), "all_reduce"), nets[i].eager_reason());
  }
  s.verify_mirrored(nets);
}

// --- whole steps as CUDA graphs (cuda/nn/graphed_step.cuh) ---

struct whole_run {
  std::vector<float> losses;                   // each step's, read from the tensor the step returned
  std::vector<std::vector<float>> parameters;  // replica 0's, at the end
  std::vector<bool> replaying;                 // replica 0's step, after each step
  std::size_t captures = 0;
  std::string eager_reason;
  std::int64_t optimiser_steps = 0;
};

// `steps` Adam steps of make_graphable on every replica of M's strategy, each step (forward, loss
// left on the device, backward, the gradient all-reduce, the update) run through one
// nn::graphed_step (enabled or not), with two eager warm-up steps.
template <class M>
whole_run whole_steps(bool enabled, int steps, bool capturable = true) {
  auto s = M::make();
  const int n = M::replicas;
  auto nets = s.mirror([](auto& device) { return make_graphable(device); });
  auto opts = s.mirror([&](auto&) { return dist::optim::adam<float>{{.lr = 1e-2, .capturable = capturable}}; });
  nn::graphed_step<float> whole{{.enabled = enabled, .warmup_passes = 2}};
  whole_run out;
  for (int step = 0; step < steps; ++step) {
    const auto x = random_values(static_cast<std::size_t>(2 * n * 2 * 8 * 8), static_cast<std::uint32_t>(300 + step));
    const auto t =
        random_values(static_cast<std::size_t>(2 * n * 2 * 8 * 8), static_cast<std::uint32_t>(400 + step), 0.5f);
    auto xs = s.scatter(x, 2 * 8 * 8);
    auto ts = s.scatter(t, 2 * 8 * 8);
    const auto losses = s.run(
        [&](dist::replica auto& r, const std::vector<float>& xl, const std::vector<float>& tl, auto& net,
            dist::optim::adam<float>& opt) {
          const auto shape = dist::shape::nchw(static_cast<std::int64_t>(xl.size()) / 128, 2, 8, 8);
          const auto xg = dist::tensor<float, dist::cuda>::from_host(shape, std::span<const float>(xl), r.device());
          const auto tg = dist::tensor<float, dist::cuda>::from_host(shape, std::span<const float>(tl), r.device());
          const auto loss = whole.run(
              r,
              [&](const dist::tensor<float, dist::cuda>& xi, const dist::tensor<float, dist::cuda>& ti) {
                net.zero_grad();
                auto l = nn::mse(r, net.forward(r, xi), ti, 2 * n, nn::value_on_device);
                net.backward(r, l.grad);
                r.all_reduce_gradients(net);
                opt.step(r, net);
                return l.value;
              },
              xg, tg);
          return on_host(loss).at(0);
        },
        xs, ts, nets, opts);
    out.losses.push_back(losses[0]);
    out.replaying.push_back(whole.replaying(0));
  }
  s.verify_mirrored(nets);
  for (auto& v : values_of(nets[0])) out.parameters.push_back(std::move(v));
  out.captures = whole.captures();
  out.eager_reason = whole.eager_reason();
  out.optimiser_steps = opts[0].steps();
  return out;
}

void check_same_bits(const whole_run& graphed, const whole_run& eager) {
  BOOST_TEST_REQUIRE(graphed.losses.size() == eager.losses.size());
  for (std::size_t i = 0; i < eager.losses.size(); ++i)
    BOOST_TEST(std::memcmp(&graphed.losses[i], &eager.losses[i], sizeof(float)) == 0, "loss of step " << i);
  BOOST_TEST_REQUIRE(graphed.parameters.size() == eager.parameters.size());
  for (std::size_t p = 0; p < eager.parameters.size(); ++p)
    BOOST_TEST(dt::bit_equal(graphed.parameters[p], eager.parameters[p]), "parameter " << p);
  BOOST_TEST(graphed.optimiser_steps == eager.optimiser_steps);
}

BOOST_AUTO_TEST_CASE(whole_steps_replay_the_eager_ones_bit_for_bit, *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  // One GPU alone, and through NCCL (its all-reduce captured into the graph and the replay met and
  // waited for as a collective): two warm-up steps, the capture, three replays; every loss, the
  // parameters and the optimiser's step count (counted on the device through the replays) are the
  // eager run's.
  auto check = [](auto maker, const char* name) {
    using M = decltype(maker);
    const auto eager = whole_steps<M>(false, 6);
    const auto graphed = whole_steps<M>(true, 6);
    BOOST_TEST(graphed.eager_reason == "", name << ": " << graphed.eager_reason);
    BOOST_TEST(graphed.captures == static_cast<std::size_t>(M::replicas), name);
    BOOST_TEST((graphed.replaying == std::vector<bool>{false, false, true, true, true, true}), name);
    BOOST_TEST(graphed.optimiser_steps == 6, name);
    check_same_bits(graphed, eager);
  };
  check(dt::one_gpu_own_stream{}, dt::one_gpu_own_stream::name);
#if DISTRIBUTE_HAS_NCCL
  check(dt::nccl_1{}, dt::nccl_1::name);
#endif
}

BOOST_AUTO_TEST_CASE(a_step_a_graph_cannot_hold_runs_eagerly_and_says_why, *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  // An optimiser with host step values refuses to be captured; cuda_peer's collectives cannot be
  // captured. Either way every replica goes on eagerly, with the eager results, and says why.
  const auto eager = whole_steps<dt::one_gpu_own_stream>(false, 4, /*capturable=*/false);
  const auto host_adam = whole_steps<dt::one_gpu_own_stream>(true, 4, /*capturable=*/false);
  BOOST_TEST(host_adam.captures == 0u);
  BOOST_TEST(dt::contains(host_adam.eager_reason, "capturable = true"), host_adam.eager_reason);
  BOOST_TEST((host_adam.replaying == std::vector<bool>(4, false)));
  check_same_bits(host_adam, eager);
  const auto peer_eager = whole_steps<dt::peer_n<2>>(false, 4);
  const auto peer = whole_steps<dt::peer_n<2>>(true, 4);
  BOOST_TEST(peer.captures == 0u);
  BOOST_TEST(dt::contains(peer.eager_reason, "cannot be captured"), peer.eager_reason);
  check_same_bits(peer, peer_eager);
  // On the legacy default stream no capture can begin: eager, and the reason says so.
  const auto legacy = whole_steps<dt::one_gpu>(true, 4);
  BOOST_TEST(legacy.captures == 0u);
  BOOST_TEST(dt::contains(legacy.eager_reason, "legacy default stream"), legacy.eager_reason);
  check_same_bits(legacy, whole_steps<dt::one_gpu>(false, 4));
}

BOOST_AUTO_TEST_CASE(plane_sums_and_element_wise_passes_on_the_stream) {
  dist::engine<dist::cuda> e{{}, 0, dist::cuda{0}};
  const std::int64_t planes = 7, plane = 1000;
  const auto x = random_values(static_cast<std::size_t>(planes * plane), 5);
  const auto dx = dist::tensor<float, dist::cuda>::from_host(shape{planes * plane}, std::span<const float>(x));
  dist::tensor<double, dist::cuda> sums{shape{planes}};
  e.segmented_sum(planes, plane, nn::detail::kernels::value_of<float>{dx.data(), plane}, sums.data());
  std::vector<double> got(static_cast<std::size_t>(planes));
  e.to_host(sums.data(), got.size(), got.data());
  for (std::int64_t s = 0; s < planes; ++s) {
    double want = 0;
    for (std::int64_t i = 0; i < plane; ++i) want += x[static_cast<std::size_t>(s * plane + i)];
    BOOST_TEST(got[static_cast<std::size_t>(s)] == want, boost::test_tools::tolerance(1e-9));
  }
  dist::tensor<float, dist::cuda> y{shape{planes * plane}};
  e.for_each(planes * plane, nn::detail::kernels::relu_forward<float>{dx.data(), y.data()});
  const auto yh = y.to_vector();
  for (std::size_t i = 0; i < x.size(); ++i) BOOST_TEST_REQUIRE(yh[i] == std::max(x[i], 0.0f));
}

BOOST_AUTO_TEST_CASE(convolutions_without_cudnn_say_so) {
  if constexpr (dist::engine<dist::cuda>::has_cudnn) {
    BOOST_TEST_MESSAGE("this build has cuDNN");
    BOOST_TEST(true);
  } else {
    dist::engine<dist::cuda> e{{}, 0, dist::cuda{0}};
    const auto g = dist::conv_geometry::of(1, 1, 4, 4, 1, 3, 1, 1);
    BOOST_CHECK_EXCEPTION(e.conv_forward<float>(g, nullptr, nullptr, nullptr, nullptr), std::runtime_error,
                          [](const std::runtime_error& err) { return dt::contains(err.what(), "no cuDNN"); });
  }
}

BOOST_AUTO_TEST_CASE(single_layers_match_the_cpu) {
  const shape img = shape::nchw(2, 3, 12, 12);
  compare_model([](auto d) { return nn::relu<float, decltype(d)>{}; }, img, "relu");
  compare_model([](auto d) { return nn::leaky_relu<float, decltype(d)>{0.2f}; }, img, "leaky_relu");
  compare_model([](auto d) { return nn::tanh<float, decltype(d)>{}; }, img, "tanh");
  compare_model([](auto d) { return nn::instance_norm<float, decltype(d)>{{.channels = 3}, 5, d}; }, img,
                "instance_norm");
  compare_model([](auto d) { return nn::batch_norm<float, decltype(d)>{{.channels = 3}, 5, d}; }, img,
                "batch_norm (training)");
  compare_model([](auto d) { return nn::avg_pool2d<float, decltype(d)>{{.kernel = 2, .stride = 2}}; }, img,
                "avg_pool2d");
  compare_model([](auto d) { return nn::linear<float, decltype(d)>{{.in_features = 40, .out_features = 9}, 3, d}; },
                shape{6, 40}, "linear");
}

BOOST_AUTO_TEST_CASE(porting_layers_match_the_cpu) {
  const shape img = shape::nchw(2, 4, 6, 5);
  compare_model([](auto d) { return nn::upsample<float, decltype(d)>{{.scale_factor = 3}}; }, img, "upsample nearest");
  compare_model(
      [](auto d) { return nn::upsample<float, decltype(d)>{{.scale_factor = 2, .mode = nn::upsample_mode::bilinear}}; },
      img, "upsample bilinear");
  compare_model([](auto d) { return nn::pixel_shuffle<float, decltype(d)>{{.upscale_factor = 2}}; }, img,
                "pixel_shuffle");
  compare_model([](auto d) { return nn::layer_norm<float, decltype(d)>{{.normalized_shape = shape{4, 6, 5}}, d}; }, img,
                "layer_norm over (C, H, W)");
  compare_model([](auto d) { return nn::layer_norm<float, decltype(d)>{{.normalized_shape = shape{5}}, d}; }, img,
                "layer_norm over W");
  compare_model(
      [](auto d) {
        return nn::spectral_norm{nn::linear<float, decltype(d)>{{.in_features = 40, .out_features = 9}, 3, d}, {}, 5};
      },
      shape{6, 40}, "spectral_norm(linear)");
  compare_model(
      [](auto d) {
        return nn::spectral_norm{
            nn::conv2d<float, decltype(d)>{{.in_channels = 4, .out_channels = 6, .kernel = 3, .padding = 1}, 3, d},
            {},
            5};
      },
      img, "spectral_norm(conv2d)");
  // Embedding: integral indices (rows picked several times), its weight gradient a gather per row.
  const std::vector<float> ids{3, 0, 3, 7, 1, 3, 7, 2, 0, 3, 5, 3};
  const shape in{3, 4};
  auto cpu_emb = nn::embedding<float>{{.num_embeddings = 8, .embedding_dim = 6}, 4};
  auto r = nn::local();
  const dist::tensor<float, dist::cpu> x{in, ids};
  const auto y = cpu_emb.forward(r, x);
  const auto dy_values = random_values(y.size(), 11);
  cpu_emb.zero_grad();
  cpu_emb.backward(r, dist::tensor<float, dist::cpu>{y.shape(), dy_values});
  dist::one_device_strategy<dist::cuda> s;
  auto gpu_emb = nn::embedding<float, dist::cuda>{{.num_embeddings = 8, .embedding_dim = 6}, 4, s.device()};
  std::vector<float> gy;
  s.run([&](dist::replica auto& rg) {
    const auto xg = dist::tensor<float, dist::cuda>::from_host(in, std::span<const float>(ids), rg.device());
    const auto yg = gpu_emb.forward(rg, xg);
    gy = on_host(yg);
    gpu_emb.zero_grad();
    gpu_emb.backward(
        rg, dist::tensor<float, dist::cuda>::from_host(yg.shape(), std::span<const float>(dy_values), rg.device()));
  });
  check_close(on_host(y), gy, "embedding: output", 0.0);
  check_close(gradients_of(cpu_emb)[0], gradients_of(gpu_emb)[0], "embedding: weight gradient", 0.0);
}

// The operations between layers (nn/shape_ops.hpp, reductions.hpp, broadcasting.hpp,
// elementwise.hpp) on a GPU replica against the CPU, by hand and on a tape: every value within the
// comparison's tolerance (sums add in another order on the GPU), argmax and one_hot exactly.
std::vector<float> indices_on_host(const dist::tensor<std::int64_t, dist::cpu>& t) {
  return {t.values().begin(), t.values().end()};
}
std::vector<float> indices_on_host(const dist::tensor<std::int64_t, dist::cuda>& t) {
  const auto v = t.to_vector();
  return {v.begin(), v.end()};
}
template <class R, class Upload>
std::vector<std::vector<float>> every_operation(R& r, Upload upload) {
  const auto x = upload(shape::nchw(3, 5, 7, 9), random_values(945, 31));
  const auto pos = upload(shape::nchw(3, 5, 7, 9), [] {
    auto v = random_values(945, 32);
    for (auto& e : v) e = 0.1f + std::abs(e);
    return v;
  }());
  const auto per_channel = upload(shape{5, 1, 1}, random_values(5, 33));
  const auto mask = upload(shape{3, 1, 7, 9}, random_values(189, 34));
  std::vector<std::vector<float>> out;
  auto keep = [&](const auto& t) { out.push_back(on_host(t)); };
  keep(nn::square(r, x));
  keep(nn::sqrt(r, pos));
  keep(nn::exp(r, x));
  keep(nn::log(r, pos));
  keep(nn::abs(r, x));
  keep(nn::sigmoid(r, x));
  keep(nn::softplus(r, x, 2.0f, 1.0f));
  keep(nn::clamp(r, x, -0.3f, 0.4f));
  keep(nn::pow(r, pos, 1.5f));
  keep(nn::add(r, x, per_channel));
  keep(nn::sub(r, per_channel, x));
  keep(nn::mul(r, x, mask));
  keep(nn::div(r, x, nn::add(r, nn::abs(r, mask), per_channel)));
  keep(nn::reshape(r, x, {-1, 63}));
  keep(nn::permute(r, x, {0, 2, 3, 1}));
  keep(nn::transpose(r, x, 1, -1));
  keep(nn::sum(r, x, {2, 3}, true));
  keep(nn::sum(r, x, 0));
  keep(nn::mean(r, x));
  keep(nn::max(r, x, {1, 3}));
  keep(nn::max(r, x));
  keep(nn::broadcast_to(r, per_channel, x.shape()));
  keep(nn::sum_to(r, x, shape{5, 1, 1}));
  keep(nn::one_hot<float>(r, std::vector<int>{4, 0, 2, 2}, 5));
  out.push_back(indices_on_host(nn::argmax(r, x, -1)));
  out.push_back(indices_on_host(nn::argmax(r, x)));
  // Through a tape: the gradients of a loss that uses most of them.
  nn::tape t{r};
  const auto vx = t.watch(x), vb = t.watch(per_channel);
  const auto h = nn::softplus(t, nn::div(t, nn::square(t, vx), nn::add(t, nn::abs(t, vb), t.constant(pos))));
  const auto y = nn::add(t, nn::sum(t, h, {2, 3}), nn::max(t, nn::permute(t, vx, {0, 1, 3, 2}), {2, 3}));
  t.backward(nn::mean(t, nn::square(t, y)));
  keep(t.gradient(vx));
  keep(t.gradient(vb));
  return out;
}

BOOST_AUTO_TEST_CASE(operations_match_the_cpu) {
  auto r = nn::local();
  const auto cpu = every_operation(
      r, [](const shape& s, const std::vector<float>& v) { return dist::tensor<float, dist::cpu>{s, v}; });
  dist::one_device_strategy<dist::cuda> st;
  std::vector<std::vector<float>> gpu;
  st.run([&](dist::replica auto& rg) {
    gpu = every_operation(rg, [&](const shape& s, const std::vector<float>& v) {
      return dist::tensor<float, dist::cuda>::from_host(s, std::span<const float>(v), rg.device());
    });
  });
  BOOST_TEST_REQUIRE(gpu.size() == cpu.size());
  for (std::size_t i = 0; i < cpu.size(); ++i)
    check_close(cpu[i], gpu[i], "operation " + std::to_string(i) + " of every_operation", 1e-5);
}

BOOST_AUTO_TEST_CASE(convolutions_of_the_example_match_the_cpu, *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  const shape img = shape::nchw(2, 3, 16, 16);
  using nn::padding_mode;
  auto conv = [](nn::conv2d_options o) { return [o](auto d) { return nn::conv2d<float, decltype(d)>{o, 9, d}; }; };
  compare_model(conv({.in_channels = 3,
                      .out_channels = 4,
                      .kernel = 7,
                      .stride = 1,
                      .padding = 3,
                      .pad_mode = padding_mode::reflect}),
                img, "conv2d 7x7 reflect");
  compare_model(conv({.in_channels = 3, .out_channels = 8, .kernel = 3, .stride = 2, .padding = 1, .bias = false}), img,
                "conv2d 3x3 stride 2");
  compare_model(conv({.in_channels = 3,
                      .out_channels = 3,
                      .kernel = 3,
                      .stride = 1,
                      .padding = 1,
                      .pad_mode = padding_mode::reflect}),
                img, "conv2d 3x3 reflect");
  compare_model(conv({.in_channels = 3, .out_channels = 8, .kernel = 4, .stride = 2, .padding = 1}), img,
                "conv2d 4x4 stride 2");
  compare_model(conv({.in_channels = 3, .out_channels = 1, .kernel = 4, .stride = 1, .padding = 1}), img,
                "conv2d 4x4 stride 1");
  compare_model(
      [](auto d) {
        return nn::conv_transpose2d<float, decltype(d)>{{.in_channels = 3,
                                                         .out_channels = 5,
                                                         .kernel = 3,
                                                         .stride = 2,
                                                         .padding = 1,
                                                         .output_padding = 1,
                                                         .bias = true},
                                                        9,
                                                        d};
      },
      img, "conv_transpose2d 3x3 stride 2");
}

BOOST_AUTO_TEST_CASE(the_cyclegan_networks_match_the_cpu, *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  const cyclegan::generator_options g{.channels = 1, .filters = 4, .blocks = 2};
  compare_model([&](auto d) { return cyclegan::make_generator(g, 21, d); }, shape::nchw(2, 1, 28, 28), "generator");
  for (const auto norm : {cyclegan::norm_kind::instance, cyclegan::norm_kind::batch}) {
    const cyclegan::discriminator_options o{.channels = 1, .filters = 4, .layers = 2, .norm = norm};
    compare_model(
        [&](auto d) { return cyclegan::make_discriminator(o, 22, d); }, shape::nchw(2, 1, 28, 28),
        std::string("discriminator (") + (norm == cyclegan::norm_kind::instance ? "instance" : "batch") + " norm)");
  }
}

// nn::tape on a GPU replica records what it records on the CPU and routes the same gradients: a
// small U-Net (a skip through concat, a residual add) whose output a discriminator scores twice, once
// frozen beside the input and once beside real data; gradients of the watched input and of both
// networks' parameters against the CPU's.
template <class D>
struct taped_unet {
  nn::conv2d<float, D> e1, e2;
  nn::conv_transpose2d<float, D> d1;
  nn::conv2d<float, D> out;
  nn::leaky_relu<float, D> act{0.2f};
  nn::tanh<float, D> th;
  explicit taped_unet(D d)
      : e1{{.in_channels = 1, .out_channels = 3, .kernel = 3, .stride = 1, .padding = 1}, 31, d},
        e2{{.in_channels = 3, .out_channels = 4, .kernel = 4, .stride = 2, .padding = 1}, 32, d},
        d1{{.in_channels = 4, .out_channels = 3, .kernel = 4, .stride = 2, .padding = 1, .output_padding = 0}, 33, d},
        out{{.in_channels = 6, .out_channels = 1, .kernel = 3, .stride = 1, .padding = 1}, 34, d} {}
  template <class F>
  void for_each_parameter(F&& f) {
    e1.for_each_parameter(f);
    e2.for_each_parameter(f);
    d1.for_each_parameter(f);
    out.for_each_parameter(f);
  }
  template <class Tape>
  auto forward(Tape& t, typename Tape::variable x) {
    const auto h1 = t(act, t(e1, x));
    const auto h2 = t(act, t(e2, h1));
    const auto u1 = t.add(t(act, t(d1, h2)), h1);  // the residual
    return t(th, t(out, t.concat(u1, h1)));        // the skip
  }
};

template <class D>
auto make_taped_discriminator(D d) {
  return nn::sequential{
      nn::conv2d<float, D>{{.in_channels = 2, .out_channels = 3, .kernel = 4, .stride = 2, .padding = 1}, 35, d},
      nn::leaky_relu<float, D>{0.2f},
      nn::conv2d<float, D>{{.in_channels = 3, .out_channels = 1, .kernel = 3, .stride = 1, .padding = 1}, 36, d}};
}

// One taped step on replica `r`: the gradient of the input, then every parameter gradient of G, then D's.
template <class R>
std::vector<std::vector<float>> taped_step(R& r, const shape& in, const std::vector<float>& x_values,
                                           const std::vector<float>& real_values, const std::vector<float>& dy_values) {
  using D = typename R::device_type;
  auto make = [&](const shape& sh, const std::vector<float>& v) {
    if constexpr (std::is_same_v<D, dist::cuda>)
      return dist::tensor<float, dist::cuda>::from_host(sh, std::span<const float>(v), r.device());
    else return dist::tensor<float, dist::cpu>{sh, v};
  };
  taped_unet<D> g{r.device()};
  auto d = make_taped_discriminator(r.device());
  nn::tape t{r};
  const auto x = t.watch(make(in, x_values));
  const auto fake = g.forward(t, x);
  const auto on_fake = t(d, t.concat(x, fake), nn::frozen);  // D's parameters untouched by this call
  const auto on_real = t(d, t.concat(x, t.constant(make(in, real_values))));
  const auto both = t.add(t.scale(on_fake, 0.5f), on_real);
  t.backward(both, make(shape::nchw(in.n(), 1, in.h() / 2, in.w() / 2), dy_values));
  std::vector<std::vector<float>> out{on_host(t.gradient(x))};
  for (auto& v : gradients_of(g)) out.push_back(std::move(v));
  for (auto& v : gradients_of(d)) out.push_back(std::move(v));
  return out;
}

BOOST_AUTO_TEST_CASE(a_taped_model_with_skips_matches_the_cpu, *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  const shape in = shape::nchw(2, 1, 8, 8);
  const auto x = random_values(static_cast<std::size_t>(in.numel()), 41), real = random_values(x.size(), 42);
  const auto dy = random_values(static_cast<std::size_t>(in.n() * (in.h() / 2) * (in.w() / 2)), 43);
  auto r = nn::local();
  const auto cpu = taped_step(r, in, x, real, dy);
  std::vector<std::vector<float>> gpu;
  dist::one_device_strategy<dist::cuda> s;
  s.run([&](dist::replica auto& rg) { gpu = taped_step(rg, in, x, real, dy); });
  BOOST_TEST_REQUIRE(cpu.size() == gpu.size(), cpu.size() << " tensors on the CPU, " << gpu.size() << " on the GPU");
  BOOST_TEST_REQUIRE(cpu.size() == 1 + 8 + 4);  // dx; a weight and a bias for each of G's four layers and D's two
  for (std::size_t i = 0; i < cpu.size(); ++i)
    check_close(cpu[i], gpu[i],
                i == 0 ? std::string("the input's gradient") : "parameter gradient " + std::to_string(i - 1));
}

// Gradient penalties (nn/penalties.hpp) on a GPU replica: R1 and WGAN-GP through a discriminator
// written for a tape (tests/nn/penalty_discriminator.hpp), whose layers' recorded backwards
// (nn::create_graph) run on the replica's engine.
//
// On replica `r`: R1 at the real images, then WGAN-GP at the points, each with its own backward; the
// penalty, then every parameter gradient (in member order), for each.
template <class R>
std::vector<std::vector<float>> penalties_on(R& r, const shape& in, const std::vector<float>& real_values,
                                             const std::vector<float>& point_values) {
  using D = typename R::device_type;
  auto make = [&](const std::vector<float>& v) {
    if constexpr (std::is_same_v<D, dist::cuda>)
      return dist::tensor<float, dist::cuda>::from_host(in, std::span<const float>(v), r.device());
    else return dist::tensor<float, dist::cpu>{in, v};
  };
  const auto real = make(real_values), points = make(point_values);
  penalty_discriminator<D> d{r.device(), 51};
  std::vector<std::vector<float>> out;
  {
    nn::tape t{r};
    const auto p = nn::r1_penalty(t, real, [&](auto v) { return d(t, v); }, {.weight = 10.0});
    out.push_back(on_host(p.value()));
    t.backward(p);
  }
  for (auto& g : gradients_of(d)) out.push_back(std::move(g));
  d.zero_grad();
  {
    nn::tape t{r};
    const auto p = nn::gradient_penalty_at(t, points, [&](auto v) { return d(t, v); }, {.weight = 10.0});
    out.push_back(on_host(p.value()));
    t.backward(p);
  }
  for (auto& g : gradients_of(d)) out.push_back(std::move(g));
  return out;
}

BOOST_AUTO_TEST_CASE(penalties_match_the_cpu, *boost::unit_test::precondition([](auto) {
                       return boost::test_tools::assertion_result(dist::engine<dist::cuda>::has_cudnn);
                     })) {
  const shape in = shape::nchw(3, 2, 9, 9);
  const auto real = random_values(static_cast<std::size_t>(in.numel()), 61),
             points = random_values(static_cast<std::size_t>(in.numel()), 62);
  auto r = nn::local();
  const auto cpu = penalties_on(r, in, real, points);
  std::vector<std::vector<float>> gpu;
  dist::one_device_strategy<dist::cuda> s;
  s.run([&](dist::replica auto& rg) { gpu = penalties_on(rg, in, real, points); });
  BOOST_TEST_REQUIRE(cpu.size() == gpu.size(), cpu.size() << " tensors on the CPU, " << gpu.size() << " on the GPU");
  BOOST_TEST_REQUIRE(cpu.size() == 2u * (1 + 12));  // per penalty: its value and 12 parameter gradients
  auto largest = [](const std::vector<float>& v) {
    double m = 0;
    for (const float e : v) m = std::max(m, std::abs(static_cast<double>(e)));
    return m;
  };
  for (std::size_t i = 0; i < cpu.size(); ++i) {
    const std::string penalty = i < 13 ? "R1" : "WGAN-GP";
    if (i % 13 == 0) {
      BOOST_TEST(cpu[i][0] > 0.0f, penalty << " is " << cpu[i][0] << " on the CPU");
      check_close(cpu[i], gpu[i], penalty + ": the penalty");
    } else if (i % 13 == 4) {
      // The strided convolution's bias, which instance norm takes out: zero up to rounding on both
      // devices, rounding that differs with the order of the sums (not compared to itself).
      double everything = 0;
      for (std::size_t j = i - 3; j < i + 9; ++j) everything = std::max(everything, largest(cpu[j]));
      BOOST_TEST(std::max(largest(cpu[i]), largest(gpu[i])) <= 1e-5 * everything,
                 penalty << ": the gradient of c2's bias is " << largest(gpu[i]) << " on the GPU, " << largest(cpu[i])
                         << " on the CPU, against " << everything << " elsewhere");
    } else {
      check_close(cpu[i], gpu[i], penalty + ": parameter gradient " + std::to_string(i % 13 - 1));
    }
  }
}

// SyncBatchNorm over two GPU replicas (logical, on cuda:0: the statistics cross the replicas through
// their communicator) equals batch norm over the whole batch on the CPU.
BOOST_AUTO_TEST_CASE(sync_batch_norm_across_gpu_replicas_is_batch_norm_of_the_whole_batch) {
  const shape whole = shape::nchw(4, 3, 6, 6), half = shape::nchw(2, 3, 6, 6);
  const auto x = random_values(static_cast<std::size_t>(whole.numel()), 41),
             dy = random_values(static_cast<std::size_t>(whole.numel()), 42);
  nn::batch_norm<float, dist::cpu> bn{{.channels = 3}, 5};
  auto r = nn::local();
  const auto y = bn.forward(r, dist::tensor<float, dist::cpu>{whole, x});
  bn.zero_grad();
  const auto dx = bn.backward(r, dist::tensor<float, dist::cpu>{whole, dy});
  const auto grads = gradients_of(bn);

  dist::mirrored_strategy<dist::cuda> s{dist::cuda_replicas(2), {}, dist::cuda_collective_engine::cuda_peer};
  auto sbn = s.mirror([](auto& d) { return nn::sync_batch_norm<float, dist::cuda>{{.channels = 3}, 5, d}; });
  const auto per = static_cast<std::size_t>(half.numel());
  auto outs = s.run(
      [&](dist::replica auto& rg, nn::sync_batch_norm<float, dist::cuda>& layer) {
        const auto off = static_cast<std::ptrdiff_t>(per) * rg.replica_id();
        const auto xg =
            dist::tensor<float, dist::cuda>::from_host(half, std::span<const float>(x.data() + off, per), rg.device());
        const auto dyg =
            dist::tensor<float, dist::cuda>::from_host(half, std::span<const float>(dy.data() + off, per), rg.device());
        auto yg = on_host(layer.forward(rg, xg));
        layer.zero_grad();
        auto dxg = on_host(layer.backward(rg, dyg));
        layer.for_each_parameter([&](auto, auto grad) { rg.all_reduce(dist::reduce_op::sum, grad); });
        return std::pair{std::move(yg), std::move(dxg)};
      },
      sbn);
  std::vector<float> gy, gdx;
  for (const auto& [yr, dxr] : outs) {
    gy.insert(gy.end(), yr.begin(), yr.end());
    gdx.insert(gdx.end(), dxr.begin(), dxr.end());
  }
  check_close(on_host(y), gy, "sync_batch_norm output");
  check_close(on_host(dx), gdx, "sync_batch_norm input gradient");
  const auto gg = gradients_of(sbn[0]);
  for (std::size_t p = 0; p < grads.size(); ++p)
    check_close(grads[p], gg[p], "sync_batch_norm gradient " + std::to_string(p));
}

// A GPU model's digest (verify_mirrored, nn::parameter_digest) reads its parameters through the host:
// equal copies agree, a GPU model and a CPU model from one seed have the same digest, and a changed
// copy is caught.
BOOST_AUTO_TEST_CASE(a_gpu_models_digest_reads_its_parameters_through_the_host) {
  const cyclegan::discriminator_options o{.channels = 1, .filters = 4, .layers = 2};
  dist::mirrored_strategy<dist::cuda> s{dist::cuda_replicas(2), {}, dist::cuda_collective_engine::cuda_peer};
  auto m = s.mirror([&](auto& d) { return cyclegan::make_discriminator(o, 3, d); });
  s.verify_mirrored(m);
  auto cpu_model = cyclegan::make_discriminator(o, 3);
  BOOST_TEST(nn::parameter_digest(m[0]) == nn::parameter_digest(cpu_model));
  bool first = true;
  m[1].for_each_parameter([&](auto value, auto) {
    if (!std::exchange(first, false)) return;
    dist::detail::cuda_check(cudaMemset(value.data(), 0, value.size_bytes()), "cudaMemset (test)");
  });
  BOOST_CHECK_THROW(s.verify_mirrored(m), dist::mirrored_divergence);
}

// A GPU model's state crosses to the host and between replicas whole: a checkpoint section written
// by a GPU model loads into the same model on the CPU and back (parameters and batch norm's running
// statistics), and a broadcast between two replicas copies the parameters into the other replica's
// own memory, after which both replicas compute what the CPU model computes.
BOOST_AUTO_TEST_CASE(a_gpu_models_state_crosses_devices_and_replicas) {
  const cyclegan::discriminator_options o{.channels = 1, .filters = 4, .layers = 2, .norm = cyclegan::norm_kind::batch};
  dist::mirrored_strategy<dist::cuda> s{dist::cuda_replicas(2), {}, dist::cuda_collective_engine::cuda_peer};
  auto m = s.mirror([&](auto& d) { return cyclegan::make_discriminator(o, 3, d); });
  auto cpu_model = cyclegan::make_discriminator(o, 3);
  auto other_cpu = cyclegan::make_discriminator(o, 4);  // other weights
  other_cpu.for_each_buffer([](std::span<double> b) { std::fill(b.begin(), b.end(), 0.25); });

  // GPU -> archive -> CPU: the same digest as the GPU copy (parameters and buffers).
  dist::checkpoint::archive from_gpu;
  from_gpu.put_model("d", m[0]);
  from_gpu.get_model("d", other_cpu);
  BOOST_TEST(nn::parameter_digest(other_cpu) == nn::parameter_digest(m[0]));
  BOOST_TEST(dist::detail::digest_model(other_cpu).state() == dist::detail::digest_model(m[0]).state());

  // CPU -> archive -> GPU replica 1: replica 1 now differs from replica 0 by exactly that.
  auto changed = cyclegan::make_discriminator(o, 5);
  changed.for_each_buffer([](std::span<double> b) { std::fill(b.begin(), b.end(), 0.5); });
  dist::checkpoint::archive from_cpu;
  from_cpu.put_model("d", changed);
  from_cpu.get_model("d", m[1]);
  BOOST_TEST(dist::detail::digest_model(m[1]).state() == dist::detail::digest_model(changed).state());
  BOOST_CHECK_THROW(s.verify_mirrored(m), dist::mirrored_divergence);

  // Replica 0's state broadcast: both copies equal again, and each still computes on its own
  // replica what the CPU model computes.
  s.broadcast(m, 0);
  s.verify_mirrored(m);
  const shape in = shape::nchw(2, 1, 16, 16);
  const auto x = random_values(static_cast<std::size_t>(in.numel()), 9);
  auto r = nn::local();
  const auto expected = cpu_model.forward(r, dist::tensor<float, dist::cpu>{in, x});
  auto outputs = s.run(
      [&](auto& rg, auto& model) {
        const auto xg = dist::tensor<float, dist::cuda>::from_host(in, std::span<const float>(x), rg.device());
        return model.forward(rg, xg).to_vector();
      },
      m);
  for (const auto& got : outputs)
    check_close(std::vector<float>(expected.begin(), expected.end()), got, "forward after broadcast");
}

// Input batches go up through the thread's pinned staging: each upload takes the host values at the
// call (the host buffer is overwritten right after), three in a row cycle its two buffers, and the
// replica's work sees every one in order.
BOOST_AUTO_TEST_CASE(staged_uploads_take_the_values_at_the_call) {
  dist::one_device_strategy<dist::cuda> gpu;
  const shape s = shape::nchw(2, 3, 5, 5);
  gpu.run([&](dist::replica auto& r) {
    dist::tensor<float, dist::cpu> host{s};
    std::vector<dist::tensor<float, dist::cuda>> up;
    for (int k = 0; k < 3; ++k) {
      host.fill(static_cast<float>(k + 1));
      up.push_back(dist::tensor<float, dist::cuda>::staged_from_host(host, r.device()));
    }
    host.fill(-1.0f);
    for (int k = 0; k < 3; ++k) {
      const auto got = up[static_cast<std::size_t>(k)].to_vector();
      BOOST_TEST_REQUIRE(got.size() == host.size());
      BOOST_TEST(std::all_of(got.begin(), got.end(), [&](float v) { return v == static_cast<float>(k + 1); }),
                 "upload " << k << " does not hold the values of its call");
    }
  });
}

BOOST_AUTO_TEST_CASE(losses_match_the_cpu) {
  const shape s = shape::nchw(3, 1, 7, 7);
  const auto p = random_values(static_cast<std::size_t>(s.numel()), 1, 3.0f),
             t = random_values(static_cast<std::size_t>(s.numel()), 2);
  const dist::tensor<float, dist::cpu> pc{s, p}, tc{s, t};
  auto r = nn::local();
  const auto mse = nn::mse(r, pc, tc, 6), l1 = nn::l1(r, pc, tc, 6), bce = nn::bce_with_logits(r, pc, tc, 6);
  dist::one_device_strategy<dist::cuda> gpu;
  gpu.run([&](dist::replica auto& rg) {
    const auto pg = dist::tensor<float, dist::cuda>::from_host(s, std::span<const float>(p), rg.device());
    const auto tg = dist::tensor<float, dist::cuda>::from_host(s, std::span<const float>(t), rg.device());
    const auto gm = nn::mse(rg, pg, tg, 6), gl = nn::l1(rg, pg, tg, 6), gb = nn::bce_with_logits(rg, pg, tg, 6);
    BOOST_TEST(gm.value == mse.value, boost::test_tools::tolerance(1e-5f));
    BOOST_TEST(gl.value == l1.value, boost::test_tools::tolerance(1e-5f));
    BOOST_TEST(gb.value == bce.value, boost::test_tools::tolerance(1e-5f));
    check_close(on_host(mse.grad), on_host(gm.grad), "mse gradient");
    check_close(on_host(l1.grad), on_host(gl.grad), "l1 gradient");
    check_close(on_host(bce.grad), on_host(gb.grad), "bce_with_logits gradient");
  });
}

// A loss left on the device, made in every step, queues its work on the replica's stream and
// returns at once: nothing in it waits for the device (its zero-filled outputs included), so the
// host keeps queueing the step's work while the GPU computes.
BOOST_AUTO_TEST_CASE(losses_on_the_device_queue_their_work_without_waiting) {
  const shape s = shape::nchw(2, 1, 8, 8);
  const auto p = random_values(static_cast<std::size_t>(s.numel()), 3, 3.0f),
             t = random_values(static_cast<std::size_t>(s.numel()), 4);
  const dist::tensor<float, dist::cpu> pc{s, p}, tc{s, t};
  auto r = nn::local();
  const auto mse = nn::mse(r, pc, tc, 2), l1 = nn::l1(r, pc, tc, 2);
  dist::one_device_strategy<dist::cuda> gpu;
  gpu.run([&](dist::replica auto& rg) {
    const auto pg = dist::tensor<float, dist::cuda>::from_host(s, std::span<const float>(p), rg.device());
    const auto tg = dist::tensor<float, dist::cuda>::from_host(s, std::span<const float>(t), rg.device());
    dt::spin(rg.device().stream(), std::chrono::milliseconds(500));
    const auto gm = nn::mse(rg, pg, tg, 2, nn::value_on_device);
    const auto gl = nn::l1(rg, pg, tg, 2, nn::value_on_device);
    BOOST_TEST(!dist::detail::stream_idle(rg.device().stream(), rg.device().index()),
               "the losses returned while the stream was still busy");
    BOOST_TEST(gm.host_value() == mse.value, boost::test_tools::tolerance(1e-5f));
    BOOST_TEST(gl.host_value() == l1.value, boost::test_tools::tolerance(1e-5f));
    check_close(on_host(mse.grad), on_host(gm.grad), "mse gradient");
    check_close(on_host(l1.grad), on_host(gl.grad), "l1 gradient");
  });
}

BOOST_AUTO_TEST_CASE(adam_steps_match_the_cpu) {
  auto make = [](auto d) { return nn::linear<float, decltype(d)>{{.in_features = 13, .out_features = 5}, 4, d}; };
  auto cpu_model = make(dist::cpu{});
  dist::optim::adam<float> cpu_opt{{.lr = 1e-2}};
  dist::one_device_strategy<dist::cuda> gpu;
  auto gpu_model = make(gpu.device());
  dist::optim::adam<float> gpu_opt{{.lr = 1e-2}};
  const shape in{4, 13};
  auto r = nn::local();
  for (int step = 0; step < 3; ++step) {
    const auto x = random_values(static_cast<std::size_t>(in.numel()), 30 + static_cast<std::uint32_t>(step));
    const dist::tensor<float, dist::cpu> xc{in, x};
    cpu_model.zero_grad();
    const auto y = cpu_model.forward(r, xc);
    (void)cpu_model.backward(r, y);
    cpu_opt.step(r, cpu_model);
    gpu.run([&](dist::replica auto& rg) {
      const auto xg = dist::tensor<float, dist::cuda>::from_host(in, std::span<const float>(x), rg.device());
      gpu_model.zero_grad();
      const auto yg = gpu_model.forward(rg, xg);
      (void)gpu_model.backward(rg, yg);
      gpu_opt.step(rg, gpu_model);
    });
  }
  const auto cv = values_of(cpu_model), gv = values_of(gpu_model);
  for (std::size_t p = 0; p < cv.size(); ++p)
    check_close(cv[p], gv[p], "parameter " + std::to_string(p) + " after 3 Adam steps");
}

namespace {

// Sets every parameter value of a model, wherever it lives, from host values in enumeration order.
template <class M>
void set_values(M& m, const std::vector<std::vector<float>>& values) {
  std::size_t i = 0;
  m.for_each_parameter([&](auto value, auto) {
    BOOST_TEST_REQUIRE(values.at(i).size() == value.size());
    if (!value.empty())
      dist::detail::cuda_check(cudaMemcpy(value.data(), values[i].data(), value.size_bytes(), cudaMemcpyDefault),
                               "cudaMemcpy (test)");
    ++i;
  });
  dist::detail::cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (test)");  // before any stream reads them
}

// The small model and training step of the optimiser state tests: a linear layer whose loss
// gradient is its output, on input `step` of a fixed sequence.
auto make_linear(auto d) { return nn::linear<float, decltype(d)>{{.in_features = 13, .out_features = 5}, 4, d}; }
const shape linear_input{4, 13};
std::vector<float> input_of(int step) {
  return random_values(static_cast<std::size_t>(linear_input.numel()), 60 + static_cast<std::uint32_t>(step));
}
template <class M, class O>
void cpu_step(M& model, O& opt, int step) {
  auto r = nn::local();
  const dist::tensor<float, dist::cpu> x{linear_input, input_of(step)};
  model.zero_grad();
  const auto y = model.forward(r, x);
  (void)model.backward(r, y);
  opt.step(r, model);
}
// The same step on a GPU replica.
template <class R, class M, class O>
void gpu_step(R& rg, M& model, O& opt, int step) {
  const auto x = input_of(step);
  const auto xg = dist::tensor<float, dist::cuda>::from_host(linear_input, std::span<const float>(x), rg.device());
  model.zero_grad();
  const auto yg = model.forward(rg, xg);
  (void)model.backward(rg, yg);
  opt.step(rg, model);
}

}  // namespace

// Adam's moments live on the GPU of the model they step; a checkpoint of them reads them through the
// host, in the CPU's format: taken after GPU steps, it resumes a CPU model and a GPU model alike, and
// a CPU run's resumes a GPU model; every run matches the CPU-only one.
BOOST_AUTO_TEST_CASE(an_adam_checkpoint_taken_on_a_gpu_loads_on_either_device) {
  const dist::optim::adam_options o{.lr = 1e-2, .weight_decay = 1e-3};
  auto reference = make_linear(dist::cpu{});
  dist::optim::adam<float> reference_opt{o};
  std::vector<std::vector<float>> reference_at_3;
  std::string reference_state_at_3;
  for (int t = 0; t < 5; ++t) {
    if (t == 3) {
      reference_at_3 = values_of(reference);
      std::ostringstream os;
      reference_opt.save(os);
      reference_state_at_3 = std::move(os).str();
    }
    cpu_step(reference, reference_opt, t);
  }

  dist::one_device_strategy<dist::cuda> gpu;
  auto gpu_model = make_linear(gpu.device());
  dist::optim::adam<float> gpu_opt{o};
  for (int t = 0; t < 3; ++t) gpu.run([&](dist::replica auto& rg) { gpu_step(rg, gpu_model, gpu_opt, t); });
  dist::checkpoint::archive a;
  a.put_state("adam", gpu_opt);
  std::stringstream saved;
  gpu_opt.save(saved);
  const auto at_3 = values_of(gpu_model);
  BOOST_TEST_REQUIRE((!at_3.empty() && at_3.size() == reference_at_3.size()));
  check_close(reference_at_3.front(), at_3.front(), "weights after 3 steps on the GPU");

  // Into an optimiser stepping the CPU model.
  auto cpu_model = make_linear(dist::cpu{});
  set_values(cpu_model, at_3);
  dist::optim::adam<float> cpu_opt;
  a.get_state("adam", cpu_opt);
  BOOST_TEST(cpu_opt.steps() == 3);
  BOOST_TEST(cpu_opt.state_digest() == gpu_opt.state_digest());
  for (int t = 3; t < 5; ++t) cpu_step(cpu_model, cpu_opt, t);

  // Into one stepping the GPU model (through a stream this time), in place of the optimiser that
  // wrote it.
  dist::optim::adam<float> gpu_loaded;
  gpu_loaded.load(saved);
  BOOST_TEST(gpu_loaded.state_digest() == gpu_opt.state_digest());
  for (int t = 3; t < 5; ++t) gpu.run([&](dist::replica auto& rg) { gpu_step(rg, gpu_model, gpu_loaded, t); });

  // And the CPU run's checkpoint into a GPU model.
  auto from_cpu = make_linear(gpu.device());
  set_values(from_cpu, reference_at_3);
  dist::optim::adam<float> from_cpu_opt;
  std::istringstream is(reference_state_at_3);
  from_cpu_opt.load(is);
  for (int t = 3; t < 5; ++t) gpu.run([&](dist::replica auto& rg) { gpu_step(rg, from_cpu, from_cpu_opt, t); });

  const auto want = values_of(reference);
  const auto on_cpu = values_of(cpu_model), on_gpu = values_of(gpu_model), resumed = values_of(from_cpu);
  for (std::size_t p = 0; p < want.size(); ++p) {
    check_close(want[p], on_cpu[p], "parameter " + std::to_string(p) + ": GPU checkpoint resumed on the CPU");
    check_close(want[p], on_gpu[p], "parameter " + std::to_string(p) + ": GPU checkpoint resumed on the GPU");
    check_close(want[p], resumed[p], "parameter " + std::to_string(p) + ": CPU checkpoint resumed on the GPU");
  }
  BOOST_TEST(gpu_loaded.steps() == 5);
}

// A copy of an optimiser holds its state through the host and moves it to the GPU replica that steps
// it: replica 0 steps alone, the strategy broadcasts its optimiser to replica 1 (copy assignment), and
// both replicas, on their own streams, go on to match the CPU-only run.
BOOST_AUTO_TEST_CASE(a_copied_adam_steps_a_model_on_another_replica) {
  const dist::optim::adam_options o{.lr = 1e-2};
  auto reference = make_linear(dist::cpu{});
  dist::optim::adam<float> reference_opt{o};
  for (int t = 0; t < 5; ++t) cpu_step(reference, reference_opt, t);

  dist::mirrored_strategy<dist::cuda> s{dist::cuda_replicas(2), {}, dist::cuda_collective_engine::cuda_peer};
  auto models = s.mirror([](auto& d) { return make_linear(d); });
  auto opts = s.mirror([&](auto&) { return dist::optim::adam<float>{o}; });
  for (int t = 0; t < 2; ++t)
    s.run(
        [&](dist::replica auto& rg, nn::linear<float, dist::cuda>& model, dist::optim::adam<float>& opt) {
          if (rg.replica_id() == 0) gpu_step(rg, model, opt, t);
        },
        models, opts);
  // Replica 1 takes replica 0's parameters and optimiser.
  set_values(models[1], values_of(models[0]));
  s.broadcast(opts);
  BOOST_TEST(opts[1].steps() == 2);
  BOOST_TEST(opts[1].state_digest() == opts[0].state_digest());
  for (int t = 2; t < 5; ++t)
    s.run([&](dist::replica auto& rg, nn::linear<float, dist::cuda>& model,
              dist::optim::adam<float>& opt) { gpu_step(rg, model, opt, t); },
          models, opts);

  const auto want = values_of(reference), first = values_of(models[0]), second = values_of(models[1]);
  for (std::size_t p = 0; p < want.size(); ++p) {
    check_close(want[p], first[p], "parameter " + std::to_string(p) + " on replica 0");
    check_close(want[p], second[p], "parameter " + std::to_string(p) + " on replica 1, stepped by the copy");
  }
  BOOST_TEST(opts[1].steps() == 5);
}

BOOST_AUTO_TEST_SUITE_END()

// --- The per-element passes and cuDNN's engine choice (suite `passes`) ----------------------------
// The GPU engine's side of the launch shape (label `gpu`; exit 77, skipped, without a device): the
// per-element reflection padding has the CPU's bits on the GPU too; segmented sums cut into chunks
// match the CPU's to double rounding and repeat bit for bit; cuDNN convolutions with
// compute_options::deterministic on and off both match the CPU reference to float32 rounding (every
// element within the bound of float32 sums in any order, summation_bound.hpp), deterministic ones
// repeat bit for bit, and no plan's workspace passes conv_workspace_limit.
namespace passes_case {

namespace dist = distribute;
namespace kernels = distribute::nn::detail::kernels;
namespace sb = distribute::test::summation_bound;
using device_tensor = dist::tensor<float, dist::cuda>;

namespace {

std::vector<float> random_values(std::int64_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = d(gen);
  return v;
}
device_tensor upload(const std::vector<float>& v) {
  return device_tensor::from_host(dist::shape{static_cast<std::int64_t>(v.size())}, std::span<const float>(v));
}
bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}
std::vector<double> magnitudes(const std::vector<float>& v) {
  std::vector<double> m(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) m[i] = std::abs(static_cast<double>(v[i]));
  return m;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(passes)

BOOST_AUTO_TEST_CASE(reflection_padding_has_the_cpu_bits) {
  dist::engine<dist::cuda> gpu{};
  dist::engine<dist::cpu> cpu{};
  // The paper's 7x7 padding of the generator's first layer and the residual blocks' 3x3 one.
  for (const auto& [planes, h, w, p] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>{3, 256, 256, 3},
        {256, 64, 64, 1},
        {64, 256, 256, 3},
        {5, 3, 3, 2}}) {
    const std::int64_t ph = h + 2 * p, pw = w + 2 * p;
    const auto x = random_values(planes * h * w, 1), dy = random_values(planes * ph * pw, 2);
    std::vector<float> y(dy.size()), dx(x.size());
    cpu.for_each_in_segments(planes, ph * pw, kernels::reflect_pad<float>{x.data(), y.data(), h, w, p});
    cpu.for_each_in_segments(planes, h * w, kernels::reflect_pad_backward<float>{dy.data(), dx.data(), h, w, p});
    const auto dx_in = upload(x), ddy = upload(dy);
    device_tensor dy_out(dist::shape{planes * ph * pw}), dx_out(dist::shape{planes * h * w});
    gpu.for_each_in_segments(planes, ph * pw, kernels::reflect_pad<float>{dx_in.data(), dy_out.data(), h, w, p});
    gpu.for_each_in_segments(planes, h * w, kernels::reflect_pad_backward<float>{ddy.data(), dx_out.data(), h, w, p});
    BOOST_TEST_CONTEXT(planes << " planes " << h << "x" << w << " pad " << p) {
      BOOST_TEST(same_bits(dy_out.to_vector(), y));
      BOOST_TEST(same_bits(dx_out.to_vector(), dx));
    }
  }
}

BOOST_AUTO_TEST_CASE(segmented_sums_in_chunks_match_the_cpu_and_repeat) {
  dist::engine<dist::cuda> gpu{};
  for (const auto& [segments, length] : {std::pair<std::int64_t, std::int64_t>{1, 3 * 256 * 256},
                                         {64, 256 * 256},
                                         {256, 16384},
                                         {7, 8193},
                                         {1000, 10}}) {
    const auto x = random_values(segments * length, 3);
    std::vector<double> want(static_cast<std::size_t>(segments));
    dist::serial_engine{}.segmented_sum(segments, length, kernels::value_of<float>{x.data(), length}, want.data());
    const auto dx = upload(x);
    dist::tensor<double, dist::cuda> sums(dist::shape{segments});
    gpu.segmented_sum(segments, length, kernels::value_of<float>{dx.data(), length}, sums.data());
    const auto first = sums.to_vector();
    gpu.segmented_sum(segments, length, kernels::value_of<float>{dx.data(), length}, sums.data());
    const auto second = sums.to_vector();
    BOOST_TEST_CONTEXT(
        segments << " x " << length
                 << (dist::detail::plan_segmented_sum(segments, length).two_stage() ? " (chunks)" : "")) {
      BOOST_TEST(std::memcmp(first.data(), second.data(), first.size() * sizeof(double)) == 0);
      double worst = 0;
      for (std::size_t s = 0; s < want.size(); ++s)
        worst = std::max(worst, std::abs(first[s] - want[s]) / std::max(std::abs(want[s]), 1.0));
      BOOST_TEST(worst <= 1e-12);
    }
  }
}

#if DISTRIBUTE_HAS_CUDNN
// The paper generator's residual convolution (256 channels at 64x64) and its first 7x7 one, each pass
// with deterministic engines and with any engine.
BOOST_AUTO_TEST_CASE(convolutions_in_both_modes_match_the_cpu) {
  const dist::conv_geometry shapes[] = {dist::conv_geometry::of(1, 256, 66, 66, 256, 3, 1, 0),
                                        dist::conv_geometry::of(1, 3, 262, 262, 64, 7, 1, 0)};
  dist::engine<dist::cpu> cpu{dist::compute_options{.reference = true}};
  for (const dist::conv_geometry& g : shapes)
    for (const bool deterministic : {true, false}) {
      dist::detail::owned_stream stream(0);
      const dist::compute_options o{.deterministic = deterministic};
      dist::detail::cudnn_convolutions conv(0, stream.get(), o);
      const auto x = random_values(g.input_size(), 4), w = random_values(g.weight_size(), 5),
                 dy = random_values(g.output_size(), 6);
      std::vector<float> y(static_cast<std::size_t>(g.output_size())), dx(static_cast<std::size_t>(g.input_size())),
          dw(static_cast<std::size_t>(g.weight_size()), 0.0f);
      cpu.conv_forward(g, x.data(), w.data(), static_cast<const float*>(nullptr), y.data());
      cpu.conv_backward_data(g, dy.data(), w.data(), dx.data());
      cpu.conv_backward_weights(g, x.data(), dy.data(), dw.data(), static_cast<float*>(nullptr));
      // Each output's sum |p_i|: the same convolutions of the magnitudes, in double. The GPU and the
      // CPU sum in float32, in orders of their own: each within summation_bound.hpp's bound of any
      // order, so the two within the sum of both (its K: the products an output sums, at most).
      const auto ax = magnitudes(x), aw = magnitudes(w), ady = magnitudes(dy);
      std::vector<double> ay(y.size()), adx(dx.size()), adw(dw.size(), 0.0);
      cpu.conv_forward(g, ax.data(), aw.data(), static_cast<const double*>(nullptr), ay.data());
      cpu.conv_backward_data(g, ady.data(), aw.data(), adx.data());
      cpu.conv_backward_weights(g, ax.data(), ady.data(), adw.data(), static_cast<double*>(nullptr));
      const dist::cuda d = dist::cuda{0}.on(stream.get());
      const auto gx = device_tensor::from_host(dist::shape{g.input_size()}, std::span<const float>(x), d);
      const auto gw = device_tensor::from_host(dist::shape{g.weight_size()}, std::span<const float>(w), d);
      const auto gdy = device_tensor::from_host(dist::shape{g.output_size()}, std::span<const float>(dy), d);
      device_tensor gy(dist::shape{g.output_size()}, d), gdx(dist::shape{g.input_size()}, d),
          gdw(dist::shape{g.weight_size()}, d);
      gdw.fill(0.0f);
      conv.forward(g, gx.data(), gw.data(), nullptr, gy.data());
      conv.backward_data(g, gdy.data(), gw.data(), gdx.data());
      const auto dx_first = gdx.to_vector();
      conv.backward_weights(g, gx.data(), gdy.data(), gdw.data(), nullptr);
      const auto dw_first = gdw.to_vector();
      BOOST_TEST_CONTEXT(g.to_string() << (deterministic ? " deterministic" : " any engine")) {
        const std::int64_t kk = g.kernel * g.kernel;
        const sb::verdict vy = sb::compare(gy.to_vector(), y, ay, sb::between(g.in_channels * kk));
        const sb::verdict vdx = sb::compare(dx_first, dx, adx, sb::between(g.out_channels * kk));
        const sb::verdict vdw = sb::compare(dw_first, dw, adw, sb::between(g.batch * g.out_height * g.out_width));
        BOOST_TEST(vy.within(), "y: " << vy.describe());
        BOOST_TEST(vdx.within(), "dx: " << vdx.describe());
        BOOST_TEST(vdw.within(), "dw: " << vdw.describe());
        BOOST_TEST_MESSAGE("worst difference over its bound: y " << vy.worst_ratio << ", dx " << vdx.worst_ratio
                                                                 << ", dw " << vdw.worst_ratio);
        if (deterministic) {
          conv.backward_data(g, gdy.data(), gw.data(), gdx.data());
          gdw.fill(0.0f);
          conv.backward_weights(g, gx.data(), gdy.data(), gdw.data(), nullptr);
          BOOST_TEST(same_bits(gdx.to_vector(), dx_first));
          BOOST_TEST(same_bits(gdw.to_vector(), dw_first));
        }
        // The workspace (cuDNN's, and the weight gradient's scratch behind it) within the limit.
        if (conv.workspace_limit_exceeded().empty())
          BOOST_TEST(conv.workspace_bytes() <=
                     o.conv_workspace_limit + 256 + static_cast<std::size_t>(g.weight_size()) * sizeof(float));
        for (const auto& why : conv.workspace_limit_exceeded()) BOOST_TEST_MESSAGE("over the workspace limit: " << why);
      }
    }
}
#endif

BOOST_AUTO_TEST_SUITE_END()

}  // namespace passes_case
