#pragma once
// The copy every collective uses to move data between buffers.
//
// glibc's memcpy hands copies of a few KiB and more to the string instruction `rep movsb`, which on
// some CPUs (AMD Zen among them) runs several times slower when source and destination are not
// aligned alike: exactly the case between a buffer from malloc (16 bytes past a 64-byte line) and a
// 64-byte aligned one of ours. Measured on a Zen 3 VM, an all-reduce of 256 KiB between two
// processes took 90 us with the buffer 16 bytes off a line and 22 us on one; with this copy both
// take 22 us. Buffers aligned alike go to memcpy; others are copied in 64-byte blocks of plain
// vector moves.

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace distribute::comm::detail {

inline void copy_bytes(void* dst, const void* src, std::size_t n) noexcept {
  auto* d = static_cast<std::byte*>(dst);
  const auto* s = static_cast<const std::byte*>(src);
  // Aligned alike, memcpy is the fastest there is (its widest vectors, or the string instruction).
  if (((reinterpret_cast<std::uintptr_t>(d) ^ reinterpret_cast<std::uintptr_t>(s)) & 63) == 0) {
    std::memcpy(d, s, n);
    return;
  }
  for (; n >= 64; n -= 64, d += 64, s += 64) std::memcpy(d, s, 64);  // a fixed size: inlined, never a call
  if (n != 0) std::memcpy(d, s, n);
}

}  // namespace distribute::comm::detail
