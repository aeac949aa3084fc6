#pragma once
// The checkpoint file: an archive's sections behind a header, closed by a CRC-32 of every byte before
// it.
//
//   "DCKPT\r\n\x1a"                 8 bytes: magic (the \r\n\x1a catches text-mode mangling, as PNG's)
//   u32 version (1)                  u32 byte-order mark 0x01020304 (files are in the writer's order)
//   u32 section count
//   per section: u32 name length, name, u64 size, bytes
//   u32 CRC-32 of everything above
//
// `save` is atomic (checkpoint/atomic_write.hpp): the bytes go to a temporary file in the same
// directory, which is flushed to disk and then renamed over the target; a crash at any point leaves
// either the old file or the new one, never a mixture. `load` checks the magic, version, byte order and checksum before it trusts a single
// length, and every length against the bytes that are left.

#include <distribute/checkpoint/archive.hpp>
#include <distribute/checkpoint/atomic_write.hpp>
#include <distribute/checkpoint/detail/crc32.hpp>
#include <distribute/checkpoint/error.hpp>
#include <distribute/detail/activity.hpp>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace distribute::checkpoint {

inline constexpr char file_magic[8] = {'D', 'C', 'K', 'P', 'T', '\r', '\n', '\x1a'};
inline constexpr std::uint32_t file_version = 1;
inline constexpr std::uint32_t byte_order_mark = 0x01020304u;

// The bytes of a checkpoint file holding `a`.
inline std::vector<std::byte> serialize(const archive& a) {
  detail::byte_writer w;
  w.raw(file_magic, sizeof file_magic);
  w.pod(file_version);
  w.pod(byte_order_mark);
  w.pod(static_cast<std::uint32_t>(a.sections().size()));
  for (const auto& [name, bytes] : a.sections()) {
    w.pod(static_cast<std::uint32_t>(name.size()));
    w.raw(name.data(), name.size());
    w.pod(static_cast<std::uint64_t>(bytes.size()));
    w.raw(bytes.data(), bytes.size());
  }
  auto out = std::move(w).take();
  const std::uint32_t crc = detail::crc32(out);
  const auto* c = reinterpret_cast<const std::byte*>(&crc);
  out.insert(out.end(), c, c + sizeof crc);
  return out;
}

// The archive in `bytes`; `origin` (a file name) is named in errors. Throws checkpoint_error for
// anything that is not a whole, intact checkpoint.
inline archive parse(std::span<const std::byte> bytes, std::string_view origin) {
  const std::string where = "distribute: " + std::string(origin) + ": ";
  if (bytes.size() < sizeof file_magic || std::memcmp(bytes.data(), file_magic, sizeof file_magic) != 0)
    throw checkpoint_error(where + "not a distribute checkpoint (bad magic)");
  if (bytes.size() < sizeof file_magic + 3 * sizeof(std::uint32_t) + sizeof(std::uint32_t))
    throw checkpoint_error(where + "truncated checkpoint (" + std::to_string(bytes.size()) + " bytes)");
  detail::byte_reader header{bytes.subspan(sizeof file_magic), "header"};
  if (const auto v = header.pod<std::uint32_t>(); v != file_version)
    throw checkpoint_error(where + "checkpoint format version " + std::to_string(v) + "; this library reads version " +
                           std::to_string(file_version));
  if (header.pod<std::uint32_t>() != byte_order_mark)
    throw checkpoint_error(where + "checkpoint written on a machine of the other byte order");
  const auto body = bytes.first(bytes.size() - sizeof(std::uint32_t));
  std::uint32_t stored;
  std::memcpy(&stored, bytes.data() + body.size(), sizeof stored);
  if (detail::crc32(body) != stored)
    throw checkpoint_error(where + "checksum mismatch: the checkpoint is truncated or corrupt");

  detail::byte_reader r{body.subspan(sizeof file_magic + 2 * sizeof(std::uint32_t)), origin};
  archive a;
  try {
    const auto count = r.pod<std::uint32_t>();
    for (std::uint32_t i = 0; i < count; ++i) {
      const auto name_size = r.pod<std::uint32_t>();
      const auto name = r.take(name_size);
      const auto size = r.pod<std::uint64_t>();
      if (size > r.left())
        r.fail("declares a section of " + std::to_string(size) + " bytes with " + std::to_string(r.left()) + " left");
      a.put_bytes(std::string(reinterpret_cast<const char*>(name.data()), name.size()), r.take(size));
    }
    if (r.left() != 0) r.fail("has " + std::to_string(r.left()) + " bytes after its last section");
  } catch (const checkpoint_error&) {
    throw;
  } catch (const std::exception& e) {  // an empty or repeated section name
    throw checkpoint_error(where + e.what());
  }
  return a;
}

// Saving and loading count as the process's checkpoint time (step_timings.hpp).
inline void save(const std::filesystem::path& file, const archive& a) {
  const distribute::detail::activity_scope<distribute::detail::activity::checkpoint> timed;
  write_atomically(file, serialize(a));
}

// The largest checkpoint file `load` reads unless told otherwise: a bound on what one file can make
// it allocate (the file's bytes, then its sections), far above any model this library trains on a
// CPU. Pass a larger `max_bytes` for larger checkpoints.
inline constexpr std::uint64_t default_max_checkpoint_bytes = std::uint64_t{16} << 30;  // 16 GiB

// Reads and parses a checkpoint file. Only regular files are read (a FIFO or a device has no size to
// check), and only up to `max_bytes`.
inline archive load(const std::filesystem::path& file, std::uint64_t max_bytes = default_max_checkpoint_bytes) {
  const distribute::detail::activity_scope<distribute::detail::activity::checkpoint> timed;
  std::error_code ec;
  const auto status = std::filesystem::status(file, ec);
  if (ec) throw checkpoint_error("distribute: cannot open checkpoint " + file.string() + ": " + ec.message());
  if (!std::filesystem::is_regular_file(status))
    throw checkpoint_error("distribute: checkpoint " + file.string() + " is not a regular file");
  const auto size = std::filesystem::file_size(file, ec);
  if (ec) throw checkpoint_error("distribute: cannot read checkpoint " + file.string() + ": " + ec.message());
  if (size > max_bytes)
    throw checkpoint_error("distribute: checkpoint " + file.string() + " has " + std::to_string(size) +
                           " bytes, more than the limit of " + std::to_string(max_bytes) + " (load's max_bytes)");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw checkpoint_error("distribute: cannot open checkpoint " + file.string() + ": " + std::strerror(errno));
  std::vector<std::byte> bytes(static_cast<std::size_t>(size));
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)) ||
      in.peek() != std::char_traits<char>::eof())
    throw checkpoint_error("distribute: cannot read checkpoint " + file.string() + " (it changed while being read)");
  return parse(bytes, file.string());
}

}  // namespace distribute::checkpoint
