#pragma once
// Writing a file so that a crash at any moment leaves either the old file or the whole new one: the
// bytes go to a temporary beside the target (`<target>.tmp-<pid>-<n>`), which is flushed to disk and
// renamed over the target; the directory is flushed so that the rename is durable too. Checkpoints
// are written this way, and so can anything else a run must never find half-written (a log, a
// picture).
//
// A process killed before its rename leaves its temporary behind. `remove_stale_temporaries(dir)`
// removes those of processes that no longer run; a program calls it at start.

#include <distribute/checkpoint/error.hpp>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace distribute::checkpoint {

namespace detail {

[[noreturn]] inline void io_failure(const std::string& what, const std::filesystem::path& p, int err) {
  throw checkpoint_error("distribute: " + what + " " + p.string() + ": " + std::strerror(err));
}

class fd_guard {
 public:
  explicit fd_guard(int fd) noexcept : fd_{fd} {}
  fd_guard(const fd_guard&) = delete;
  fd_guard& operator=(const fd_guard&) = delete;
  ~fd_guard() {
    if (fd_ >= 0) ::close(fd_);
  }
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

inline constexpr std::string_view temporary_marker = ".tmp-";

// A name no other writer in this process or another one uses at the same time.
inline std::filesystem::path temporary_beside(const std::filesystem::path& file) {
  static std::atomic<unsigned> counter{0};
  auto tmp = file;
  tmp += std::string(temporary_marker) + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
  return tmp;
}

// The writer's process id when `name` is "<anything>.tmp-<pid>-<n>", else 0.
inline ::pid_t temporary_owner(std::string_view name) {
  const auto at = name.rfind(temporary_marker);
  if (at == std::string_view::npos || at == 0) return 0;
  std::string_view rest = name.substr(at + temporary_marker.size());
  const auto dash = rest.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == rest.size()) return 0;
  long long pid = 0, n = 0;
  const auto [p1, e1] = std::from_chars(rest.data(), rest.data() + dash, pid);
  const auto [p2, e2] = std::from_chars(rest.data() + dash + 1, rest.data() + rest.size(), n);
  if (e1 != std::errc{} || p1 != rest.data() + dash || e2 != std::errc{} || p2 != rest.data() + rest.size() || pid <= 0)
    return 0;
  return static_cast<::pid_t>(pid);
}

}  // namespace detail

// Writes `bytes` to `file` atomically (see above). Throws checkpoint_error naming the file.
inline void write_atomically(const std::filesystem::path& file, std::span<const std::byte> bytes) {
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
    detail::io_failure("cannot rename the new file to", file, err);
  }
  // The rename itself is durable only once the directory is flushed.
  detail::fd_guard d{::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)};
  if (d.get() >= 0) ::fsync(d.get());
}

inline void write_atomically(const std::filesystem::path& file, std::string_view text) {
  write_atomically(file, std::as_bytes(std::span<const char>(text.data(), text.size())));
}

// Removes the temporaries that writers killed before their rename left in `dir`
// (`<name>.tmp-<pid>-<n>`), unless their process still runs (it may be writing right now, or the
// pid may have been reused: either way the file is left alone). Returns the files removed.
inline std::vector<std::filesystem::path> remove_stale_temporaries(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> removed;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return removed;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code fe;
    if (!entry.is_regular_file(fe)) continue;
    const ::pid_t owner = detail::temporary_owner(entry.path().filename().string());
    if (owner == 0) continue;
    if (owner == ::getpid()) continue;  // this process's own, in flight
    // Alive: the process exists (getpgid fails with ESRCH only for a process that does not).
    if (::getpgid(owner) >= 0 || errno != ESRCH) continue;
    if (std::filesystem::remove(entry.path(), fe)) removed.push_back(entry.path());
  }
  return removed;
}

}  // namespace distribute::checkpoint
