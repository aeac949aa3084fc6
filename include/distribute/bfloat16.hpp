#pragma once
// bfloat16 on the host: float's sign and 8-bit exponent with 7 bits of mantissa, so float's range at
// about 3 significant digits in half the bytes. It is what gradients travel as between CPU replicas
// and workers when `gradient_reduction::compression` is `gradient_compression::bfloat16`, and it is a
// collective element type like any other (`comm.all_reduce(op, std::span<bfloat16>)`).
//
// Conversion from float rounds to nearest, ties to even, with subnormals kept; every NaN becomes the
// one NaN 0x7fff. That is CUDA's `__float2bfloat16_rn` bit for bit (the conversion NCCL's bfloat16
// path and the GPU engine use), so a value rounds the same on either side. Arithmetic is float's,
// rounded back after each operation: a sum of bfloat16 values is rounded once per addition, as
// NCCL's bfloat16 reductions are.

#include <distribute/dtype.hpp>

#include <bit>
#include <cstdint>
#include <ostream>

namespace distribute {

class bfloat16 {
 public:
  bfloat16() = default;
  constexpr explicit bfloat16(float f) noexcept : bits_{round(f)} {}
  constexpr explicit bfloat16(double d) noexcept : bfloat16(static_cast<float>(d)) {}
  constexpr explicit bfloat16(int i) noexcept : bfloat16(static_cast<float>(i)) {}

  static constexpr bfloat16 from_bits(std::uint16_t bits) noexcept {
    bfloat16 b;
    b.bits_ = bits;
    return b;
  }
  constexpr std::uint16_t bits() const noexcept { return bits_; }

  // Exact: every bfloat16 is a float.
  constexpr explicit operator float() const noexcept { return std::bit_cast<float>(std::uint32_t{bits_} << 16); }
  constexpr explicit operator double() const noexcept { return static_cast<double>(static_cast<float>(*this)); }

  friend constexpr bfloat16 operator+(bfloat16 a, bfloat16 b) noexcept { return bfloat16(float(a) + float(b)); }
  friend constexpr bfloat16 operator-(bfloat16 a, bfloat16 b) noexcept { return bfloat16(float(a) - float(b)); }
  friend constexpr bfloat16 operator*(bfloat16 a, bfloat16 b) noexcept { return bfloat16(float(a) * float(b)); }
  friend constexpr bfloat16 operator/(bfloat16 a, bfloat16 b) noexcept { return bfloat16(float(a) / float(b)); }
  friend constexpr bfloat16 operator-(bfloat16 a) noexcept {
    return from_bits(static_cast<std::uint16_t>(a.bits_ ^ 0x8000u));
  }
  // IEEE comparisons: NaN is unordered, -0 == +0.
  friend constexpr bool operator==(bfloat16 a, bfloat16 b) noexcept { return float(a) == float(b); }
  friend constexpr bool operator<(bfloat16 a, bfloat16 b) noexcept { return float(a) < float(b); }
  friend constexpr bool operator>(bfloat16 a, bfloat16 b) noexcept { return float(a) > float(b); }
  friend constexpr bool operator<=(bfloat16 a, bfloat16 b) noexcept { return float(a) <= float(b); }
  friend constexpr bool operator>=(bfloat16 a, bfloat16 b) noexcept { return float(a) >= float(b); }

  friend std::ostream& operator<<(std::ostream& os, bfloat16 b) { return os << float(b); }

 private:
  static constexpr std::uint16_t round(float f) noexcept {
    const auto u = std::bit_cast<std::uint32_t>(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fffu;  // NaN
    // Adding just under half of the dropped part's unit, plus the kept part's lowest bit, carries
    // into the kept part exactly when the dropped part is over a half, or a half with the kept part
    // odd; a carry out of the mantissa steps the exponent (to infinity past the largest finite).
    return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }

  std::uint16_t bits_;
};

static_assert(sizeof(bfloat16) == 2);

template <>
struct dtype_traits<bfloat16> {
  static constexpr dtype value = dtype::bfloat16;
};

}  // namespace distribute
