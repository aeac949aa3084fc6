#pragma once
// A check of PNG bytes before stb_image sees them. stb_image inflates the image data into a buffer
// that it doubles whenever the data is longer than the header's size needs, up to 2 GiB: a PNG of a
// few pixels whose compressed data inflates to a gigabyte would make it allocate that. This walks the
// chunks, inflates the image data (IDAT) only counting its bytes, and refuses data longer than the
// header's width, height, colour type and bit depth allow. Anything else that is wrong is left for
// stb to report, so that this check never refuses a PNG that stb decodes.

#include <distribute/data/error.hpp>

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace distribute::data::detail {

inline void check_png_data(std::span<const std::uint8_t> b, const std::string& name) {
  static constexpr std::uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (b.size() < 8 + 8 + 13) return;
  for (std::size_t i = 0; i < 8; ++i)
    if (b[i] != signature[i]) return;  // not a PNG
  auto be32 = [&](std::size_t at) {
    return std::uint32_t{b[at]} << 24 | std::uint32_t{b[at + 1]} << 16 | std::uint32_t{b[at + 2]} << 8 |
           std::uint32_t{b[at + 3]};
  };
  std::size_t at = 8;
  std::uint64_t allowed = 0;
  bool have_header = false;
  z_stream z{};
  if (inflateInit(&z) != Z_OK) return;
  struct end_guard {
    z_stream* z;
    ~end_guard() { inflateEnd(z); }
  } guard{&z};
  std::vector<std::uint8_t> scratch(1 << 16);
  std::uint64_t total = 0;
  while (at + 8 <= b.size()) {
    const std::uint32_t length = be32(at);
    const std::uint32_t type = be32(at + 4);
    if (length > b.size() - at - 8) return;  // stb reports a truncated chunk
    const std::uint8_t* data = b.data() + at + 8;
    if (type == 0x49484452u && length >= 13) {  // IHDR
      const std::uint64_t w = be32(at + 8), h = be32(at + 12);
      const unsigned depth = data[8], colour = data[9];
      const unsigned samples = colour == 0   ? 1
                               : colour == 2 ? 3
                               : colour == 3 ? 1
                               : colour == 4 ? 2
                               : colour == 6 ? 4
                                             : 4;
      const std::uint64_t row = (w * samples * (depth ? depth : 16) + 7) / 8 + 1;
      // Interlaced images hold 7 reduced passes, each row with its filter byte: at most this much more.
      allowed = row * h + 7 * (h + 8) * 2 + 64;
      have_header = true;
    } else if (type == 0x49444154u && have_header) {  // IDAT
      z.next_in = const_cast<Bytef*>(data);
      z.avail_in = length;
      while (z.avail_in > 0) {
        z.next_out = scratch.data();
        z.avail_out = static_cast<uInt>(scratch.size());
        const int rc = inflate(&z, Z_NO_FLUSH);
        total += scratch.size() - z.avail_out;
        if (total > allowed)
          throw input_error(name, "corrupt PNG: its image data inflates to more than the " + std::to_string(allowed) +
                                      " bytes its header allows");
        if (rc != Z_OK) return;  // the end of the data, or an error stb reports itself
      }
    } else if (type == 0x49454E44u) {  // IEND
      return;
    }
    at += 8 + std::size_t{length} + 4;
  }
}

}  // namespace distribute::data::detail
