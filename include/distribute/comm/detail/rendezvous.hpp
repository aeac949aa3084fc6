#pragma once
// The meeting point of the replica threads of one process: a generation barrier that can fail.
//
// All of the barrier's state is one atomic word (generation, arrivals, aborted bit), so that the last
// arrival completing a barrier and a waiter giving up on it (timeout, a departed replica) are
// serialised: exactly one of them wins. A waiter that gave up has therefore never been counted in a
// completed barrier, and no other replica can be touching its buffers when it unwinds.
//
// Waiting follows detail/backoff.hpp (spin, yield, then block on a condition variable with a
// deadline). With more replicas than hardware threads it does not spin.

#include <distribute/detail/backoff.hpp>
#include <distribute/errors.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string>


namespace distribute::comm::detail {

class rendezvous {
  // state word: [63] aborted, [62..32] generation (31 bits, wraps), [31..0] arrivals
  static constexpr std::uint64_t aborted_bit = std::uint64_t{1} << 63;
  static constexpr std::uint64_t gen_one = std::uint64_t{1} << 32;
  static constexpr std::uint64_t count_mask = gen_one - 1;
  static constexpr std::uint64_t gen_mask = ~aborted_bit & ~count_mask;

 public:
  // Why a wait ended without the barrier completing.
  enum class outcome { completed, aborted, departed, timed_out };

  explicit rendezvous(int n) : n_{static_cast<std::uint64_t>(n)} {
    spin_ = distribute::detail::may_spin(n);
  }

  // Forget everything: called between steps, when no replica is inside a collective.
  void reset() noexcept {
    state_.store(0, std::memory_order_relaxed);
    departed_.store(0, std::memory_order_relaxed);
    std::lock_guard lk(mu_);
    cause_ = nullptr;
    cause_message_.clear();
  }

  // Arrive and wait for the others. If `may_fail`, gives up at the deadline, when the group is aborted
  // or when a replica departed; otherwise (the second barrier of a collective, which every replica is
  // guaranteed to reach) waits unconditionally.
  outcome arrive_and_wait(std::chrono::steady_clock::time_point deadline, bool may_fail) {
    std::uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      if (may_fail && (s & aborted_bit)) return outcome::aborted;
      const std::uint64_t arrivals = (s & count_mask) + 1;
      const std::uint64_t next = arrivals == n_ ? ((((s & gen_mask) + gen_one) & gen_mask) | (s & aborted_bit))
                                                : s + 1;
      if (state_.compare_exchange_weak(s, next, std::memory_order_acq_rel, std::memory_order_acquire)) {
        if (arrivals == n_) {
          wake_all();
          return outcome::completed;
        }
        return wait_for_generation(s & gen_mask, deadline, may_fail);
      }
    }
  }

  // A replica finished its step function. Waiters that still need it give up at once.
  void depart() {
    departed_.fetch_add(1, std::memory_order_acq_rel);
    wake_all();
  }

  // A replica failed. The first failure is the cause that every other replica reports.
  void abort(std::exception_ptr cause, std::string message) {
    {
      std::lock_guard lk(mu_);
      if (!cause_) {
        cause_ = std::move(cause);
        cause_message_ = std::move(message);
      }
    }
    state_.fetch_or(aborted_bit, std::memory_order_acq_rel);
    wake_all();
  }

  std::exception_ptr cause() const {
    std::lock_guard lk(mu_);
    return cause_;
  }
  // The message of the failure that aborted the group. Whoever sets the aborted bit records a cause
  // right after (a waiter that withdrew does so once it has built its message), so a replica that saw
  // the bit waits here for that moment instead of reporting an empty reason.
  std::string cause_message() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return cause_ != nullptr; });
    return cause_message_;
  }

 private:
  bool released(std::uint64_t s, std::uint64_t gen) const noexcept { return (s & gen_mask) != gen; }

  // Give up on a barrier of generation `gen`, unless it completed meanwhile. Returns true if given up.
  bool withdraw(std::uint64_t gen) noexcept {
    std::uint64_t s = state_.load(std::memory_order_acquire);
    while (!released(s, gen)) {
      if (state_.compare_exchange_weak(s, s | aborted_bit, std::memory_order_acq_rel, std::memory_order_acquire)) {
        wake_all();
        return true;
      }
    }
    return false;
  }

  outcome wait_for_generation(std::uint64_t gen, std::chrono::steady_clock::time_point deadline, bool may_fail) {
    // What the shared state says now; `completed` means keep waiting only when `none`.
    auto check = [&]() -> std::optional<outcome> {
      const std::uint64_t s = state_.load(std::memory_order_acquire);
      if (released(s, gen)) return outcome::completed;
      if (!may_fail) return std::nullopt;
      if (s & aborted_bit) return outcome::aborted;
      if (departed_.load(std::memory_order_acquire) != 0) return outcome::departed;
      return std::nullopt;
    };
    // Giving up must not race with the barrier completing; `withdraw` decides which came first.
    auto settle = [&](outcome o) {
      if (o == outcome::departed || o == outcome::timed_out) return withdraw(gen) ? o : outcome::completed;
      return o;
    };
    std::optional<outcome> o;
    if (distribute::detail::spin_then_yield([&] { return (o = check()).has_value(); }, spin_)) return settle(*o);
    {
      std::unique_lock lk(mu_);
      while (!(o = check())) {
        if (!may_fail) {
          cv_.wait(lk);
        } else if (cv_.wait_until(lk, deadline) == std::cv_status::timeout) {
          if (!(o = check())) o = outcome::timed_out;
          break;
        }
      }
    }
    return settle(*o);
  }

  void wake_all() {
    // Taking the mutex orders this wake-up after any waiter's predicate check: no lost wake-ups.
    { std::lock_guard lk(mu_); }
    cv_.notify_all();
  }


  const std::uint64_t n_;
  bool spin_ = false;
  std::atomic<std::uint64_t> state_{0};
  std::atomic<int> departed_{0};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::exception_ptr cause_;
  std::string cause_message_;
};

}  // namespace distribute::comm::detail
