#pragma once
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord framing, and its
// masked form. Computed by the SSE4.2 `crc32` instruction where the CPU has it (checked once at run
// time, so no build flag is needed) and by a byte table otherwise; both give the same values.

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#  include <cpuid.h>
#  include <distribute/detail/x86_intrinsics.hpp>  // before <immintrin.h>: GCC 12's AVX-512 warnings
#  include <immintrin.h>
#  define DISTRIBUTE_SUMMARY_CRC32C_SSE42 1
#endif

namespace distribute::summary::detail {

inline constexpr std::uint32_t crc32c_polynomial = 0x82F63B78u;  // 0x1EDC6F41, bit-reversed

inline constexpr std::array<std::uint32_t, 256> crc32c_table = [] {
  std::array<std::uint32_t, 256> t{};
  for (std::uint32_t i = 0; i < 256; ++i) {
    std::uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ crc32c_polynomial : c >> 1;
    t[i] = c;
  }
  return t;
}();

// `crc` is a finished CRC-32C of the bytes before `data` (0 for none); the result covers both.
inline std::uint32_t crc32c_extend_table(std::uint32_t crc, std::span<const std::byte> data) noexcept {
  std::uint32_t c = ~crc;
  for (const std::byte b : data) c = crc32c_table[(c ^ static_cast<std::uint8_t>(b)) & 0xFFu] ^ (c >> 8);
  return ~c;
}

#ifdef DISTRIBUTE_SUMMARY_CRC32C_SSE42
// Only called where crc32c_has_sse42() is true.
__attribute__((target("sse4.2"))) inline std::uint32_t crc32c_extend_sse42(std::uint32_t crc,
                                                                           std::span<const std::byte> data) noexcept {
  const std::byte* p = data.data();
  std::size_t n = data.size();
  std::uint32_t c = ~crc;
#  if defined(__x86_64__)
  std::uint64_t c64 = c;
  for (; n >= 8; n -= 8, p += 8) {
    std::uint64_t word;
    std::memcpy(&word, p, 8);
    c64 = _mm_crc32_u64(c64, word);
  }
  c = static_cast<std::uint32_t>(c64);
#  endif
  for (; n >= 4; n -= 4, p += 4) {
    std::uint32_t word;
    std::memcpy(&word, p, 4);
    c = _mm_crc32_u32(c, word);
  }
  for (; n > 0; --n, ++p) c = _mm_crc32_u8(c, static_cast<std::uint8_t>(*p));
  return ~c;
}

inline bool crc32c_has_sse42() noexcept {
  static const bool has = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_SSE4_2) != 0;
  }();
  return has;
}
#else
inline bool crc32c_has_sse42() noexcept { return false; }
#endif

inline std::uint32_t crc32c_extend(std::uint32_t crc, std::span<const std::byte> data) noexcept {
#ifdef DISTRIBUTE_SUMMARY_CRC32C_SSE42
  if (crc32c_has_sse42()) return crc32c_extend_sse42(crc, data);
#endif
  return crc32c_extend_table(crc, data);
}

inline std::uint32_t crc32c(std::span<const std::byte> data) noexcept { return crc32c_extend(0, data); }

// TFRecord's (and LevelDB's) mask: a CRC stored inside data that is itself checksummed would
// otherwise make the outer CRC degenerate.
inline constexpr std::uint32_t mask_crc(std::uint32_t crc) noexcept {
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

inline std::uint32_t masked_crc32c(std::span<const std::byte> data) noexcept { return mask_crc(crc32c(data)); }

}  // namespace distribute::summary::detail
