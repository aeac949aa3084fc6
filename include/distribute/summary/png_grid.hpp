#pragma once
// summary::write_png_grid: a batch of images [N, C, H, W] as one PNG picture, the images side by side
// in a grid of `rows` rows (torchvision's save_image(make_grid(...))): a generator's samples at a
// step, an input beside its reconstruction. `make_image_grid` gives the same picture as 8-bit pixels,
// for summary::writer::image.
//
//   summary::write_png_grid("samples/step_1000.png", fake, 2);   // 8 images: 2 rows of 4
//   summary::write_png_grid(path, fake, 2, {.range = summary::value_range::minus_one_to_one});
//   auto g = summary::make_image_grid(fake, 2);
//   w.image("samples", step, g.height, g.width, g.channels, g.pixels.data());
//
// Layout: ceil(N / rows) columns; image i in row i / columns and column i % columns (row-major); the
// grid has exactly `rows` rows, and the cells after the last image are padding. `padding` pixels of
// `padding_value` separate the images and frame the grid (torchvision's default 2 and black).
//
// Values: `range` says what the model produces, [0, 1] (the default, torchvision's) or [-1, 1] (a
// tanh output); a value maps to round(255 u) with u its place in the range, and values outside the
// range are clamped to it (NaN gives 0). One channel gives a grey PNG, three an RGB one.
//
// Errors: a tensor that is not [N, C, H, W] with C 1 or 3 and some pixels, `rows` outside [1, N], a
// negative padding or a picture over 1 GiB throw std::invalid_argument naming what is wrong; a file
// that cannot be written throws summary_error naming the path and the system's reason. The file is
// written beside `path` and renamed onto it, so a viewer never sees half a picture.

#include <distribute/summary/detail/png.hpp>
#include <distribute/summary/error.hpp>
#include <distribute/tensor/tensor.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <system_error>
#include <type_traits>
#include <vector>

namespace distribute::summary {

// What the values of the images span: black at the low end, white at the high end.
enum class value_range : std::uint8_t { zero_to_one, minus_one_to_one };

struct png_grid_options {
  value_range range = value_range::zero_to_one;
  int padding = 2;                 // pixels between the images and around the grid
  std::uint8_t padding_value = 0;  // the padding's level in every channel (0 black, 255 white)
};

// A picture as 8-bit pixels: `height` rows of `width` pixels of `channels` bytes (HWC).
struct image_grid {
  int height = 0;
  int width = 0;
  int channels = 0;
  std::vector<std::uint8_t> pixels{};
};

namespace detail {

inline constexpr std::uint64_t max_grid_bytes = std::uint64_t{1} << 30;

// round(255 u), u the value's place in [lo, hi], clamped; NaN gives 0.
inline std::uint8_t to_byte(double v, double lo, double hi) noexcept {
  if (!(v > lo)) return 0;  // below the range, or NaN
  if (v >= hi) return 255;
  return static_cast<std::uint8_t>(std::floor((v - lo) / (hi - lo) * 255.0 + 0.5));
}

// The grid of `api` (the public function called, for the errors).
template <class T>
image_grid make_grid(const tensor<T, cpu>& images, int rows, const png_grid_options& options, const char* api) {
  static_assert(std::is_floating_point_v<T>, "distribute: a summary image grid takes float or double images");
  const shape& s = images.shape();
  auto fail = [&](const std::string& what) {
    throw std::invalid_argument(std::string("distribute: summary::") + api + ": images of shape " + s.to_string() +
                                ": " + what);
  };
  if (s.rank() != 4) fail("expected [N, C, H, W] (rank 4)");
  const std::int64_t n = s[0], c = s[1], h = s[2], w = s[3];
  if (c != 1 && c != 3) fail(std::to_string(c) + " channels (accepted: 1 grey, 3 RGB)");
  if (n == 0 || h == 0 || w == 0) fail("no pixels");
  if (rows < 1 || rows > n)
    fail("rows is " + std::to_string(rows) + " but must be in [1, " + std::to_string(n) + "] (the image count)");
  if (options.padding < 0) fail("padding is " + std::to_string(options.padding) + " but must be at least 0");
  const std::int64_t columns = (n + rows - 1) / rows, pad = options.padding;
  const std::int64_t height = rows * h + (rows + 1) * pad, width = columns * w + (columns + 1) * pad;
  if (height > 1'000'000'000 || width > 1'000'000'000 ||
      static_cast<std::uint64_t>(height) * static_cast<std::uint64_t>(width) * static_cast<std::uint64_t>(c) >
          max_grid_bytes)
    fail("a grid of " + std::to_string(height) + "x" + std::to_string(width) + " pixels is over 1 GiB");

  image_grid g{static_cast<int>(height), static_cast<int>(width), static_cast<int>(c), {}};
  g.pixels.assign(static_cast<std::size_t>(height * width * c), options.padding_value);
  const double lo = options.range == value_range::minus_one_to_one ? -1.0 : 0.0, hi = 1.0;
  const T* src = images.data();
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t top = pad + (i / columns) * (h + pad), left = pad + (i % columns) * (w + pad);
    for (std::int64_t ch = 0; ch < c; ++ch) {
      const T* plane = src + (i * c + ch) * h * w;
      for (std::int64_t y = 0; y < h; ++y) {
        std::uint8_t* out = g.pixels.data() + ((top + y) * width + left) * c + ch;
        for (std::int64_t x = 0; x < w; ++x) out[x * c] = to_byte(static_cast<double>(plane[y * w + x]), lo, hi);
      }
    }
  }
  return g;
}

}  // namespace detail

template <class T>
image_grid make_image_grid(const tensor<T, cpu>& images, int rows, const png_grid_options& options = {}) {
  return detail::make_grid(images, rows, options, "make_image_grid");
}

// Writes `images` [N, C, H, W] as a PNG grid of `rows` rows to `path` (see the top of this file).
template <class T>
void write_png_grid(const std::filesystem::path& path, const tensor<T, cpu>& images, int rows,
                    const png_grid_options& options = {}) {
  const image_grid g = detail::make_grid(images, rows, options, "write_png_grid");
  const std::string png = detail::encode_png(g.height, g.width, g.channels, g.pixels.data());
  auto fail = [&](int err) {
    if (err == 0) err = EIO;  // a stream that failed without saying why
    throw summary_error("distribute: summary::write_png_grid: cannot write " + path.string() + ": " +
                        std::strerror(err));
  };
  std::filesystem::path partial = path;
  partial += ".partial";
  std::FILE* f = std::fopen(partial.c_str(), "wb");
  if (f == nullptr) fail(errno);
  const bool written = std::fwrite(png.data(), 1, png.size(), f) == png.size();
  int err = errno;
  const bool closed = std::fclose(f) == 0;
  if (written && !closed) err = errno;
  std::error_code ec;
  if (written && closed) {
    std::filesystem::rename(partial, path, ec);
    if (!ec) return;
    err = ec.value();
  }
  std::filesystem::remove(partial, ec);
  fail(err);
}

}  // namespace distribute::summary
