#pragma once
// im2col / col2im for one NCHW example, and reflection padding.
//
// Geometry (shared by conv2d and conv_transpose2d): input planes of H x W, a k x k kernel, stride s,
// zero padding p; output position (oh, ow) reads input (oh*s - p + ki, ow*s - p + kj), zero outside.
// col has C*k*k rows, row (c*k + ki)*k + kj, and Ho*Wo columns.

#include <cstdint>

namespace distribute::nn::detail {

struct window {
  std::int64_t channels, height, width, kernel, stride, pad, out_height, out_width;
};

template <class T>
void im2col(const T* src, const window& g, T* col) {
  const std::int64_t plane = g.out_height * g.out_width;
  for (std::int64_t c = 0; c < g.channels; ++c)
    for (std::int64_t ki = 0; ki < g.kernel; ++ki)
      for (std::int64_t kj = 0; kj < g.kernel; ++kj) {
        T* row = col + ((c * g.kernel + ki) * g.kernel + kj) * plane;
        const T* in = src + c * g.height * g.width;
        for (std::int64_t oh = 0; oh < g.out_height; ++oh) {
          const std::int64_t ih = oh * g.stride - g.pad + ki;
          T* out = row + oh * g.out_width;
          if (ih < 0 || ih >= g.height) {
            for (std::int64_t ow = 0; ow < g.out_width; ++ow) out[ow] = T(0);
            continue;
          }
          const T* line = in + ih * g.width;
          for (std::int64_t ow = 0; ow < g.out_width; ++ow) {
            const std::int64_t iw = ow * g.stride - g.pad + kj;
            out[ow] = (iw >= 0 && iw < g.width) ? line[iw] : T(0);
          }
        }
      }
}

// The adjoint of im2col: adds every column entry back onto the input position it was read from.
template <class T>
void col2im_add(const T* col, const window& g, T* dst) {
  const std::int64_t plane = g.out_height * g.out_width;
  for (std::int64_t c = 0; c < g.channels; ++c)
    for (std::int64_t ki = 0; ki < g.kernel; ++ki)
      for (std::int64_t kj = 0; kj < g.kernel; ++kj) {
        const T* row = col + ((c * g.kernel + ki) * g.kernel + kj) * plane;
        T* out = dst + c * g.height * g.width;
        for (std::int64_t oh = 0; oh < g.out_height; ++oh) {
          const std::int64_t ih = oh * g.stride - g.pad + ki;
          if (ih < 0 || ih >= g.height) continue;
          T* line = out + ih * g.width;
          const T* in = row + oh * g.out_width;
          for (std::int64_t ow = 0; ow < g.out_width; ++ow) {
            const std::int64_t iw = ow * g.stride - g.pad + kj;
            if (iw >= 0 && iw < g.width) line[iw] += in[ow];
          }
        }
      }
}

// Reflection ("mirror without repeating the edge", PyTorch ReflectionPad2d): padded index i in
// [-p, n+p) reads source index |i| for i < 0 and 2(n-1) - i for i >= n. Needs p < n.
constexpr std::int64_t reflect(std::int64_t i, std::int64_t n) noexcept {
  if (i < 0) return -i;
  if (i >= n) return 2 * (n - 1) - i;
  return i;
}

// One example's C planes of H x W into C planes of (H+2p) x (W+2p).
template <class T>
void reflect_pad(const T* src, std::int64_t channels, std::int64_t height, std::int64_t width, std::int64_t pad, T* dst) {
  const std::int64_t ph = height + 2 * pad, pw = width + 2 * pad;
  for (std::int64_t c = 0; c < channels; ++c)
    for (std::int64_t i = 0; i < ph; ++i) {
      const T* line = src + (c * height + reflect(i - pad, height)) * width;
      T* out = dst + (c * ph + i) * pw;
      for (std::int64_t j = 0; j < pw; ++j) out[j] = line[reflect(j - pad, width)];
    }
}

// The adjoint: every padded position's gradient goes to the source position it copied.
template <class T>
void reflect_pad_backward_add(const T* dpadded, std::int64_t channels, std::int64_t height, std::int64_t width,
                              std::int64_t pad, T* dsrc) {
  const std::int64_t ph = height + 2 * pad, pw = width + 2 * pad;
  for (std::int64_t c = 0; c < channels; ++c)
    for (std::int64_t i = 0; i < ph; ++i) {
      T* line = dsrc + (c * height + reflect(i - pad, height)) * width;
      const T* in = dpadded + (c * ph + i) * pw;
      for (std::int64_t j = 0; j < pw; ++j) line[reflect(j - pad, width)] += in[j];
    }
}

}  // namespace distribute::nn::detail
