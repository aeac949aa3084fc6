// An LD_PRELOAD library that kills its process (SIGKILL, as the OOM killer or a power cut would stop
// it) at a chosen system call: the N-th write, fsync or rename whose file matches a substring.
//
//   FAULT_CALL   write | fsync | rename
//   FAULT_MATCH  a substring of the file's path (the fd's /proc/self/fd link; rename's source)
//   FAULT_AT     which matching call, from 1; 0 only counts
//   FAULT_MODE   before (the call never happens) | torn (write: half the bytes, then the kill) | after
//   FAULT_LOG    instead of failing: a file to which every write, fsync and rename on a file is
//                logged as "<call> <path>" (the driver counts the calls it may fail at from one run)
//
// Only calls through the C library's exported symbols are seen: enough for checkpoint and CSV
// writes, which call write, fsync and rename themselves.

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

namespace {

struct config {
  const char* call = std::getenv("FAULT_CALL");
  const char* match = std::getenv("FAULT_MATCH");
  long at = std::getenv("FAULT_AT") ? std::atol(std::getenv("FAULT_AT")) : 0;
  const char* mode = std::getenv("FAULT_MODE") ? std::getenv("FAULT_MODE") : "before";
  const char* log_file = std::getenv("FAULT_LOG");
};

const config& cfg() {
  static const config c;
  return c;
}

template <class F>
F next(const char* name) {
  return reinterpret_cast<F>(::dlsym(RTLD_NEXT, name));
}

std::atomic<long> seen{0};

bool path_matches(const char* path) { return cfg().match && path && std::strstr(path, cfg().match) != nullptr; }

// Whether this call is the one to fail at; counts matching calls.
bool strike(const char* call, bool matches) {
  if (!cfg().call || std::strcmp(cfg().call, call) != 0 || !matches) return false;
  return ++seen == cfg().at;
}

[[noreturn]] void die() {
  ::kill(::getpid(), SIGKILL);
  ::_exit(137);
}

bool mode(const char* m) { return std::strcmp(cfg().mode, m) == 0; }

// Appends "<call> <path>\n" to the log (a write of its own, through the real call).
void log_call(const char* call, const char* path) {
  using write_fn = ssize_t (*)(int, const void*, size_t);
  static const auto real_write = next<write_fn>("write");
  static const int fd = ::open(cfg().log_file, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0 || !path) return;
  char line[4200];
  const int n = std::snprintf(line, sizeof line, "%s %s\n", call, path);
  if (n > 0) real_write(fd, line, static_cast<size_t>(std::min(n, static_cast<int>(sizeof line) - 1)));
}

const char* fd_path(int fd, char (&target)[4096]) {
  char link[64];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  const ssize_t n = ::readlink(link, target, sizeof target - 1);
  if (n <= 0) return nullptr;
  target[n] = '\0';
  return target;
}

}  // namespace

extern "C" {

ssize_t write(int fd, const void* buf, size_t n) {
  using fn = ssize_t (*)(int, const void*, size_t);
  static const auto real = next<fn>("write");
  char path[4096];
  if (cfg().log_file && fd > 2) log_call("write", fd_path(fd, path));
  if (cfg().call && fd > 2 && strike("write", path_matches(fd_path(fd, path)))) {
    if (mode("torn") && n > 1) real(fd, buf, n / 2);
    else if (mode("after")) real(fd, buf, n);
    die();
  }
  return real(fd, buf, n);
}

int fsync(int fd) {
  using fn = int (*)(int);
  static const auto real = next<fn>("fsync");
  char path[4096];
  if (cfg().log_file) log_call("fsync", fd_path(fd, path));
  if (cfg().call && strike("fsync", path_matches(fd_path(fd, path)))) {
    if (mode("after")) real(fd);
    die();
  }
  return real(fd);
}

int rename(const char* from, const char* to) {
  using fn = int (*)(const char*, const char*);
  static const auto real = next<fn>("rename");
  if (cfg().log_file) log_call("rename", from);
  if (cfg().call && strike("rename", path_matches(from))) {
    if (mode("after")) real(from, to);
    die();
  }
  return real(from, to);
}

}  // extern "C"
