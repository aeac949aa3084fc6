// Built against an installed distribute with the component `precompiled`: the engine's heavy
// instantiations come from the unit compiled in this build, not from this file. A dense layer and a
// convolution must give what plain loops over their own weights give; exit status 0 means they do.
#ifndef DISTRIBUTE_PRECOMPILED
#  error "distribute::precompiled must define DISTRIBUTE_PRECOMPILED for its users"
#endif
#include <distribute/distribute.hpp>

#include <cmath>
#include <cstdio>
#include <vector>

namespace dist = distribute;
namespace nn = distribute::nn;

int main() {
  dist::one_device_strategy<dist::cpu> strategy;
  int failures = 0;
  const auto near = [&](const char* what, double got, double want) {
    if (std::abs(got - want) > 1e-4 * (1 + std::abs(want))) {
      std::fprintf(stderr, "%s: %g, expected %g\n", what, got, want);
      ++failures;
    }
  };
  strategy.run([&](auto& r) {
    // y = x W^T + b, x of 2 examples of 3 features, 4 outputs.
    nn::linear<float> dense{{.in_features = 3, .out_features = 4}, 7};
    const dist::tensor<float> x{dist::shape{2, 3}, std::vector<float>{1, -2, 0.5f, 3, 0.25f, -1}};
    const auto y = dense.forward(r, x);
    const float* w = dense.weight().value.data();
    const float* b = dense.bias().value.data();
    for (int e = 0; e < 2; ++e)
      for (int o = 0; o < 4; ++o) {
        double want = b[o];
        for (int i = 0; i < 3; ++i) want += static_cast<double>(x.data()[e * 3 + i]) * w[o * 3 + i];
        near("linear", y.data()[e * 4 + o], want);
      }
    // A 3x3 convolution, 1 -> 2 channels, padding 1, over a 5x5 plane.
    nn::conv2d<float> conv{{.in_channels = 1, .out_channels = 2, .kernel = 3, .stride = 1, .padding = 1}, 9};
    std::vector<float> plane(25);
    for (int i = 0; i < 25; ++i) plane[static_cast<std::size_t>(i)] = static_cast<float>(i % 7) - 3;
    const dist::tensor<float> img{dist::shape::nchw(1, 1, 5, 5), plane};
    const auto out = conv.forward(r, img);
    const float* k = conv.weight().value.data();
    const float* kb = conv.bias().value.data();
    for (int c = 0; c < 2; ++c)
      for (int i = 0; i < 5; ++i)
        for (int j = 0; j < 5; ++j) {
          double want = kb[c];
          for (int di = -1; di <= 1; ++di)
            for (int dj = -1; dj <= 1; ++dj)
              if (i + di >= 0 && i + di < 5 && j + dj >= 0 && j + dj < 5)
                want += static_cast<double>(plane[static_cast<std::size_t>((i + di) * 5 + j + dj)]) *
                        k[c * 9 + (di + 1) * 3 + dj + 1];
          near("conv2d", out.data()[(c * 5 + i) * 5 + j], want);
        }
  });
  if (failures == 0) std::printf("the precompiled unit's layers agree with plain loops\n");
  return failures == 0 ? 0 : 1;
}
