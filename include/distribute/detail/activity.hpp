#pragma once
// What this process spends outside the replicas' steps, counted where it happens so that no user code
// times it: waiting for the next element of a dataset pass (input wait) and saving or loading
// checkpoints. Process-wide totals in nanoseconds, read by the strategies' `timings()`
// (step_timings.hpp). A scope nested in another of the same activity on the same thread (a
// checkpoint directory's save calling the file's save) counts once. And the time each replica spends
// in collectives, on a meter of its own.

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace distribute::detail {

enum class activity : std::size_t { input_wait = 0, checkpoint = 1 };
inline constexpr std::size_t activity_count = 2;

// The process's totals, one per activity.
inline std::array<std::atomic<std::int64_t>, activity_count> activity_totals{};

inline std::int64_t activity_nanoseconds(activity a) noexcept {
  return activity_totals[static_cast<std::size_t>(a)].load(std::memory_order_relaxed);
}

inline std::int64_t nanoseconds_since(std::chrono::steady_clock::time_point t0) noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count();
}

// Adds the time from its construction to its destruction (also when leaving by an exception) to the
// activity's total, unless an outer scope of the same activity is open on this thread.
template <activity A>
class activity_scope {
 public:
  activity_scope() noexcept : outer_{depth()++ == 0} {
    if (outer_) t0_ = std::chrono::steady_clock::now();
  }
  ~activity_scope() {
    --depth();
    if (outer_)
      activity_totals[static_cast<std::size_t>(A)].fetch_add(nanoseconds_since(t0_), std::memory_order_relaxed);
  }
  activity_scope(const activity_scope&) = delete;
  activity_scope& operator=(const activity_scope&) = delete;

 private:
  static int& depth() noexcept {
    thread_local int d = 0;
    return d;
  }
  bool outer_;
  std::chrono::steady_clock::time_point t0_{};
};

// Nanoseconds one replica spent in collectives; written by that replica's thread only.
struct alignas(64) collective_meter {
  std::atomic<std::int64_t> ns{0};
};

inline void add_to_meter(collective_meter* m, std::int64_t ns) noexcept {
  if (m) m->ns.store(m->ns.load(std::memory_order_relaxed) + ns, std::memory_order_relaxed);
}

// Adds the time from construction to destruction to a replica's meter (none: measures nothing).
class collective_stopwatch {
 public:
  explicit collective_stopwatch(collective_meter* m) noexcept : m_{m} {
    if (m_) t0_ = std::chrono::steady_clock::now();
  }
  ~collective_stopwatch() {
    if (m_) add_to_meter(m_, nanoseconds_since(t0_));
  }
  collective_stopwatch(const collective_stopwatch&) = delete;
  collective_stopwatch& operator=(const collective_stopwatch&) = delete;

 private:
  collective_meter* m_;
  std::chrono::steady_clock::time_point t0_{};
};

}  // namespace distribute::detail
