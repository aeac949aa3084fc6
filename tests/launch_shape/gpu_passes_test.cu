// The GPU engine's side of the launch shape (label `gpu`; exit 77, skipped, without a device): the
// per-element reflection padding has the CPU's bits on the GPU too; segmented sums cut into chunks
// match the CPU's to double rounding and repeat bit for bit; cuDNN convolutions with
// engine_options::deterministic on and off both match the CPU reference to float32 rounding,
// deterministic ones repeat bit for bit, and no plan's workspace passes conv_workspace_limit.
#define BOOST_TEST_MODULE distribute_gpu_passes
#define BOOST_TEST_NO_MAIN
#ifndef BOOST_TEST_DYN_LINK
#define BOOST_TEST_DYN_LINK
#endif
#include <boost/test/unit_test.hpp>

#include <distribute/device/cuda.cuh>
#include <distribute/engine/cpu.hpp>
#include <distribute/engine/cuda.cuh>
#include <distribute/engine/detail/segmented_sum_plan.hpp>
#include <distribute/engine/detail/serial.hpp>
#include <distribute/nn/detail/kernels.hpp>
#include <distribute/tensor/cuda_tensor.cuh>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

namespace dist = distribute;
namespace kernels = distribute::nn::detail::kernels;
using device_tensor = dist::tensor<float, dist::cuda>;

int main(int argc, char* argv[]) {
  int gpus = 0;
  try {
    gpus = dist::cuda_device_count();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distribute_gpu_passes_tests: %s\n", e.what());
    return 1;
  }
  if (gpus == 0) {
    if (const char* v = std::getenv("DISTRIBUTE_REQUIRE_GPU"); v != nullptr && std::string(v) == "1") {
      std::fprintf(stderr, "distribute_gpu_passes_tests: no CUDA device is visible, and DISTRIBUTE_REQUIRE_GPU=1\n");
      return 1;
    }
    std::fprintf(stderr, "distribute_gpu_passes_tests: no CUDA device is visible; skipped\n");
    return 77;
  }
  return boost::unit_test::unit_test_main([] { return true; }, argc, argv);
}

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
double worst_relative(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double scale = std::max(std::abs(static_cast<double>(want[i])), 1e-3);
    const double e = std::abs(static_cast<double>(got[i]) - want[i]) / scale;
    if (!(e <= worst)) worst = std::isnan(e) ? INFINITY : e;
  }
  return worst;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(passes)

BOOST_AUTO_TEST_CASE(reflection_padding_has_the_cpu_bits) {
  dist::engine<dist::cuda> gpu{};
  dist::engine<dist::cpu> cpu{};
  // The paper's 7x7 padding of the generator's first layer and the residual blocks' 3x3 one.
  for (const auto& [planes, h, w, p] : {std::tuple<std::int64_t, std::int64_t, std::int64_t, std::int64_t>{3, 256, 256, 3},
                                        {256, 64, 64, 1}, {64, 256, 256, 3}, {5, 3, 3, 2}}) {
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
  for (const auto& [segments, length] : {std::pair<std::int64_t, std::int64_t>{1, 3 * 256 * 256}, {64, 256 * 256},
                                         {256, 16384}, {7, 8193}, {1000, 10}}) {
    const auto x = random_values(segments * length, 3);
    std::vector<double> want(static_cast<std::size_t>(segments));
    dist::detail::serial_engine{}.segmented_sum(segments, length, kernels::value_of<float>{x.data(), length}, want.data());
    const auto dx = upload(x);
    dist::tensor<double, dist::cuda> sums(dist::shape{segments});
    gpu.segmented_sum(segments, length, kernels::value_of<float>{dx.data(), length}, sums.data());
    const auto first = sums.to_vector();
    gpu.segmented_sum(segments, length, kernels::value_of<float>{dx.data(), length}, sums.data());
    const auto second = sums.to_vector();
    BOOST_TEST_CONTEXT(segments << " x " << length << (dist::detail::plan_segmented_sum(segments, length).two_stage() ? " (chunks)" : "")) {
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
  dist::engine<dist::cpu> cpu{dist::engine_options{.reference = true}};
  for (const dist::conv_geometry& g : shapes)
    for (const bool deterministic : {true, false}) {
      dist::detail::owned_stream stream(0);
      const dist::engine_options o{.deterministic = deterministic};
      dist::detail::cudnn_convolutions conv(0, stream.get(), o);
      const auto x = random_values(g.input_size(), 4), w = random_values(g.weight_size(), 5), dy = random_values(g.output_size(), 6);
      std::vector<float> y(static_cast<std::size_t>(g.output_size())), dx(static_cast<std::size_t>(g.input_size())),
          dw(static_cast<std::size_t>(g.weight_size()), 0.0f);
      cpu.conv_forward(g, x.data(), w.data(), static_cast<const float*>(nullptr), y.data());
      cpu.conv_backward_data(g, dy.data(), w.data(), dx.data());
      cpu.conv_backward_weights(g, x.data(), dy.data(), dw.data(), static_cast<float*>(nullptr));
      const dist::cuda d = dist::cuda{0}.on(stream.get());
      const auto gx = device_tensor::from_host(dist::shape{g.input_size()}, std::span<const float>(x), d);
      const auto gw = device_tensor::from_host(dist::shape{g.weight_size()}, std::span<const float>(w), d);
      const auto gdy = device_tensor::from_host(dist::shape{g.output_size()}, std::span<const float>(dy), d);
      device_tensor gy(dist::shape{g.output_size()}, d), gdx(dist::shape{g.input_size()}, d), gdw(dist::shape{g.weight_size()}, d);
      gdw.fill(0.0f);
      conv.forward(g, gx.data(), gw.data(), nullptr, gy.data());
      conv.backward_data(g, gdy.data(), gw.data(), gdx.data());
      const auto dx_first = gdx.to_vector();
      conv.backward_weights(g, gx.data(), gdy.data(), gdw.data(), nullptr);
      const auto dw_first = gdw.to_vector();
      BOOST_TEST_CONTEXT(g.to_string() << (deterministic ? " deterministic" : " any engine")) {
        BOOST_TEST(worst_relative(gy.to_vector(), y) <= 1e-4);
        BOOST_TEST(worst_relative(dx_first, dx) <= 1e-4);
        BOOST_TEST(worst_relative(dw_first, dw) <= 1e-4);
        if (deterministic) {
          conv.backward_data(g, gdy.data(), gw.data(), gdx.data());
          gdw.fill(0.0f);
          conv.backward_weights(g, gx.data(), gdy.data(), gdw.data(), nullptr);
          BOOST_TEST(same_bits(gdx.to_vector(), dx_first));
          BOOST_TEST(same_bits(gdw.to_vector(), dw_first));
        }
        // The workspace (cuDNN's, and the weight gradient's scratch behind it) within the limit.
        if (conv.workspace_limit_exceeded().empty())
          BOOST_TEST(conv.workspace_bytes() <= o.conv_workspace_limit + 256 + static_cast<std::size_t>(g.weight_size()) * sizeof(float));
        for (const auto& why : conv.workspace_limit_exceeded()) BOOST_TEST_MESSAGE("over the workspace limit: " << why);
      }
    }
}
#endif

BOOST_AUTO_TEST_SUITE_END()
