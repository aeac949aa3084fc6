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
// `save` is atomic: the bytes go to a temporary file in the same directory, which is flushed to disk
// and then renamed over the target; a crash at any point leaves either the old file or the new one,
// never a mixture. `load` checks the magic, version, byte order and checksum before it trusts a single
// length, and every length against the bytes that are left.

#include <distribute/checkpoint/archive.hpp>
#include <distribute/checkpoint/detail/crc32.hpp>
#include <distribute/checkpoint/error.hpp>

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
      if (size > r.left()) r.fail("declares a section of " + std::to_string(size) + " bytes with " +
                                  std::to_string(r.left()) + " left");
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

namespace detail {

[[noreturn]] inline void io_failure(const std::string& what, const std::filesystem::path& p, int err) {
  throw checkpoint_error("distribute: " + what + " " + p.string() + ": " + std::strerror(err));
}

class fd_guard {
 public:
  explicit fd_guard(int fd) noexcept : fd_{fd} {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() { if (fd_ >= 0) ::close(fd_); }
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

inline void write_all(int fd, std::span<const std::byte> bytes, const std::filesystem::path& p) {
  while (!bytes.empty()) {
    const ::ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      io_failure("cannot write", p, errno);
    }
    bytes = bytes.subspan(static_cast<std::size_t>(n));
  }
}

// A name no other writer in this process or another one uses at the same time.
inline std::filesystem::path temporary_beside(const std::filesystem::path& file) {
  static std::atomic<unsigned> counter{0};
  auto tmp = file;
  tmp += ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  return tmp;
}

}  // namespace detail

inline void save(const std::filesystem::path& file, const archive& a) {
  const auto bytes = serialize(a);
  const auto dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  const auto tmp = detail::temporary_beside(file);
  {
    detail::fd_guard fd{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)};
    if (fd.get() < 0) detail::io_failure("cannot create", tmp, errno);
    try {
      detail::write_all(fd.get(), bytes, tmp);
      if (::fsync(fd.get()) != 0) detail::io_failure("cannot flush", tmp, errno);
      if (::close(fd.release()) != 0) detail::io_failure("cannot close", tmp, errno);
    } catch (...) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw;
    }
  }
  if (::rename(tmp.c_str(), file.c_str()) != 0) {
    const int err = errno;
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    detail::io_failure("cannot rename the new checkpoint to", file, err);
  }
  // The rename itself is durable only once the directory is flushed.
  detail::fd_guard d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.get() >= 0) ::fsync(d.get());
}

inline archive load(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw checkpoint_error("distribute: cannot open checkpoint " + file.string() + ": " + std::strerror(errno));
  std::vector<std::byte> bytes;
  in.seekg(0, std::ios::end);
  const auto size = in.tellg();
  if (size < 0) throw checkpoint_error("distribute: cannot read checkpoint " + file.string());
  in.seekg(0);
  bytes.resize(static_cast<std::size_t>(size));
  if (!in.read(reinterpret_cast<char*>(bytes.data()), size))
    throw checkpoint_error("distribute: cannot read checkpoint " + file.string());
  return parse(bytes, file.string());
}

}  // namespace distribute::checkpoint
