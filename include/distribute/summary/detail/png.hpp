#pragma once
// PNG encoding of 8-bit grey, RGB and RGBA images through zlib, for the image summaries.
//
// zlib rather than stb_image_write: stb's writer is compiled into the file that includes it as
// static functions, and a program that compiles it itself (the CycleGAN example does, for its
// picture files) would meet a second copy in the same translation unit. zlib is already what the
// IDX reader links, and its deflate compresses better than stb's own.
//
// Each row takes the filter (none, sub, up, average, Paeth) whose output has the smallest sum of
// absolute values as signed bytes, the heuristic the PNG specification suggests.

#include <zlib.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace distribute::summary::detail {

inline void append_be32(std::string& out, std::uint32_t v) {
  for (int i = 3; i >= 0; --i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

inline void append_png_chunk(std::string& out, std::string_view type, std::string_view data) {
  append_be32(out, static_cast<std::uint32_t>(data.size()));
  const std::size_t type_at = out.size();
  out.append(type);
  out.append(data);
  // The chunk CRC (plain CRC-32, zlib's) covers the type and the data.
  uLong crc = ::crc32(0L, Z_NULL, 0);
  const auto* p = reinterpret_cast<const Bytef*>(out.data() + type_at);
  std::size_t n = type.size() + data.size();
  while (n > 0) {
    const auto part = static_cast<uInt>(std::min<std::size_t>(n, std::numeric_limits<uInt>::max()));
    crc = ::crc32(crc, p, part);
    p += part;
    n -= part;
  }
  append_be32(out, static_cast<std::uint32_t>(crc));
}

inline std::uint8_t paeth(int a, int b, int c) noexcept {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  return static_cast<std::uint8_t>(pa <= pb && pa <= pc ? a : pb <= pc ? b : c);
}

// `pixels`: height rows of width x channels bytes (channels 1: grey, 3: RGB, 4: RGBA). The caller
// has checked the sizes (positive, and height x width x channels fits in memory).
inline std::string encode_png(int height, int width, int channels, const std::uint8_t* pixels) {
  const auto h = static_cast<std::size_t>(height);
  const std::size_t stride = static_cast<std::size_t>(width) * static_cast<std::size_t>(channels);
  const auto bpp = static_cast<std::size_t>(channels);

  // The filtered scanlines, each led by its filter type.
  std::vector<std::uint8_t> raw(h * (stride + 1));
  std::array<std::vector<std::uint8_t>, 5> trial;
  for (auto& t : trial) t.resize(stride);
  for (std::size_t y = 0; y < h; ++y) {
    const std::uint8_t* row = pixels + y * stride;
    const std::uint8_t* up = y > 0 ? pixels + (y - 1) * stride : nullptr;
    std::size_t best = 0;
    std::uint64_t best_cost = std::numeric_limits<std::uint64_t>::max();
    for (std::size_t f = 0; f < 5; ++f) {
      std::uint8_t* out = trial[f].data();
      std::uint64_t cost = 0;
      for (std::size_t i = 0; i < stride; ++i) {
        const int x = row[i], a = i >= bpp ? row[i - bpp] : 0, b = up ? up[i] : 0, c = up && i >= bpp ? up[i - bpp] : 0;
        int predicted = 0;
        switch (f) {
          case 1: predicted = a; break;
          case 2: predicted = b; break;
          case 3: predicted = (a + b) / 2; break;
          case 4: predicted = paeth(a, b, c); break;
          default: break;
        }
        const auto v = static_cast<std::uint8_t>(x - predicted);
        out[i] = v;
        cost += static_cast<std::uint64_t>(std::abs(static_cast<int>(static_cast<std::int8_t>(v))));
      }
      if (cost < best_cost) best_cost = cost, best = f;
    }
    std::uint8_t* dst = raw.data() + y * (stride + 1);
    dst[0] = static_cast<std::uint8_t>(best);
    std::copy(trial[best].begin(), trial[best].end(), dst + 1);
  }

  uLongf packed_size = ::compressBound(static_cast<uLong>(raw.size()));
  std::string packed(static_cast<std::size_t>(packed_size), '\0');
  const int rc = ::compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size, raw.data(),
                             static_cast<uLong>(raw.size()), Z_DEFAULT_COMPRESSION);
  if (rc == Z_MEM_ERROR) throw std::bad_alloc();
  if (rc != Z_OK)
    throw std::runtime_error("distribute: zlib could not compress a " + std::to_string(height) + "x" +
                             std::to_string(width) + " image (zlib error " + std::to_string(rc) + ")");
  packed.resize(static_cast<std::size_t>(packed_size));

  std::string png("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  append_be32(ihdr, static_cast<std::uint32_t>(width));
  append_be32(ihdr, static_cast<std::uint32_t>(height));
  const char colour_type = channels == 1 ? 0 : channels == 3 ? 2 : 6;  // grey, RGB, RGBA
  ihdr += {8, colour_type, 0, 0, 0};                                   // 8 bits, deflate, filters, no interlace
  append_png_chunk(png, "IHDR", ihdr);
  constexpr std::size_t max_chunk = std::size_t{1} << 30;  // a chunk holds at most 2^31 - 1 bytes
  const std::string_view all = packed;
  for (std::size_t at = 0; at < all.size(); at += max_chunk) append_png_chunk(png, "IDAT", all.substr(at, max_chunk));
  append_png_chunk(png, "IEND", {});
  return png;
}

}  // namespace distribute::summary::detail
