// safetensors files of models on a GPU: a model's file is the same bytes whichever device holds it,
// and a file loads into a GPU model bit for bit (through the host, with the copies the tensor type
// offers). Its own binary, so that only it needs nlohmann's JSON library; skipped (exit code 77)
// without a device, unless DISTRIBUTE_REQUIRE_GPU=1.

#define BOOST_TEST_MODULE distribute_gpu_interop
#define BOOST_TEST_NO_MAIN
#include <boost/test/unit_test.hpp>

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/tensor/tensor.cuh>
#include <distribute/nn/batch_norm.hpp>
#include <distribute/nn/conv2d.hpp>
#include <distribute/nn/conv_transpose2d.hpp>
#include <distribute/nn/instance_norm.hpp>
#include <distribute/nn/safetensors.hpp>
#include <distribute/nn/sequential.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <vector>

#include <unistd.h>

namespace dist = distribute;
namespace nn = distribute::nn;

namespace {

template <class D>
auto make_model(std::uint64_t seed, const D& device = {}) {
  return nn::sequential{
      nn::conv2d<float, D>{
          {.in_channels = 2, .out_channels = 4, .kernel = 3, .padding = 1, .pad_mode = nn::padding_mode::reflect},
          seed + 1,
          device},
      nn::batch_norm<float, D>{{.channels = 4}, seed + 2, device},
      nn::conv_transpose2d<float, D>{
          {.in_channels = 4, .out_channels = 3, .stride = 2, .padding = 1, .output_padding = 1}, seed + 3, device},
      nn::instance_norm<float, D>{{.channels = 3, .affine = true}, seed + 4, device}};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(interop)

BOOST_AUTO_TEST_CASE(a_gpu_model_round_trips_bit_for_bit) {
  const dist::cuda gpu{0};
  auto on_gpu = make_model<dist::cuda>(1, gpu);
  auto on_cpu = make_model<dist::cpu>(1);
  const auto bytes = nn::safetensors_bytes(on_gpu);
  // Initial values are drawn on the host from the seed: the two models hold the same weights, so
  // their files are the same bytes.
  BOOST_TEST((bytes == nn::safetensors_bytes(on_cpu)));

  auto other = make_model<dist::cuda>(9, gpu);
  BOOST_TEST((nn::safetensors_bytes(other) != bytes));
  nn::load_safetensors(other, std::span<const std::byte>(bytes));
  BOOST_TEST((nn::safetensors_bytes(other) == bytes));

  // Through a file, from the GPU to the CPU and back.
  const auto dir = std::filesystem::temp_directory_path() / ("distribute_gpu_interop_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  nn::save_safetensors(on_gpu, dir / "m.safetensors");
  auto cpu_copy = make_model<dist::cpu>(5);
  nn::load_safetensors(cpu_copy, dir / "m.safetensors");
  BOOST_TEST((nn::safetensors_bytes(cpu_copy) == bytes));
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(a_refused_file_leaves_the_gpu_model_as_it_was) {
  auto m = make_model<dist::cuda>(1, dist::cuda{0});
  const auto before = nn::safetensors_bytes(m);
  auto bigger = nn::sequential{nn::conv2d<float, dist::cpu>{{.in_channels = 2, .out_channels = 5, .kernel = 3}, 1}};
  const auto wrong = nn::safetensors_bytes(bigger);
  BOOST_CHECK_THROW(nn::load_safetensors(m, std::span<const std::byte>(wrong)), nn::interop_error);
  BOOST_TEST((nn::safetensors_bytes(m) == before));
}

BOOST_AUTO_TEST_SUITE_END()

int main(int argc, char* argv[]) {
  int gpus = 0;
  try {
    gpus = dist::cuda_device_count();
  } catch (const std::exception& e) {  // a driver that is there but unusable is a failure
    std::fprintf(stderr, "distribute_gpu_interop_tests: %s\n", e.what());
    return 1;
  }
  if (gpus == 0) {
    if (const char* v = std::getenv("DISTRIBUTE_REQUIRE_GPU"); v != nullptr && std::string_view(v) == "1") {
      std::fprintf(stderr, "distribute_gpu_interop_tests: no CUDA device is visible, and DISTRIBUTE_REQUIRE_GPU=1\n");
      return 1;
    }
    std::fprintf(stderr, "distribute_gpu_interop_tests: no CUDA device is visible; skipped\n");
    return 77;
  }
  return boost::unit_test::unit_test_main([] { return true; }, argc, argv);
}
