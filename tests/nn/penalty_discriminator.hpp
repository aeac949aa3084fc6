#pragma once
// A discriminator written for a tape, through layers with a recorded backward: a convolution with
// reflection padding, spectral norm around a strided one, instance norm with affine parameters, leaky
// ReLU (called twice), average pooling, flatten, linear layers, softplus, layer norm and a sigmoid
// gate. R1 and WGAN-GP go through it on the CPU engine, on Thrust's host loops
// (tests/thrust_host/operations_test.cpp) and on a GPU replica (tests/gpu/engine_test.cu). Input
// [N, 2, 9, 9] (or 8x8); the parameters drawn from seeds `seed` to `seed + 5`.

#include <distribute/device/cpu.hpp>
#include <distribute/nn.hpp>

#include <cstdint>

template <class D = distribute::cpu>
struct penalty_discriminator : distribute::nn::module<penalty_discriminator<D>, float, D> {
  distribute::nn::conv2d<float, D> c1;
  distribute::nn::leaky_relu<float, D> act{0.2f};
  distribute::nn::spectral_norm<distribute::nn::conv2d<float, D>> c2;
  distribute::nn::instance_norm<float, D> in;
  distribute::nn::avg_pool2d<float, D> pool{{.kernel = 2}};
  distribute::nn::flatten<float, D> flat{};
  distribute::nn::linear<float, D> dense;
  distribute::nn::layer_norm<float, D> ln;
  distribute::nn::linear<float, D> out;
  explicit penalty_discriminator(D d = {}, std::uint64_t seed = 1)
      : c1{{.in_channels = 2,
            .out_channels = 4,
            .kernel = 3,
            .padding = 1,
            .pad_mode = distribute::nn::padding_mode::reflect},
           seed,
           d},
        c2{distribute::nn::conv2d<float, D>{
               {.in_channels = 4, .out_channels = 4, .kernel = 3, .stride = 2, .padding = 1}, seed + 1, d},
           {},
           seed + 2},
        in{{.channels = 4, .affine = true}, seed + 3, d},
        dense{{.in_features = 16, .out_features = 8}, seed + 4, d},
        ln{{.normalized_shape = distribute::shape{8}}, d},
        out{{.in_features = 8, .out_features = 1}, seed + 5, d} {}
  auto members() { return distribute::nn::members("c1", c1, "c2", c2, "in", in, "dense", dense, "ln", ln, "out", out); }
  template <class Tape>
  typename Tape::variable operator()(Tape& t, typename Tape::variable x) {
    auto h = t(act, t(c1, x));
    h = t(act, t(in, t(c2, h)));
    auto f = distribute::nn::softplus(t, t(dense, t(flat, t(pool, h))), 1.5f);
    f = t(ln, f);
    return t(out, distribute::nn::mul(t, f, distribute::nn::sigmoid(t, f)));
  }
};
