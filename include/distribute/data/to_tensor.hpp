#pragma once
// From the input pipeline's values to the layers' tensors in one call.
//
// The pipeline yields images as [n, h, w, c] (NHWC, channels last, as decoded), uint8 or float; the
// layers take `tensor<T, D>` in NCHW. `to_tensor` reorders, scales each value (v * scale + offset,
// in T), and places the result on the device:
//
//   auto x = data::to_tensor(batch, data::pixels::symmetric);   // uint8 [n,h,w,c] -> float NCHW in [-1, 1]
//   auto y = data::to_tensor<float, cuda>(batch.images, {}, gpu);  // on a GPU (tensor<float, cuda>::from_host)
//
// Ranks: [n, h, w, c] -> [n, c, h, w]; [n, h, w] (one channel) -> [n, 1, h, w]; [n, features] ->
// [n, features] (for dense layers); [n] -> [n]. Labels stay a std::vector<std::int32_t>
// (`batch.labels`), what the classification losses take.

#include <distribute/concepts/device.hpp>
#include <distribute/data/tensor.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/tensor/shape.hpp>
#include <distribute/tensor/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute::data {

// How a stored value becomes a tensor value: v * scale + offset.
struct to_tensor_options {
  double scale = 1.0;
  double offset = 0.0;
};

// The usual scalings of 8-bit pixels.
namespace pixels {
inline constexpr to_tensor_options unchanged{1.0, 0.0};
inline constexpr to_tensor_options unit{1.0 / 255.0, 0.0};        // [0, 255] -> [0, 1]
inline constexpr to_tensor_options symmetric{2.0 / 255.0, -1.0};  // [0, 255] -> [-1, 1] (a tanh output's range)
}  // namespace pixels

namespace detail {
inline shape nchw_shape_of(const std::vector<std::size_t>& s) {
  auto extent = [&](std::size_t i) {
    if (s[i] > static_cast<std::size_t>(INT64_MAX))
      throw std::invalid_argument("distribute::data: to_tensor got an extent too large: " + shape_string(s));
    return static_cast<std::int64_t>(s[i]);
  };
  switch (s.size()) {
    case 1: return shape{extent(0)};
    case 2: return shape{extent(0), extent(1)};
    case 3: return shape::nchw(extent(0), 1, extent(1), extent(2));
    case 4: return shape::nchw(extent(0), extent(3), extent(1), extent(2));
    default:
      throw std::invalid_argument(
          "distribute::data: to_tensor takes [n], [n, features], [n, h, w] or [n, h, w, c] "
          "values; got shape " +
          shape_string(s));
  }
}
}  // namespace detail

// `values` ([n, ...], channels last) as an NCHW tensor on `device`.
template <class T = float, device D = cpu, class U>
distribute::tensor<T, D> to_tensor(const data::tensor<U>& values, const to_tensor_options& options = {},
                                   const D& device = {}) {
  const shape out = detail::nchw_shape_of(values.shape);
  if (static_cast<std::int64_t>(values.size()) != out.numel())
    throw std::invalid_argument("distribute::data: to_tensor got " + std::to_string(values.size()) +
                                " values for shape " + shape_string(values.shape));
  const T scale = static_cast<T>(options.scale), offset = static_cast<T>(options.offset);
  std::vector<T> host(values.size());
  const std::size_t rank = values.shape.size();
  if (rank == 4) {
    // [n, h, w, c] -> [n, c, h, w]: each example's planes, one channel at a time.
    const std::size_t n = values.shape[0], h = values.shape[1], w = values.shape[2], c = values.shape[3];
    const std::size_t plane = h * w;
    for (std::size_t e = 0; e < n; ++e) {
      const U* in = values.data() + e * plane * c;
      T* dst = host.data() + e * plane * c;
      for (std::size_t p = 0; p < plane; ++p)
        for (std::size_t k = 0; k < c; ++k) dst[k * plane + p] = static_cast<T>(in[p * c + k]) * scale + offset;
    }
  } else {
    for (std::size_t i = 0; i < host.size(); ++i) host[i] = static_cast<T>(values.values[i]) * scale + offset;
  }
  return distribute::tensor<T, D>::from_host(out, std::span<const T>(host), device);
}

// A batch's images.
template <class T = float, device D = cpu, class U>
distribute::tensor<T, D> to_tensor(const batch<U>& b, const to_tensor_options& options = {}, const D& device = {}) {
  return to_tensor<T, D>(b.images, options, device);
}

}  // namespace distribute::data
