#pragma once
// A check of JPEG bytes before stb_image sees them. stb_image 2.27 (Debian's libstb-dev) builds a
// Huffman table from a DHT segment without checking that its 16 code counts sum to at most 256, and
// writes past the table's arrays when they do not (found by tests/fuzz/fuzz_image; upstream later
// added the check). This walks the segments as a decoder does and rejects such a table first. It
// looks at every marker a decoder could act on: header segments are skipped by their length, and
// entropy-coded data is searched byte by byte for the next marker. Past the end of the bytes stb
// reads zeros, and so does this.

#include <distribute/data/error.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace distribute::data::detail {

inline void check_jpeg_tables(std::span<const std::uint8_t> b, const std::string& name) {
  // stb takes any 0xFF, 0xFF..., 0xD8 start as a JPEG (fill bytes before the start-of-image marker).
  const std::size_t size = b.size();
  std::size_t i = 1;
  if (size < 2 || b[0] != 0xFF) return;
  while (i < size && b[i] == 0xFF) ++i;
  if (i >= size || b[i] != 0xD8) return;  // not a JPEG
  ++i;
  bool in_scan = false;  // after a start of scan: entropy-coded data until the next marker
  while (i + 1 < size) {
    if (in_scan) {
      if (b[i] != 0xFF) {
        ++i;
        continue;
      }
      const std::uint8_t m = b[i + 1];
      if (m == 0x00 || m == 0xFF || (m >= 0xD0 && m <= 0xD7)) {  // stuffed byte, fill, restart marker
        i += m == 0xFF ? 1 : 2;
        continue;
      }
      in_scan = false;  // a real marker: handled below
    }
    if (b[i] != 0xFF) {
      ++i;  // junk between segments: a decoder searches on for 0xFF, so do we
      continue;
    }
    std::uint8_t m = b[i + 1];
    if (m == 0xFF) {  // fill bytes before a marker
      ++i;
      continue;
    }
    i += 2;
    if (m == 0xD9) return;                                                          // end of image
    if (m == 0x01 || m == 0xD8 || (m >= 0xD0 && m <= 0xD7) || m == 0x00) continue;  // no length
    if (i + 2 > size) return;
    const std::size_t length = std::size_t{b[i]} << 8 | b[i + 1];
    if (m == 0xC4) {  // define Huffman tables: class/id byte, 16 counts, then the values
      std::size_t at = i + 2;
      long left = static_cast<long>(length) - 2;
      while (left > 0) {
        if (at >= size) return;  // only zeros follow (stb reads 0 past the end): empty tables
        std::size_t n = 0;
        for (std::size_t k = 1; k <= 16; ++k) n += at + k < size ? b[at + k] : 0;  // as stb: 0 past the end
        if (n > 256)
          throw input_error(name,
                            "corrupt JPEG: a Huffman table declares " + std::to_string(n) + " codes (at most 256)");
        at += 17 + n;
        left -= static_cast<long>(17 + n);
      }
      if (left != 0) return;  // the decoder rejects this segment and stops
    }
    if (length < 2) return;
    i += length;
    if (m == 0xDA) in_scan = true;  // start of scan
  }
}

}  // namespace distribute::data::detail
