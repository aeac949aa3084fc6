#pragma once
// CRC-32 (IEEE 802.3, reflected, polynomial 0xEDB88320): the checksum a checkpoint carries so that a
// torn or bit-flipped file is refused on load. Table-driven; the table is built at compile time.

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

namespace distribute::checkpoint::detail {

inline constexpr std::array<std::uint32_t, 256> crc32_table = [] {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    t[i] = c;
  }
  return t;
}();

// Chainable: crc32(b, crc32(a)) == crc32(a + b).
inline std::uint32_t crc32(std::span<const std::byte> bytes, std::uint32_t crc = 0) noexcept {
  crc = ~crc;
  for (std::byte b : bytes) crc = crc32_table[(crc ^ static_cast<std::uint32_t>(b)) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

}  // namespace distribute::checkpoint::detail
