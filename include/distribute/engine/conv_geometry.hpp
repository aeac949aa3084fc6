#pragma once
// The geometry of one 2-D convolution over an NCHW batch, as every engine sees it: a batch of
// `batch` examples of in_channels planes of in_height x in_width, a kernel x kernel window moved by
// `stride`, zero padding `pad` on every side, out_channels planes of out_height x out_width.
// Output position (oh, ow) reads input (oh*stride - pad + ki, ow*stride - pad + kj), zero outside.
// Weights are [out_channels, in_channels, kernel, kernel].
//
// A transposed convolution is the adjoint of such a convolution (its forward is the convolution's
// data gradient), so layers describe both with this one type.

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

namespace distribute {

struct conv_geometry {
  std::int64_t batch = 0;
  std::int64_t in_channels = 0, in_height = 0, in_width = 0;
  std::int64_t out_channels = 0;
  std::int64_t kernel = 1, stride = 1, pad = 0;
  std::int64_t out_height = 0, out_width = 0;

  // The geometry whose output extents follow from the input's: floor((H + 2p - k) / s) + 1.
  static conv_geometry of(std::int64_t batch, std::int64_t in_channels, std::int64_t in_height, std::int64_t in_width,
                          std::int64_t out_channels, std::int64_t kernel, std::int64_t stride, std::int64_t pad) {
    conv_geometry g{batch, in_channels, in_height, in_width, out_channels, kernel, stride, pad, 0, 0};
    g.out_height = (in_height + 2 * pad - kernel) / stride + 1;
    g.out_width = (in_width + 2 * pad - kernel) / stride + 1;
    g.check();
    return g;
  }

  std::int64_t input_size() const noexcept { return batch * in_channels * in_height * in_width; }
  std::int64_t output_size() const noexcept { return batch * out_channels * out_height * out_width; }
  std::int64_t weight_size() const noexcept { return out_channels * in_channels * kernel * kernel; }
  // Multiply-adds of the forward pass, times two: the FLOP count of each of the three passes.
  double flops() const noexcept {
    return 2.0 * static_cast<double>(batch * out_channels * out_height * out_width) *
           static_cast<double>(in_channels * kernel * kernel);
  }

  void check() const {
    if (batch < 0 || in_channels < 1 || out_channels < 1 || kernel < 1 || stride < 1 || pad < 0 || in_height < 1 ||
        in_width < 1 || out_height < 1 || out_width < 1 || in_height + 2 * pad < kernel || in_width + 2 * pad < kernel)
      throw std::invalid_argument("distribute: invalid convolution geometry " + to_string());
  }
  std::string to_string() const {
    std::string s = "[";
    for (const std::int64_t v : {batch, in_channels, in_height}) s.append(std::to_string(v)).append("x");
    s.append(std::to_string(in_width)).append(" -> ");
    for (const std::int64_t v : {out_channels, out_height}) s.append(std::to_string(v)).append("x");
    s.append(std::to_string(out_width)).append(", kernel ").append(std::to_string(kernel));
    s.append(", stride ").append(std::to_string(stride)).append(", padding ").append(std::to_string(pad)).append("]");
    return s;
  }
  friend bool operator==(const conv_geometry&, const conv_geometry&) = default;
};

}  // namespace distribute
