#pragma once
// One small model trained three Adam steps in a given compute precision, on any device: the case the
// CPU suite (tests/nn/engine_test.cpp) and the GPU suite (tests/gpu/engine_test.cu) both run, so that
// the GPU's 16-bit results are judged against the CPU's arithmetic of the same model and data.
//
// The bounds, from the arithmetic: bfloat16 keeps 8 significant bits, so every convolution operand is
// off by up to 2^-9 relative, and a weight gradient that is a sum of 512 such products with mixed
// signs is off by far more relative to itself where the terms cancel. Adam then divides each
// gradient by its own magnitude: a parameter whose gradient is near zero moves by about the learning
// rate per step whatever the gradient's size, in a direction its rounding decides. On this case the
// CPU engine's bfloat16 (oneDNN's bf16 kernels, exact products, float32 sums) ends 3.53e-2 from
// float32 relative to the largest parameter, and the GPU's (cuDNN, measured on an H100) ends at the
// same 3.53e-2, at the same element: parameter 36 is -0.0389891 in float32 on both devices,
// -0.0412584 in bfloat16 on the CPU and -0.0412571 on the GPU. float16's 11 bits give 1.3e-3 on
// the GPU.

#include <distribute/nn.hpp>
#include <distribute/optim/adam.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

namespace distribute::test::precision_case {

inline constexpr double bfloat16_from_float32 = 5e-2;  // after 3 Adam steps, relative to the largest parameter
inline constexpr double float16_from_float32 = 2e-2;
// Two engines computing in bfloat16 round the same operands the same way: they differ only in the
// order of float sums (and the GPU's weight gradient passing through bfloat16), far below bfloat16's
// distance from float32.
inline constexpr double bfloat16_between_engines = 2e-3;

inline const shape input_shape = shape::nchw(2, 1, 16, 16);

// The input: uniform in [-1, 1), seed 11.
inline std::vector<float> input_values() {
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(input_shape.numel()));
  for (auto& x : v) x = u(gen);
  return v;
}

template <class D>
auto make_net(compute_precision precision, D device) {
  return nn::with_precision{
      nn::sequential{nn::conv2d<float, D>{{.in_channels = 1, .out_channels = 8, .kernel = 3, .padding = 1}, 1, device},
                     nn::relu<float, D>{},
                     nn::conv2d<float, D>{{.in_channels = 8, .out_channels = 1, .kernel = 3, .padding = 1}, 2, device}},
      precision};
}

// Largest |a - b| over the largest |a|.
inline double relative_distance(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double scale = 0, worst = 0;
  for (float v : a) scale = std::max(scale, static_cast<double>(std::abs(v)));
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    if (!(d <= worst)) worst = d;  // NaN wins
  }
  return worst / (scale == 0 ? 1.0 : scale);
}

// Three Adam steps (lr 1e-3) of an autoencoding MSE on one device of strategy `s`; returns the
// parameters after them and the engine's precision seen after every pass (restored to float32?).
// `to_device(r, values)` makes the input tensor on the replica's device; `to_host(span)` reads a
// parameter back.
template <class S, class ToDevice, class ToHost>
std::pair<std::vector<float>, bool> train(S& s, compute_precision precision, ToDevice to_device, ToHost to_host) {
  const auto x = input_values();
  auto nets = s.mirror([&](auto& device) { return make_net(precision, device); });
  auto opts = s.mirror([](auto&) { return optim::adam<float>{{.lr = 1e-3}}; });
  auto after = s.run(
      [&](replica auto& r, auto& net, optim::adam<float>& opt) {
        const auto input = to_device(r, x);
        bool restored = true;
        for (int step = 0; step < 3; ++step) {
          net.zero_grad();
          const auto loss = nn::mse(r, net.forward(r, input), input, 2);
          restored = restored && r.engine().precision() == compute_precision::float32;
          net.backward(r, loss.grad);
          restored = restored && r.engine().precision() == compute_precision::float32;
          opt.step(r, net);
        }
        std::vector<float> p;
        net.for_each_parameter([&](auto v, auto) {
          const std::vector<float> h = to_host(v);
          p.insert(p.end(), h.begin(), h.end());
        });
        return std::pair{p, restored};
      },
      nets, opts);
  return after[0];
}

}  // namespace distribute::test::precision_case
