#pragma once
// How a replica thread waits for another: spin while the other is likely running on another core
// (a hand-off between running threads takes well under a microsecond), then give the core away a
// bounded number of times (replicas sharing cores, or another program on them), and only then let
// the caller block. The spin is bounded by time, not by a count of pause instructions, whose length
// varies tenfold between CPUs.
//
// The yields are bounded by time as well as by count. When other threads are runnable, one yield
// lasts until the scheduler comes back to the yielder, often a whole time slice of a busy thread,
// and Linux's scheduler (EEVDF) moves a yielder's deadline a slice later at every yield, so that
// after dozens of them it waits tens of milliseconds for its turn: with three busy threads on two
// cores, 200 yields took from a third of a second to over a second. Past `yield_time` the caller
// sleeps instead, and a thread that wakes from a sleep is scheduled as soon as its fair share allows.
//
// A wait with a deadline checks it in every phase: every 64 pauses of the spin and before every
// yield; the caller sleeps at most until it.

#include <distribute/detail/hardware.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#if defined(__linux__)
#  include <cerrno>
#  include <climits>
#  include <ctime>
#  include <linux/futex.h>
#  include <sys/syscall.h>
#  include <unistd.h>
#else
#  include <condition_variable>
#  include <mutex>
#endif

// GCC and Clang have the pause instruction as a builtin; <immintrin.h> (every intrinsic of every
// x86 extension, ~45,000 preprocessed lines) is for the compilers that have only the intrinsic.
#if !defined(__GNUC__) && (defined(_M_X64) || defined(_M_IX86))
#  include <immintrin.h>
#endif

namespace distribute::detail {

inline void cpu_relax() noexcept {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  __builtin_ia32_pause();
#elif defined(_M_X64) || defined(_M_IX86)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

inline constexpr auto spin_time = std::chrono::microseconds(20);
inline constexpr int yield_rounds = 200;
inline constexpr auto yield_time = std::chrono::microseconds(200);

// Whether `threads` waiting threads may spin: only when each can have a hardware thread of its own.
inline bool may_spin(int threads) noexcept {
  const unsigned hw = usable_hardware_threads();
  return hw != 0 && static_cast<unsigned>(threads) <= hw;
}

// True as soon as `ready()` holds; false once the spin and yield budget is spent or `deadline` has
// passed (then block, until the deadline if there is one: a caller past it gives up at once).
template <class Ready>
bool spin_then_yield(Ready&& ready, bool spin,
                     std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max()) {
  if (spin) {
    const auto until = std::min(deadline, std::chrono::steady_clock::now() + spin_time);
    for (int i = 1;; ++i) {
      if (ready()) return true;
      cpu_relax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
    }
  }
  const auto until = std::min(deadline, std::chrono::steady_clock::now() + yield_time);
  for (int i = 0; i < yield_rounds; ++i) {
    if (ready()) return true;
    if (std::chrono::steady_clock::now() >= until) return false;
    std::this_thread::yield();
  }
  return ready();
}

// Where threads sleep once spinning and yielding are over: a counter that a waker bumps (after
// changing whatever the sleepers wait for) to wake them all. A sleeper reads `current()`, checks its
// condition, and sleeps only while the counter still holds what it read, so no wake-up is lost.
//
// On Linux the counter is a futex, and waking costs nothing while nobody sleeps. Unlike a condition
// variable, woken threads do not have to take a mutex one after another: on a loaded machine each
// hand-off of that mutex can wait for a time slice, and a hundred replicas released by one failure
// would queue for it one by one.
class wake_word {
 public:
  std::uint32_t current() const noexcept { return word_.load(std::memory_order_seq_cst); }

  // Sleeps while the counter is `seen`, at most until `deadline` (time_point::max(): no limit). May
  // return early: the caller checks its condition again.
  void wait_until(std::uint32_t seen, std::chrono::steady_clock::time_point deadline) {
#if defined(__linux__)
    static_assert(sizeof(word_) == sizeof(std::uint32_t) && std::atomic<std::uint32_t>::is_always_lock_free);
    timespec at{};
    const bool bounded = deadline != std::chrono::steady_clock::time_point::max();
    if (bounded) {
      // FUTEX_WAIT_BITSET takes an absolute CLOCK_MONOTONIC time, the clock of steady_clock.
      const auto since = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch());
      if (since.count() <= 0) return;
      at.tv_sec = static_cast<std::time_t>(since.count() / 1'000'000'000);
      at.tv_nsec = static_cast<long>(since.count() % 1'000'000'000);
    }
    const int saved_errno = errno;  // the futex's EAGAIN or ETIMEDOUT is no business of the caller's
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word_), FUTEX_WAIT_BITSET | FUTEX_PRIVATE_FLAG, seen,
            bounded ? &at : nullptr, nullptr, FUTEX_BITSET_MATCH_ANY);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    errno = saved_errno;
#else
    std::unique_lock lk(mu_);
    auto changed = [&] { return word_.load(std::memory_order_seq_cst) != seen; };
    if (deadline == std::chrono::steady_clock::time_point::max()) cv_.wait(lk, changed);
    else cv_.wait_until(lk, deadline, changed);
#endif
  }

  void wake_all() {
    word_.fetch_add(1, std::memory_order_seq_cst);
#if defined(__linux__)
    if (sleepers_.load(std::memory_order_seq_cst) != 0)
      syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word_), FUTEX_WAKE | FUTEX_PRIVATE_FLAG, INT_MAX, nullptr,
              nullptr, 0);
#else
    {
      std::lock_guard lk(mu_);
    }
    cv_.notify_all();
#endif
  }

 private:
  std::atomic<std::uint32_t> word_{0};
#if defined(__linux__)
  std::atomic<int> sleepers_{0};
#else
  std::mutex mu_;
  std::condition_variable cv_;
#endif
};

// How a timeout is reported: the time configured, and the time actually waited since `started`,
// which a loaded machine makes longer.
inline std::string timed_out_after(std::chrono::milliseconds timeout, std::chrono::steady_clock::time_point started) {
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
  return "timed out after " + std::to_string(timeout.count()) + " ms (waited " + std::to_string(waited.count()) +
         " ms)";
}

}  // namespace distribute::detail
