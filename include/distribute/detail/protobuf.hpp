#pragma once
// The protocol-buffer wire format, written by hand for the few messages this library emits
// (TensorBoard's events in summary/, ONNX models in nn/onnx.hpp): users need no protobuf runtime,
// and a message is a string built field by field. Nothing here reads protobuf.

#include <bit>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

namespace distribute::detail::protobuf {

enum class wire : std::uint8_t { varint = 0, fixed64 = 1, length_delimited = 2, fixed32 = 5 };

inline void append_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7Fu) | 0x80u));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

inline void append_key(std::string& out, std::uint32_t field, wire type) {
  append_varint(out, (static_cast<std::uint64_t>(field) << 3) | static_cast<std::uint8_t>(type));
}

inline void append_fixed(std::string& out, std::uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}

// The fields of one message, appended in the order they are called.
class message {
 public:
  // int32 and int64 alike: a negative value is its 64-bit two's complement (10 bytes).
  message& integer(std::uint32_t field, std::int64_t v) {
    append_key(bytes_, field, wire::varint);
    append_varint(bytes_, static_cast<std::uint64_t>(v));
    return *this;
  }
  message& float32(std::uint32_t field, float v) {
    append_key(bytes_, field, wire::fixed32);
    append_fixed(bytes_, std::bit_cast<std::uint32_t>(v), 4);
    return *this;
  }
  message& float64(std::uint32_t field, double v) {
    append_key(bytes_, field, wire::fixed64);
    append_fixed(bytes_, std::bit_cast<std::uint64_t>(v), 8);
    return *this;
  }
  // string, bytes and embedded messages.
  message& bytes(std::uint32_t field, std::string_view v) {
    append_key(bytes_, field, wire::length_delimited);
    append_varint(bytes_, v.size());
    bytes_.append(v);
    return *this;
  }
  message& nested(std::uint32_t field, const message& m) { return bytes(field, m.bytes_); }

  const std::string& encoded() const& noexcept { return bytes_; }
  std::string encoded() && noexcept { return std::move(bytes_); }

 private:
  std::string bytes_;
};

}  // namespace distribute::detail::protobuf
