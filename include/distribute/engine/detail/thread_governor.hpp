#pragma once
// compute_options::adapt_threads: how many threads a CPU engine runs while other processes compete for
// the cores.
//
// The signal is the time the engine's own threads spent runnable but waiting for a CPU (the kernel's
// per-thread run delay, /proc/self/task/<tid>/schedstat), over windows of about 0.1 s of wall time.
// On a machine of its own a team of threads no larger than the free cores hardly waits; with one more
// busy process than there are spare cores, one of the team shares a core and waits about half the
// time, and every barrier of every parallel region waits for it. So:
//
// - a crowded window (the team waited more than `busy_share` of the window's wall time) drops one
//   thread, down to one;
// - below the most threads, after `first_probe_s` of uncrowded wall time the engine tries one thread
//   more for one window: crowded, it goes back and waits twice as long before the next try (at most
//   `longest_probe_s`); uncrowded, it keeps the thread and the wait starts again from
//   `first_probe_s`.
//
// A single thread sharing the machine with busy processes on the other cores does not wait, so a
// window says nothing about cores it does not use: that is what the tries are for. Their cost while
// the machine stays busy is one crowded window every `longest_probe_s` at most.
//
// `thread_governor` is the decision alone, fed with (wall, waited) windows: deterministic, testable
// with made-up windows. `team_run_delay` reads the kernel's figures for a team of OpenMP threads.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace distribute::detail {

struct thread_governor_settings {
  double window_s = 0.1;          // the least wall time one decision looks at
  double busy_share = 0.1;        // waited / wall above which a window is crowded
  double first_probe_s = 1.0;     // uncrowded wall time below the most threads before a try
  double longest_probe_s = 16.0;  // the longest wait between tries while the tries find crowding
};

class thread_governor {
 public:
  using settings = thread_governor_settings;

  explicit thread_governor(int most, settings s = {})
      : most_{std::max(1, most)}, threads_{most_}, s_{s}, wait_{s.first_probe_s} {}

  int threads() const noexcept { return threads_; }
  int most() const noexcept { return most_; }
  const settings& config() const noexcept { return s_; }
  // Whether the current count is a try of one thread more.
  bool trying() const noexcept { return trying_; }
  // The uncrowded wall time the next try waits for.
  double next_try_after() const noexcept { return wait_; }

  // One window at the current count: `wall_s` of wall time in which the team's threads waited
  // `waited_s` in all for a CPU. Returns the count for the next window.
  int decide(double wall_s, double waited_s) noexcept {
    const bool crowded = waited_s > s_.busy_share * wall_s;
    if (trying_) {
      trying_ = false;
      calm_ = 0;
      if (crowded) {
        --threads_;
        wait_ = std::min(2 * wait_, s_.longest_probe_s);
      } else {
        wait_ = s_.first_probe_s;
      }
      return threads_;
    }
    if (crowded) {
      calm_ = 0;
      if (threads_ > 1) {
        --threads_;
        wait_ = s_.first_probe_s;
      }
      return threads_;
    }
    calm_ += wall_s;
    if (threads_ < most_ && calm_ >= wait_ * (1 - 1e-9)) {  // (sums of window lengths round)
      ++threads_;
      trying_ = true;
      calm_ = 0;
    }
    return threads_;
  }

 private:
  int most_;
  int threads_;
  settings s_;
  double wait_;
  double calm_ = 0;  // uncrowded wall time since the last change or try
  bool trying_ = false;
};

// The kernel's run delay (nanoseconds runnable but not running) of a set of this process's threads.
class team_run_delay {
 public:
  // Whether this kernel reports run delays (CONFIG_SCHED_INFO): without, adapt_threads keeps the count.
  static bool available() {
    static const bool yes = read_ns(this_thread()) >= 0;
    return yes;
  }
  static long this_thread() noexcept { return static_cast<long>(::syscall(SYS_gettid)); }

  void set_team(std::vector<long> tids) { tids_ = std::move(tids); }
  const std::vector<long>& team() const noexcept { return tids_; }

  // The team's total run delay in nanoseconds; < 0 where a thread's figure cannot be read (a thread
  // that ended: the caller records the team again).
  std::int64_t total_ns() const {
    std::int64_t sum = 0;
    for (const long tid : tids_) {
      const std::int64_t ns = read_ns(tid);
      if (ns < 0) return -1;
      sum += ns;
    }
    return sum;
  }

  // The second field of /proc/self/task/<tid>/schedstat; < 0 where it cannot be read.
  static std::int64_t read_ns(long tid) noexcept {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/self/task/%ld/schedstat", tid);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[128];
    const ssize_t n = ::read(fd, buf, sizeof buf - 1);
    ::close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    return parse_run_delay(buf);
  }
  // "<on-cpu ns> <run delay ns> <slices>": the run delay; < 0 when malformed.
  static std::int64_t parse_run_delay(const char* text) noexcept {
    char* end = nullptr;
    std::strtoull(text, &end, 10);
    if (end == text) return -1;
    const char* second = end;
    const unsigned long long delay = std::strtoull(second, &end, 10);
    if (end == second) return -1;
    return static_cast<std::int64_t>(delay);
  }

 private:
  std::vector<long> tids_;
};

}  // namespace distribute::detail
