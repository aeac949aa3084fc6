// The GPU engine's cuDNN convolutions (engine/detail/cudnn_conv.cuh) against the CPU engine's
// reference (im2col + Eigen), suite `cudnn`: every convolution the CycleGAN example runs, at small
// sizes, in its three passes (forward with and without a bias, the data gradient, the weight and
// bias gradients added to non-zero values), in float32 (within 1e-4 relative) and with TF32 allowed
// (within 1e-2 relative: TF32 keeps 10 bits of mantissa in the products). Relative to each value,
// with a floor of a tenth of the largest magnitude, so that values that cancel to near zero are
// judged on the scale of their tensor. Also: the plan cache, pointers off a 16-byte boundary, an empty
// batch, and the errors of a geometry cuDNN cannot compute.
//
// It includes the cudnn-frontend, and compiles in over a minute and a half on a 2-core machine (so
// does every file that includes the GPU engine). Without cuDNN in the build, the suite holds one
// case, reported as skipped.

#include "gpu_test_support.cuh"

#include <distribute/config.hpp>
#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/cpu.hpp>
#if DISTRIBUTE_HAS_CUDNN
#  include <distribute/engine/detail/cudnn_conv.cuh>
#endif

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace dist = distribute;
namespace dt = distribute::test;

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

// Every pass of `g` on the GPU against the CPU reference.
void check_against_reference(const named_geometry& ng, bool tf32, double tolerance) {
  const dist::conv_geometry& g = ng.g;
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  dist::detail::cudnn_convolutions gpu(0, stream.get(), tf32);
  dist::engine<dist::cpu> cpu{dist::engine_options{.reference = true}};

  const auto x = random_values(g.input_size(), 1);
  const auto w = random_values(g.weight_size(), 2);
  const auto bias = random_values(g.out_channels, 3);
  const auto dy = random_values(g.output_size(), 4);
  const auto dw0 = random_values(g.weight_size(), 5);
  const auto db0 = random_values(g.out_channels, 6);
  const auto dx_garbage = random_values(g.input_size(), 7);  // backward data overwrites

  const auto dx_ = upload(x, d), dw_ = upload(w, d), dbias = upload(bias, d), ddy = upload(dy, d);
  const std::string where = std::string(ng.name) + " " + g.to_string() + (tf32 ? " (TF32)" : " (float32)");

  for (const bool with_bias : {false, true}) {
    std::vector<float> want(static_cast<std::size_t>(g.output_size()));
    cpu.conv_forward(g, x.data(), w.data(), with_bias ? bias.data() : nullptr, want.data());
    device_tensor y(dist::shape{g.output_size()}, d);
    gpu.forward(g, dx_.data(), dw_.data(), with_bias ? dbias.data() : nullptr, y.data());
    const std::string err = compare(y.to_vector(), want, tolerance);
    BOOST_TEST(err.empty(), where << ": forward" << (with_bias ? " with a bias: " : ": ") << err);
  }
  {
    std::vector<float> want(static_cast<std::size_t>(g.input_size()));
    cpu.conv_backward_data(g, dy.data(), w.data(), want.data());
    auto dx = upload(dx_garbage, d);
    gpu.backward_data(g, ddy.data(), dw_.data(), dx.data());
    const std::string err = compare(dx.to_vector(), want, tolerance);
    BOOST_TEST(err.empty(), where << ": backward data: " << err);
  }
  for (const bool with_db : {true, false}) {
    std::vector<float> want_dw = dw0, want_db = db0;
    cpu.conv_backward_weights(g, x.data(), dy.data(), want_dw.data(), with_db ? want_db.data() : nullptr);
    auto dw = upload(dw0, d), db = upload(db0, d);
    gpu.backward_weights(g, dx_.data(), ddy.data(), dw.data(), with_db ? db.data() : nullptr);
    const std::string err_w = compare(dw.to_vector(), want_dw, tolerance);
    BOOST_TEST(err_w.empty(), where << ": backward weights (dw +=)" << (with_db ? ": " : " without db: ") << err_w);
    const std::string err_b = compare(db.to_vector(), want_db, tolerance);
    BOOST_TEST(err_b.empty(), where << ": backward weights (db " << (with_db ? "+=): " : "untouched): ") << err_b);
  }
  // forward, forward with a bias, backward data, backward weights.
  BOOST_TEST(gpu.cached_plans() == 4u, where);
  BOOST_TEST((cudaGetLastError() == cudaSuccess));
}

}  // namespace

BOOST_AUTO_TEST_CASE(every_pass_of_the_cyclegan_convolutions_matches_the_cpu_in_float32) {
  for (const auto& ng : cyclegan_geometries()) check_against_reference(ng, /*tf32=*/false, 1e-4);
}

BOOST_AUTO_TEST_CASE(every_pass_of_the_cyclegan_convolutions_matches_the_cpu_with_tf32) {
  for (const auto& ng : cyclegan_geometries()) check_against_reference(ng, /*tf32=*/true, 1e-2);
}

BOOST_AUTO_TEST_CASE(plans_are_built_once_per_geometry_and_pass) {
  dist::detail::owned_stream stream(0);
  const dist::cuda d = dist::cuda{0}.on(stream.get());
  dist::detail::cudnn_convolutions gpu(0, stream.get(), false);
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
  BOOST_TEST(y.to_vector() == first);  // the same plan, the same bits
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
  dist::detail::cudnn_convolutions gpu(0, stream.get(), false);
  dist::engine<dist::cpu> cpu{dist::engine_options{.reference = true}};
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
  dist::detail::cudnn_convolutions gpu(0, stream.get(), false);
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
  dist::detail::cudnn_convolutions gpu(0, stream.get(), false);
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
