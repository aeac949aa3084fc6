#pragma once
// The IDX format of (Fashion-)MNIST: a big-endian header (0, 0, element type, rank, then one 32-bit
// size per dimension) followed by the elements. Only unsigned bytes (type 0x08) are read, which is
// what image and label files use. `parse_idx` checks everything the header promises against the
// bytes present and names the file in every error.

#include <distribute/data/detail/read_file.hpp>
#include <distribute/data/error.hpp>
#include <distribute/data/tensor.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
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

// Parses IDX bytes. `expected_magic`, when not 0, is the magic the caller needs (images or labels).
inline tensor<std::uint8_t> parse_idx(std::span<const std::uint8_t> bytes, const std::string& name,
                                      std::uint32_t expected_magic = 0) {
  if (bytes.size() < 4)
    throw input_error(name, "truncated: " + std::to_string(bytes.size()) + " bytes, too short for an IDX header");
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
  const std::size_t rank = bytes[3];
  const std::size_t header = 4 + 4 * rank;
  if (bytes.size() < header)
    throw input_error(name, "truncated: the IDX header of rank " + std::to_string(rank) + " needs " +
                                std::to_string(header) + " bytes, the file has " + std::to_string(bytes.size()));
  tensor<std::uint8_t> t;
  std::uint64_t count = 1;
  for (std::size_t d = 0; d < rank; ++d) {
    const std::uint32_t n = be32(4 + 4 * d);
    t.shape.push_back(n);
    count *= n;
    if (count > (std::uint64_t{1} << 40))
      throw input_error(name, "IDX dimensions " + shape_string(t.shape) + " are implausibly large");
  }
  const std::size_t have = bytes.size() - header;
  if (have < count)
    throw input_error(name, "truncated: the header promises " + std::to_string(count) + " bytes of data " +
                                shape_string(t.shape) + ", the file holds " + std::to_string(have));
  if (have > count)
    throw input_error(name, std::to_string(have - count) + " bytes after the " + std::to_string(count) +
                                " bytes of data the header " + shape_string(t.shape) + " promises");
  t.values.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
  return t;
}

// Reads an IDX file, gzip-compressed or not.
inline tensor<std::uint8_t> read_idx(const std::filesystem::path& path, std::uint32_t expected_magic = 0) {
  const auto bytes = detail::read_file(path);
  return parse_idx(bytes, path.string(), expected_magic);
}

}  // namespace distribute::data
