#pragma once
// What a person looks at: PNG grids of translations and a PNG plot of the loss curves.
//
// stb_image_write and stb_easy_font are compiled in as private (static) functions, as the library
// does with stb_image, so nothing is linked and no other file can collide with them.

#include "stb_write.hpp"

#include <distribute/checkpoint/atomic_write.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace cyclegan {

// An RGB canvas.
struct image {
  int width = 0, height = 0;
  std::vector<std::uint8_t> rgb;

  image(int w, int h, std::uint8_t fill = 255) : width{w}, height{h}, rgb(static_cast<std::size_t>(w) * h * 3, fill) {}

  void set(int x, int y, std::array<std::uint8_t, 3> c) {
    if (x < 0 || y < 0 || x >= width || y >= height) return;
    const auto i = (static_cast<std::size_t>(y) * width + x) * 3;
    rgb[i] = c[0];
    rgb[i + 1] = c[1];
    rgb[i + 2] = c[2];
  }
  void fill_rect(int x0, int y0, int x1, int y1, std::array<std::uint8_t, 3> c) {
    for (int y = std::max(0, y0); y < std::min(height, y1); ++y)
      for (int x = std::max(0, x0); x < std::min(width, x1); ++x) set(x, y, c);
  }
  void line(double x0, double y0, double x1, double y1, std::array<std::uint8_t, 3> c) {
    const int n = static_cast<int>(std::ceil(std::max(std::abs(x1 - x0), std::abs(y1 - y0)))) + 1;
    for (int i = 0; i <= n; ++i) {
      const double t = static_cast<double>(i) / n;
      set(static_cast<int>(std::lround(x0 + t * (x1 - x0))), static_cast<int>(std::lround(y0 + t * (y1 - y0))), c);
    }
  }
  // Text through stb_easy_font, which emits axis-aligned quads (4 vertices of x, y, z, colour).
  void text(int x, int y, const std::string& s, std::array<std::uint8_t, 3> c) {
    std::vector<char> buf(s.size() * 1024 + 1024);  // stb_easy_font stops silently when the buffer is full
    const int quads =
        stb_easy_font_print(0, 0, const_cast<char*>(s.c_str()), nullptr, buf.data(), static_cast<int>(buf.size()));
    const float* v = reinterpret_cast<const float*>(buf.data());
    for (int q = 0; q < quads; ++q) {
      const float* p = v + q * 16;  // 4 vertices x (x, y, z, rgba as float-sized bytes)
      fill_rect(x + static_cast<int>(p[0]), y + static_cast<int>(p[1]), x + static_cast<int>(p[8]),
                y + static_cast<int>(p[9]), c);
    }
  }

  // Encoded in memory, then written atomically: a crash never leaves a truncated picture.
  void write_png(const std::filesystem::path& file) const {
    if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path());
    std::vector<std::byte> png;
    const auto append = [](void* context, void* data, int size) {
      auto* out = static_cast<std::vector<std::byte>*>(context);
      out->insert(out->end(), static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + size);
    };
    if (!stbi_write_png_to_func(append, &png, width, height, 3, rgb.data(), width * 3))
      throw std::runtime_error("cannot encode " + file.string());
    distribute::checkpoint::write_atomically(file, png);
  }
};

// Pastes one image of values in [-1, 1] (planar: channel, row, column; 1 or 3 channels) at (x, y),
// each pixel as a `zoom` x `zoom` block.
inline void paste(image& canvas, std::span<const float> values, int channels, int h, int w, int x, int y, int zoom) {
  auto level = [](float v) {
    return static_cast<std::uint8_t>(std::clamp(std::lround((v + 1.0f) * 127.5f), 0l, 255l));
  };
  for (int row = 0; row < h; ++row)
    for (int col = 0; col < w; ++col) {
      std::array<std::uint8_t, 3> c{};
      for (int k = 0; k < 3; ++k)
        c[static_cast<std::size_t>(k)] =
            level(values[static_cast<std::size_t>((std::min(k, channels - 1) * h + row) * w + col)]);
      canvas.fill_rect(x + col * zoom, y + row * zoom, x + (col + 1) * zoom, y + (row + 1) * zoom, c);
    }
}

// A grid of `columns` images per row; `tiles` holds rows x columns images, row by row.
inline image make_grid(const std::vector<std::span<const float>>& tiles, int columns, int channels, int h, int w,
                       int zoom = 2, int gap = 2) {
  const int rows = static_cast<int>(tiles.size()) / columns;
  image canvas(columns * (w * zoom + gap) + gap, rows * (h * zoom + gap) + gap, 40);
  for (int i = 0; i < static_cast<int>(tiles.size()); ++i)
    paste(canvas, tiles[static_cast<std::size_t>(i)], channels, h, w, gap + (i % columns) * (w * zoom + gap),
          gap + (i / columns) * (h * zoom + gap), zoom);
  return canvas;
}

struct curve {
  std::string name;
  std::vector<double> values;
  std::array<std::uint8_t, 3> colour;
};

// Stacks images vertically (the panels of one figure).
inline image stack_vertically(const std::vector<image>& parts) {
  int w = 0, h = 0;
  for (const auto& p : parts) w = std::max(w, p.width), h += p.height;
  image out(w, h, 255);
  int y0 = 0;
  for (const auto& p : parts) {
    for (int y = 0; y < p.height; ++y)
      std::copy_n(p.rgb.begin() + static_cast<std::ptrdiff_t>(y) * p.width * 3, p.width * 3,
                  out.rgb.begin() + (static_cast<std::ptrdiff_t>(y0 + y) * w) * 3);
    y0 += p.height;
  }
  return out;
}

// Loss curves against the step, each smoothed by a moving average over about 1% of the run.
inline image plot_curves(const std::vector<curve>& curves, const std::string& title, int width = 800,
                         int height = 450) {
  image img(width, height, 255);
  const int left = 70, right = 150, top = 30, bottom = 40;
  const int pw = width - left - right, ph = height - top - bottom;
  std::size_t n = 0;
  for (const auto& c : curves) n = std::max(n, c.values.size());
  std::vector<std::vector<double>> smooth;
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  const std::size_t window = std::max<std::size_t>(1, n / 100);
  for (const auto& c : curves) {
    std::vector<double> s(c.values.size());
    double acc = 0;
    for (std::size_t i = 0; i < c.values.size(); ++i) {
      acc += c.values[i];
      if (i >= window) acc -= c.values[i - window];
      s[i] = acc / static_cast<double>(std::min(i + 1, window));
      if (std::isfinite(s[i])) lo = std::min(lo, s[i]), hi = std::max(hi, s[i]);
    }
    smooth.push_back(std::move(s));
  }
  if (!std::isfinite(lo)) lo = 0, hi = 1;
  lo = std::min(lo, 0.0);
  if (hi <= lo) hi = lo + 1;
  const std::array<std::uint8_t, 3> grey{200, 200, 200}, black{0, 0, 0};
  for (int k = 0; k <= 4; ++k) {
    const int y = top + ph - k * ph / 4;
    img.line(left, y, left + pw, y, grey);
    char label[32];
    std::snprintf(label, sizeof label, "%.3g", lo + (hi - lo) * k / 4);
    img.text(6, y - 4, label, black);
  }
  img.line(left, top, left, top + ph, black);
  img.line(left, top + ph, left + pw, top + ph, black);
  for (int k = 0; k <= 4; ++k) {
    const int x = left + k * pw / 4;
    img.line(x, top + ph, x, top + ph + 4, black);
    img.text(x - 10, top + ph + 8, std::to_string(n * static_cast<std::size_t>(k) / 4), black);
  }
  img.text(left + pw + 22, top + ph + 8, "step", black);
  img.text(left, 10, title, black);
  for (std::size_t c = 0; c < curves.size(); ++c) {
    const auto& s = smooth[c];
    for (std::size_t i = 1; i < s.size(); ++i) {
      auto px = [&](std::size_t j) {
        return left + pw * static_cast<double>(j) / static_cast<double>(std::max<std::size_t>(1, n - 1));
      };
      auto py = [&](std::size_t j) { return top + ph - ph * (std::clamp(s[j], lo, hi) - lo) / (hi - lo); };
      img.line(px(i - 1), py(i - 1), px(i), py(i), curves[c].colour);
    }
    const int ly = top + 10 + static_cast<int>(c) * 16;
    img.fill_rect(left + pw + 12, ly, left + pw + 24, ly + 8, curves[c].colour);
    img.text(left + pw + 30, ly, curves[c].name, black);
  }
  return img;
}

}  // namespace cyclegan
