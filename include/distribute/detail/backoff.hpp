#pragma once
// How a replica thread waits for another: spin while the other is likely running on another core
// (a hand-off between running threads takes well under a microsecond), then give the core away a
// bounded number of times (replicas sharing cores, or another program on them), and only then let
// the caller block. The spin is bounded by time, not by a count of pause instructions, whose length
// varies tenfold between CPUs.

#include <distribute/detail/hardware.hpp>

#include <chrono>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#  include <immintrin.h>
#endif

namespace distribute::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

inline constexpr auto spin_time = std::chrono::microseconds(20);
inline constexpr int yield_rounds = 200;

// Whether `threads` waiting threads may spin: only when each can have a hardware thread of its own.
inline bool may_spin(int threads) noexcept {
  const unsigned hw = usable_hardware_threads();
  return hw != 0 && static_cast<unsigned>(threads) <= hw;
}

// True as soon as `ready()` holds; false once the spin and yield budget is spent (then block).
template <class Ready>
bool spin_then_yield(Ready&& ready, bool spin) {
  if (spin) {
    const auto until = std::chrono::steady_clock::now() + spin_time;
    for (int i = 1;; ++i) {
      if (ready()) return true;
      cpu_relax();
      if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) break;
    }
  }
  for (int i = 0; i < yield_rounds; ++i) {
    if (ready()) return true;
    std::this_thread::yield();
  }
  return ready();
}

}  // namespace distribute::detail
