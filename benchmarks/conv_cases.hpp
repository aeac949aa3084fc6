#pragma once
// The convolutions the training-arithmetic benchmarks time (bench_nn on the CPU, bench_nn_gpu on a
// GPU) and what each costs, in one place so that both count alike: CycleGAN's demo shapes (28x28
// Fashion-MNIST, 16 filters, batch 4 per replica) and the paper's (256x256 RGB, 64 filters, batch 1).
//
// FLOPs count a multiply-add as 2; a convolution's backward (input and weight gradients) is twice its
// forward; a transposed convolution counts as the convolution it is the adjoint of (one multiply-add
// per input element and tap).

#include <distribute/nn/conv2d.hpp>

#include <cstdint>

namespace bench {

struct conv_case {
  const char* name;
  std::int64_t batch, in_c, out_c, size, kernel, stride, padding;
  distribute::nn::padding_mode mode;
  // A conv_transpose2d with output padding stride - 1 (CycleGAN's up-sampling).
  bool transposed = false;
  int in_paper_generator = 0;  // how many of the paper generator's convolutions this case stands for

  // The input's elements (batch x in_c x size x size).
  constexpr std::int64_t input_elements() const { return batch * in_c * size * size; }
  // The side of the square output the layer makes of this input.
  constexpr std::int64_t output_side() const {
    if (transposed) return (size - 1) * stride - 2 * padding + kernel + (stride - 1);
    return (size + 2 * padding - kernel) / stride + 1;
  }
  // One forward pass.
  constexpr double forward_flops() const {
    if (transposed) return 2.0 * static_cast<double>(input_elements()) * static_cast<double>(out_c * kernel * kernel);
    const std::int64_t side = output_side();
    return 2.0 * static_cast<double>(batch * out_c * side * side) * static_cast<double>(in_c * kernel * kernel);
  }
  // One forward and backward pass.
  constexpr double train_flops() const { return 3.0 * forward_flops(); }
};

inline constexpr conv_case cyclegan_conv_cases[] = {
    {"demo 28x28 1->16 k7 reflect", 4, 1, 16, 28, 7, 1, 3, distribute::nn::padding_mode::reflect},
    {"demo 28x28 16->32 k3 s2", 4, 16, 32, 28, 3, 2, 1, distribute::nn::padding_mode::zero},
    {"demo 7x7 64->64 k3 reflect", 4, 64, 64, 7, 3, 1, 1, distribute::nn::padding_mode::reflect},
    {"demo 7x7 64->32 k3 up", 4, 64, 32, 7, 3, 2, 1, distribute::nn::padding_mode::zero, true},
    {"demo 28x28 16->1 k7 reflect", 4, 16, 1, 28, 7, 1, 3, distribute::nn::padding_mode::reflect},
    // Each stands for this many of the generator's convolutions (the two down-samplings have the
    // same FLOPs, as do the two up-samplings).
    {"paper 256x256 3->64 k7 reflect", 1, 3, 64, 256, 7, 1, 3, distribute::nn::padding_mode::reflect, false, 1},
    {"paper 256x256 64->128 k3 s2", 1, 64, 128, 256, 3, 2, 1, distribute::nn::padding_mode::zero, false, 2},
    {"paper 64x64 256->256 k3 reflect", 1, 256, 256, 64, 3, 1, 1, distribute::nn::padding_mode::reflect, false, 18},
    {"paper 64x64 256->128 k3 up", 1, 256, 128, 64, 3, 2, 1, distribute::nn::padding_mode::zero, true, 2},
    {"paper 256x256 64->3 k7 reflect", 1, 64, 3, 256, 7, 1, 3, distribute::nn::padding_mode::reflect, false, 1},
};

}  // namespace bench
