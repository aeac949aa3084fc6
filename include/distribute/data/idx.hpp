#pragma once
// The IDX format of (Fashion-)MNIST: a big-endian header (0, 0, element type, rank, then one 32-bit
// size per dimension) followed by the elements. Only unsigned bytes (type 0x08) are read, which is
// what image and label files use. `parse_idx` checks everything the header promises against the
// bytes present and names the file in every error.

#include <distribute/data/detail/read_file.hpp>
#include <distribute/data/error.hpp>
#include <distribute/data/limits.hpp>
#include <distribute/data/tensor.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace distribute::data {

inline constexpr std::uint32_t idx_images_magic = 0x00000803;  // unsigned bytes, rank 3
inline constexpr std::uint32_t idx_labels_magic = 0x00000801;  // unsigned bytes, rank 1

namespace detail {
inline std::string hex32(std::uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}
}  // namespace detail

namespace detail {

struct idx_header {
  std::vector<std::size_t> shape;
  std::size_t size = 0;     // bytes of the header
  std::uint64_t count = 0;  // bytes of data it promises
};

// The header of IDX bytes (or of their first bytes): magic, rank and dimensions.
inline idx_header parse_idx_header(std::span<const std::uint8_t> bytes, std::uint64_t file_size,
                                   const std::string& name, std::uint32_t expected_magic) {
  if (file_size < 4)
    throw input_error(name, "truncated: " + std::to_string(file_size) + " bytes, too short for an IDX header");
  const auto be32 = [&](std::size_t at) {
    return std::uint32_t{bytes[at]} << 24 | std::uint32_t{bytes[at + 1]} << 16 | std::uint32_t{bytes[at + 2]} << 8 |
           std::uint32_t{bytes[at + 3]};
  };
  const std::uint32_t magic = be32(0);
  if (bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08 || bytes[3] == 0 || bytes[3] > 4)
    throw input_error(name, "wrong IDX magic " + detail::hex32(magic) +
                                " (expected 0x000008NN: unsigned bytes of rank 1 to 4; is this an IDX file?)");
  if (expected_magic != 0 && magic != expected_magic)
    throw input_error(name, "wrong IDX magic " + detail::hex32(magic) + ", expected " + detail::hex32(expected_magic) +
                                (expected_magic == idx_images_magic ? " for an image file" : " for a label file"));
  idx_header h;
  const std::size_t rank = bytes[3];
  h.size = 4 + 4 * rank;
  if (file_size < h.size)
    throw input_error(name, "truncated: the IDX header of rank " + std::to_string(rank) + " needs " +
                                std::to_string(h.size) + " bytes, the file has " + std::to_string(file_size));
  h.count = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    const std::uint32_t n = be32(4 + 4 * d);
    h.shape.push_back(n);
    h.count *= n;
    if (h.count > (std::uint64_t{1} << 40))
      throw input_error(name, "IDX dimensions " + shape_string(h.shape) + " are implausibly large");
  }
  return h;
}

// The data the header promises against the bytes the file holds, and against the limit.
inline void check_idx_size(const idx_header& h, std::uint64_t file_size, const std::string& name,
                           const input_limits& limits) {
  if (h.count > limits.max_file_bytes)
    throw input_error(name, "the IDX header " + shape_string(h.shape) + " promises " + std::to_string(h.count) +
                                " bytes of data, more than the limit of " + mib(limits.max_file_bytes) +
                                " (input_limits::max_file_bytes)");
  const std::uint64_t have = file_size - h.size;
  if (have < h.count)
    throw input_error(name, "truncated: the header promises " + std::to_string(h.count) + " bytes of data " +
                                shape_string(h.shape) + ", the file holds " + std::to_string(have));
  if (have > h.count)
    throw input_error(name, std::to_string(have - h.count) + " bytes after the " + std::to_string(h.count) +
                                " bytes of data the header " + shape_string(h.shape) + " promises");
}

}  // namespace detail

// Parses IDX bytes. `expected_magic`, when not 0, is the magic the caller needs (images or labels).
inline tensor<std::uint8_t> parse_idx(std::span<const std::uint8_t> bytes, const std::string& name,
                                      std::uint32_t expected_magic = 0, const input_limits& limits = {}) {
  const auto h = detail::parse_idx_header(bytes, bytes.size(), name, expected_magic);
  detail::check_idx_size(h, bytes.size(), name, limits);
  tensor<std::uint8_t> t;
  t.shape = h.shape;
  t.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(h.size), bytes.end());
  return t;
}

// Reads an IDX file, gzip-compressed or not (its content decides). The header is checked against
// the file's size and the limit before the data is read into memory.
inline tensor<std::uint8_t> read_idx(const std::filesystem::path& path, std::uint32_t expected_magic = 0,
                                     const input_limits& limits = {}) {
  const std::string name = path.string();
  detail::idx_header h;
  auto bytes =
      detail::read_file(path, limits, [&](std::span<const std::uint8_t> head, std::optional<std::uint64_t> total) {
        h = detail::parse_idx_header(head, total.value_or(head.size()), name, expected_magic);
        if (total) detail::check_idx_size(h, *total, name, limits);
        else if (h.count > limits.max_file_bytes)
          detail::check_idx_size(h, h.size + h.count, name, limits);  // the limit's message
      });
  tensor<std::uint8_t> t;
  t.shape = h.shape;
  bytes.erase(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(h.size));  // no second copy of the data
  t.values = std::move(bytes);
  return t;
}

}  // namespace distribute::data
