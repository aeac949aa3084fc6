#pragma once
// Element types that collectives move and reduce. The set is closed by a trait rather than by
// `std::is_arithmetic` so that half and bfloat16 types can join by specialising `dtype_traits`.

#include <concepts>
#include <cstdint>
#include <ostream>
#include <string_view>
#include <type_traits>

namespace distribute {

enum class dtype : std::uint8_t { float32, float64, int32, int64, float16, bfloat16 };

constexpr std::string_view to_string(dtype t) noexcept {
  switch (t) {
    case dtype::float32: return "float32";
    case dtype::float64: return "float64";
    case dtype::int32: return "int32";
    case dtype::int64: return "int64";
    case dtype::float16: return "float16";
    case dtype::bfloat16: return "bfloat16";
  }
  return "unknown";
}

inline std::ostream& operator<<(std::ostream& os, dtype v) { return os << to_string(v); }

// Specialise with `static constexpr dtype value` (and make +, *, <, and division by the element type
// work) to add an element type.
template <class T>
struct dtype_traits {};

template <>
struct dtype_traits<float> {
  static constexpr dtype value = dtype::float32;
};
template <>
struct dtype_traits<double> {
  static constexpr dtype value = dtype::float64;
};
// Signed integers by width, so that `long` and `long long` (one of which is std::int64_t) both work.
template <class T>
  requires(std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) == 4)
struct dtype_traits<T> {
  static constexpr dtype value = dtype::int32;
};
template <class T>
  requires(std::is_integral_v<T> && std::is_signed_v<T> && sizeof(T) == 8)
struct dtype_traits<T> {
  static constexpr dtype value = dtype::int64;
};

template <class T>
concept element = requires {
  { dtype_traits<std::remove_cv_t<T>>::value } -> std::convertible_to<dtype>;
};

template <element T>
inline constexpr dtype dtype_of = dtype_traits<std::remove_cv_t<T>>::value;

}  // namespace distribute
