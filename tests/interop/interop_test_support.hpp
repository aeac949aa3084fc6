#pragma once
// Helpers of the interop tests: small models with every kind of state, a temporary directory, and
// the comparison of two models' state bit for bit.

#include <distribute/nn.hpp>
#include <distribute/nn/state_dict.hpp>

#include <boost/test/unit_test.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

namespace distribute::test {

namespace fs = std::filesystem;

struct temp_dir {
  fs::path path;
  temp_dir() {
    static int n = 0;
    path = fs::temp_directory_path() / ("distribute_interop_" + std::to_string(::getpid()) + "_" + std::to_string(n++));
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Conv (reflect and zero padding), batch norm, transposed conv, affine instance norm, a residual
// block, pooling, flatten and linear: every layer with state, and some without.
template <class T>
auto small_model(std::uint64_t seed) {
  using namespace nn;
  return sequential{
      conv2d<T>{{.in_channels = 2,
                 .out_channels = 4,
                 .kernel = 3,
                 .stride = 1,
                 .padding = 1,
                 .pad_mode = padding_mode::reflect},
                seed + 1},
      batch_norm<T>{{.channels = 4}, seed + 2},
      relu<T>{},
      residual_block<T>{4, seed + 3},
      conv_transpose2d<T>{
          {.in_channels = 4, .out_channels = 3, .kernel = 3, .stride = 2, .padding = 1, .output_padding = 1}, seed + 4},
      instance_norm<T>{{.channels = 3, .affine = true}, seed + 5},
      leaky_relu<T>{T(0.2)},
      conv2d<T>{{.in_channels = 3, .out_channels = 2, .kernel = 3, .stride = 2, .padding = 1}, seed + 6},
      avg_pool2d<T>{{.kernel = 2}},
      flatten<T>{},
      linear<T>{{.in_features = 2 * 4 * 4, .out_features = 5}, seed + 7},
      nn::tanh<T>{}};
}

template <class T>
tensor<T> random_input(shape s, std::uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(-1.0, 1.0);
  tensor<T> t{s};
  for (auto& x : t) x = static_cast<T>(d(gen));
  return t;
}

using state_list = std::vector<std::pair<std::string, std::vector<unsigned char>>>;

struct state_collector {
  state_list* out;
  template <class T, class D>
  void parameter(const std::string& name, nn::parameter<T, D>& p) {
    const auto* b = reinterpret_cast<const unsigned char*>(p.value.data());
    out->emplace_back(name, std::vector<unsigned char>(b, b + p.value.size() * sizeof(T)));
  }
  void buffer(const std::string& name, std::span<double> s) {
    const auto* b = reinterpret_cast<const unsigned char*>(s.data());
    out->emplace_back(name, std::vector<unsigned char>(b, b + s.size_bytes()));
  }
};

// Every named tensor's bytes, in order (a CPU model's).
template <class M>
state_list state_bytes(M& model) {
  state_list out;
  nn::for_each_named_state(model, state_collector{&out});
  return out;
}

template <class M>
std::vector<std::string> state_names(M& model) {
  std::vector<std::string> out;
  for (auto& [name, bytes] : state_bytes(model)) out.push_back(name);
  return out;
}

// Runs training-mode forwards so the batch norm's running statistics move off their initial values.
template <class M>
void move_statistics(M& model, shape input, std::uint32_t seed) {
  auto r = nn::local();
  using T = typename M::scalar_type;
  for (int i = 0; i < 3; ++i) model.forward(r, random_input<T>(input, seed + static_cast<std::uint32_t>(i)));
}

}  // namespace distribute::test
