#pragma once
// A strategy's side of `timings()` (step_timings.hpp): the time inside its steps, and one collective
// meter per replica (detail/activity.hpp) that the replica's collectives add to (replica_context).
// Copyable and movable, so that a strategy holding it keeps its own value semantics.

#include <distribute/detail/activity.hpp>
#include <distribute/step_timings.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace distribute::detail {

class step_clock {
 public:
  explicit step_clock(std::size_t replicas = 0)
      : meters_(replicas ? std::make_unique<collective_meter[]>(replicas) : nullptr), replicas_{replicas} {}
  step_clock(const step_clock& o) : step_clock(o.replicas_) { copy_from(o); }
  step_clock& operator=(const step_clock& o) {
    if (this != &o) {
      if (replicas_ != o.replicas_) {
        meters_ = o.replicas_ ? std::make_unique<collective_meter[]>(o.replicas_) : nullptr;
        replicas_ = o.replicas_;
      }
      copy_from(o);
    }
    return *this;
  }
  step_clock(step_clock&&) noexcept = default;
  step_clock& operator=(step_clock&&) noexcept = default;
  ~step_clock() = default;

  // Replica r's meter, for its replica_context (stable for the clock's life).
  collective_meter* meter(std::size_t r) noexcept { return r < replicas_ ? &meters_[r] : nullptr; }

  // Times one `run` or `run_on_primary` call (also when it throws).
  class step_scope {
   public:
    explicit step_scope(step_clock& c) noexcept : c_{c}, t0_{std::chrono::steady_clock::now()} {}
    ~step_scope() {
      c_.in_steps_ns_ += nanoseconds_since(t0_);
      ++c_.runs_;
    }
    step_scope(const step_scope&) = delete;
    step_scope& operator=(const step_scope&) = delete;

   private:
    step_clock& c_;
    std::chrono::steady_clock::time_point t0_;
  };

  step_timings totals() const noexcept {
    std::int64_t collective = 0;
    for (std::size_t r = 0; r < replicas_; ++r) collective += meters_[r].ns.load(std::memory_order_relaxed);
    const double mean_collective = replicas_ ? static_cast<double>(collective) / static_cast<double>(replicas_) : 0.0;
    step_timings t;
    t.wall = seconds(nanoseconds_since(start_));
    t.collective = mean_collective * 1e-9;
    t.compute = std::max(0.0, seconds(in_steps_ns_) - t.collective);
    t.input_wait = seconds(activity_nanoseconds(activity::input_wait) - input_wait0_);
    t.checkpoint = seconds(activity_nanoseconds(activity::checkpoint) - checkpoint0_);
    t.runs = runs_;
    return t;
  }

 private:
  static double seconds(std::int64_t ns) noexcept { return static_cast<double>(ns) * 1e-9; }
  void copy_from(const step_clock& o) noexcept {
    for (std::size_t r = 0; r < replicas_; ++r)
      meters_[r].ns.store(o.meters_[r].ns.load(std::memory_order_relaxed), std::memory_order_relaxed);
    start_ = o.start_;
    in_steps_ns_ = o.in_steps_ns_;
    runs_ = o.runs_;
    input_wait0_ = o.input_wait0_;
    checkpoint0_ = o.checkpoint0_;
  }

  std::unique_ptr<collective_meter[]> meters_;
  std::size_t replicas_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::int64_t in_steps_ns_ = 0;
  std::int64_t runs_ = 0;
  std::int64_t input_wait0_ = activity_nanoseconds(activity::input_wait);
  std::int64_t checkpoint0_ = activity_nanoseconds(activity::checkpoint);
};

}  // namespace distribute::detail
