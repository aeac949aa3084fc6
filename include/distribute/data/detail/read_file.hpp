#pragma once
// Reads a whole file, gunzipping it when its content is gzip (the magic bytes 1F 8B decide, never the
// name), so that `.gz` and plain copies of a dataset read alike, bounded by input_limits.
//
// Nothing is allocated for the file's content before its size is known and checked: a plain file's
// size is its length on disk; a gzip stream is inflated twice, first only counting its bytes (and
// stopping as soon as they pass the limit), then into a buffer of exactly that size. A 1 MB gzip
// "bomb" is refused after inflating at most max_file_bytes into a 64 KiB scratch buffer. The caller
// may check the first bytes (a header) against the total before anything is allocated.

#include <distribute/data/error.hpp>
#include <distribute/data/limits.hpp>

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace distribute::data::detail {

// Called with the file's first bytes (up to 64) and its total size after gunzipping, before the
// content is read into memory; throws input_error to refuse the file. For gzip it is also called as
// soon as the first 64 bytes are inflated, with no total yet, so that a header promising more than
// the limit is refused before the rest of the stream is inflated.
using header_check = std::function<void(std::span<const std::uint8_t> head, std::optional<std::uint64_t> total)>;

inline constexpr std::size_t header_bytes = 64;

class file_reader {
 public:
  explicit file_reader(const std::filesystem::path& path) : name_{path.string()} {
    fd_ = ::open(name_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) throw input_error(name_, std::string("cannot open: ") + std::strerror(errno));
  }
  file_reader(const file_reader&) = delete;
  file_reader& operator=(const file_reader&) = delete;
  ~file_reader() { ::close(fd_); }

  int fd() const noexcept { return fd_; }
  // Up to `n` bytes; fewer only at the end of the file.
  std::size_t read(std::uint8_t* out, std::size_t n) {
    std::size_t got = 0;
    while (got < n) {
      const ::ssize_t r = ::read(fd_, out + got, n - got);
      if (r < 0) {
        if (errno == EINTR) continue;
        throw input_error(name_, std::string("cannot read: ") + std::strerror(errno));
      }
      if (r == 0) break;
      got += static_cast<std::size_t>(r);
    }
    return got;
  }
  void rewind() {
    if (::lseek(fd_, 0, SEEK_SET) != 0) throw input_error(name_, std::string("cannot read: ") + std::strerror(errno));
  }

 private:
  std::string name_;
  int fd_ = -1;
};

// The same reading interface over bytes in memory.
class memory_reader {
 public:
  explicit memory_reader(std::span<const std::uint8_t> bytes) : bytes_{bytes} {}
  std::size_t read(std::uint8_t* out, std::size_t n) {
    n = std::min(n, bytes_.size() - pos_);
    if (n) std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
    return n;
  }
  void rewind() { pos_ = 0; }

 private:
  std::span<const std::uint8_t> bytes_;
  std::size_t pos_ = 0;
};

// Inflates the gzip member(s) of `in` from its start. With `out` null, only counts, and stops
// (returning limit + 1) as soon as the count passes `limit`; otherwise writes exactly `expected`
// bytes to `out`. `head` receives the first header_bytes bytes when given.
template <class Reader>
std::uint64_t inflate_gzip(Reader& in, const std::string& name, std::uint64_t limit, std::uint8_t* out,
                           std::uint64_t expected, std::vector<std::uint8_t>* head,
                           const header_check* early = nullptr) {
  z_stream z{};
  if (inflateInit2(&z, 16 + MAX_WBITS) != Z_OK) throw input_error(name, "cannot read: zlib failed to start");
  struct end_guard {
    z_stream* z;
    ~end_guard() { inflateEnd(z); }
  } guard{&z};
  std::vector<std::uint8_t> input(1 << 16), scratch(out ? 0 : 1 << 16);
  std::uint64_t total = 0;
  bool at_end = false;  // a member ended; another may follow (as `gzip -c a b > c` makes)
  bool eof = false;
  for (;;) {
    if (z.avail_in == 0 && !eof) {
      const std::size_t n = in.read(input.data(), input.size());
      eof = n == 0;
      z.next_in = input.data();
      z.avail_in = static_cast<uInt>(n);
    }
    if (at_end) {
      if (z.avail_in == 0) {
        if (eof) break;
        continue;
      }
      if (z.next_in[0] != 0x1f) throw input_error(name, "cannot read: bytes after the end of the gzip stream");
      if (inflateReset(&z) != Z_OK) throw input_error(name, "cannot read: zlib failed");
      at_end = false;
    }
    std::uint8_t probe = 0;  // once `out` is full: any further byte means the file changed
    const bool full = out && total == expected;
    std::uint8_t* dst = !out ? scratch.data() : full ? &probe : out + total;
    const auto room = static_cast<uInt>(!out   ? scratch.size()
                                        : full ? 1
                                               : std::min<std::uint64_t>(expected - total, 1u << 30));
    z.next_out = dst;
    z.avail_out = room;
    const int rc = inflate(&z, Z_NO_FLUSH);
    const std::uint64_t made = room - z.avail_out;
    if (full && made > 0) throw input_error(name, "changed while being read");
    if (head && head->size() < header_bytes) {
      head->insert(head->end(), dst, dst + std::min<std::uint64_t>(made, header_bytes - head->size()));
      if (head->size() == header_bytes && early && *early) (*early)(*head, std::nullopt);
    }
    total += made;
    if (rc == Z_STREAM_END) {
      at_end = true;
    } else if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT || rc == Z_STREAM_ERROR) {
      throw input_error(name, std::string("cannot read: ") + (z.msg ? z.msg : "invalid data") + " (corrupt gzip data)");
    } else if (rc == Z_MEM_ERROR) {
      throw input_error(name, "cannot read: zlib is out of memory");
    } else if (rc == Z_BUF_ERROR && z.avail_in == 0 && eof) {
      throw input_error(name, "cannot read: the gzip stream is truncated");
    }
    if (!out && total > limit) return limit + 1;
  }
  if (out && total != expected) throw input_error(name, "changed while being read");
  return total;
}

inline bool is_gzip(std::span<const std::uint8_t> head) {
  return head.size() >= 2 && head[0] == 0x1f && head[1] == 0x8b;
}

// Both passes over a gzip source: the count (refused beyond the limit), the check, then the bytes.
template <class Reader>
std::vector<std::uint8_t> gunzip_bounded(Reader& in, const std::string& name, const input_limits& limits,
                                         const header_check& check) {
  std::vector<std::uint8_t> inflated_head;
  const std::uint64_t total = inflate_gzip(in, name, limits.max_file_bytes, nullptr, 0, &inflated_head, &check);
  if (total > limits.max_file_bytes)
    throw input_error(name, "inflates to more than the limit of " + mib(limits.max_file_bytes) +
                                " (input_limits::max_file_bytes); refused after inflating that much");
  if (check) check(inflated_head, total);
  in.rewind();
  std::vector<std::uint8_t> out(static_cast<std::size_t>(total));
  inflate_gzip(in, name, total, out.data(), total, nullptr);
  return out;
}

// Gunzips bytes in memory under the same limit.
inline std::vector<std::uint8_t> gunzip(std::span<const std::uint8_t> bytes, const std::string& name,
                                        const input_limits& limits = {}) {
  memory_reader in(bytes);
  return gunzip_bounded(in, name, limits, {});
}

inline std::vector<std::uint8_t> read_file(const std::filesystem::path& path, const input_limits& limits = {},
                                           const header_check& check = {}) {
  const std::string name = path.string();
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status)) throw input_error(name, "no such file");
  if (std::filesystem::is_directory(status)) throw input_error(name, "is a directory, not a file");
  if (!std::filesystem::is_regular_file(status)) throw input_error(name, "is not a regular file");
  file_reader in(path);
  struct ::stat st{};
  if (::fstat(in.fd(), &st) != 0) throw input_error(name, std::string("cannot read: ") + std::strerror(errno));
  const auto disk = static_cast<std::uint64_t>(st.st_size);

  std::vector<std::uint8_t> head(header_bytes);
  head.resize(in.read(head.data(), head.size()));
  in.rewind();
  if (!is_gzip(head)) {
    if (disk > limits.max_file_bytes)
      throw input_error(name, "has " + std::to_string(disk) + " bytes, more than the limit of " +
                                  mib(limits.max_file_bytes) + " (input_limits::max_file_bytes)");
    if (check) check(head, disk);
    std::vector<std::uint8_t> out(static_cast<std::size_t>(disk));
    if (in.read(out.data(), out.size()) != out.size()) throw input_error(name, "changed while being read");
    std::uint8_t extra = 0;
    if (in.read(&extra, 1) != 0) throw input_error(name, "changed while being read");
    return out;
  }
  return gunzip_bounded(in, name, limits, check);
}

}  // namespace distribute::data::detail
