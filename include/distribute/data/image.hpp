#pragma once
// Decoding and the image operations of the input pipeline, on [height, width, channels] uint8
// tensors: PNG/JPEG decoding (stb_image), resize (stb_image_resize), crop and horizontal flip.

#include <distribute/data/detail/jpeg_guard.hpp>
#include <distribute/data/detail/png_guard.hpp>
#include <distribute/data/detail/read_file.hpp>
#include <distribute/data/detail/stb.hpp>
#include <distribute/data/error.hpp>
#include <distribute/data/limits.hpp>
#include <distribute/data/tensor.hpp>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

namespace distribute::data {

// Decodes PNG or JPEG bytes into [h, w, channels]; channels 0 keeps the file's own count. `name`
// (the file) is named in the error for bytes that are not a decodable image. Gzip bytes are gunzipped
// first (within limits.max_file_bytes). The size the header
// declares is checked against `limits.max_image_bytes` before anything is decoded, and a PNG's
// compressed data against the size its header declares (detail/png_guard.hpp).
inline tensor<std::uint8_t> decode_image(std::span<const std::uint8_t> bytes, const std::string& name, int channels = 0,
                                         const input_limits& limits = {}) {
  if (channels < 0 || channels > 4)
    throw std::invalid_argument("distribute::data: decode_image: channels must be 0 to 4");
  if (bytes.empty()) throw input_error(name, "empty file, not an image");
  if (bytes.size() > static_cast<std::size_t>(INT_MAX)) throw input_error(name, "image file too large");
  if (detail::is_gzip(bytes)) {  // the content decides: a gzip-wrapped image is gunzipped, within the limit
    const auto inner = detail::gunzip(bytes, name, limits);
    if (detail::is_gzip(inner)) throw input_error(name, "gzip inside gzip, not a PNG or JPEG image");
    return decode_image(inner, name, channels, limits);
  }
  detail::check_jpeg_tables(bytes, name);
  int w = 0, h = 0, c = 0;
  const int len = static_cast<int>(bytes.size());
  if (!stbi_info_from_memory(bytes.data(), len, &w, &h, &c))
    throw input_error(name, std::string("not a PNG or JPEG image, or corrupt (") + stbi_failure_reason() + ")");
  const std::uint64_t depth = stbi_is_16_bit_from_memory(bytes.data(), len) ? 2 : 1;
  const std::uint64_t decoded = static_cast<std::uint64_t>(w) * static_cast<std::uint64_t>(h) *
                                static_cast<std::uint64_t>(std::max(c, channels)) * depth;
  if (decoded > limits.max_image_bytes)
    throw input_error(name, "image of " + std::to_string(w) + "x" + std::to_string(h) + " pixels, " +
                                std::to_string(c) + " channel(s), decodes to " + std::to_string(decoded) +
                                " bytes, more than the limit of " + detail::mib(limits.max_image_bytes) +
                                " (input_limits::max_image_bytes)");
  detail::check_png_data(bytes, name);
  std::unique_ptr<stbi_uc, void (*)(void*)> pixels(stbi_load_from_memory(bytes.data(), len, &w, &h, &c, channels),
                                                   stbi_image_free);
  if (!pixels) throw input_error(name, std::string("corrupt image data (") + stbi_failure_reason() + ")");
  const int out_c = channels ? channels : c;
  tensor<std::uint8_t> t;
  t.shape = {static_cast<std::size_t>(h), static_cast<std::size_t>(w), static_cast<std::size_t>(out_c)};
  t.values.assign(pixels.get(), pixels.get() + static_cast<std::size_t>(w) * h * out_c);
  return t;
}

// Reads an image file, gunzipping it when its content is gzip (read_file), and decodes it.
inline tensor<std::uint8_t> read_image_file(const std::filesystem::path& file, int channels = 0,
                                            const input_limits& limits = {}) {
  return decode_image(detail::read_file(file, limits), file.string(), channels, limits);
}

// Resizes to height x width; the result must fit `limits.max_image_bytes`.
inline tensor<std::uint8_t> resize_image(const tensor<std::uint8_t>& img, std::size_t height, std::size_t width,
                                         const input_limits& limits = {}) {
  if (img.shape[0] == height && img.shape[1] == width) return img;
  tensor<std::uint8_t> out;
  const auto c = img.shape[2];
  if (height == 0 || width == 0 || height > INT_MAX || width > INT_MAX ||
      static_cast<std::uint64_t>(height) * width * c > limits.max_image_bytes)
    throw std::invalid_argument("distribute::data: resize to " + std::to_string(height) + "x" + std::to_string(width) +
                                " with " + std::to_string(c) + " channel(s) is larger than the limit of " +
                                detail::mib(limits.max_image_bytes) + " (input_limits::max_image_bytes), or empty");
  out.shape = {height, width, c};
  out.values.resize(height * width * c);
  if (!stbir_resize_uint8(img.data(), static_cast<int>(img.shape[1]), static_cast<int>(img.shape[0]), 0, out.data(),
                          static_cast<int>(width), static_cast<int>(height), 0, static_cast<int>(c)))
    throw std::runtime_error("distribute::data: resize to " + std::to_string(height) + "x" + std::to_string(width) +
                             " failed");
  return out;
}

inline tensor<std::uint8_t> crop_image(const tensor<std::uint8_t>& img, std::size_t top, std::size_t left,
                                       std::size_t height, std::size_t width) {
  const std::size_t c = img.shape[2];
  if (top + height > img.shape[0] || left + width > img.shape[1])
    throw std::invalid_argument("distribute::data: crop of " + std::to_string(height) + "x" + std::to_string(width) +
                                " at (" + std::to_string(top) + ", " + std::to_string(left) + ") outside an image of " +
                                shape_string(img.shape));
  tensor<std::uint8_t> out;
  out.shape = {height, width, c};
  out.values.resize(height * width * c);
  for (std::size_t y = 0; y < height; ++y) {
    const auto src = img.values.begin() + static_cast<std::ptrdiff_t>(((top + y) * img.shape[1] + left) * c);
    std::copy(src, src + static_cast<std::ptrdiff_t>(width * c),
              out.values.begin() + static_cast<std::ptrdiff_t>(y * width * c));
  }
  return out;
}

inline void flip_left_right(tensor<std::uint8_t>& img) {
  const std::size_t h = img.shape[0], w = img.shape[1], c = img.shape[2];
  for (std::size_t y = 0; y < h; ++y)
    for (std::size_t x = 0; x < w / 2; ++x)
      for (std::size_t k = 0; k < c; ++k)
        std::swap(img.values[(y * w + x) * c + k], img.values[(y * w + (w - 1 - x)) * c + k]);
}

}  // namespace distribute::data
