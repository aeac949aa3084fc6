#pragma once
// The meeting point of the replica threads of one process: a generation barrier that can fail.
//
// All of the barrier's state is one atomic word (generation, arrivals, aborted bit), so that the last
// arrival completing a barrier and a waiter giving up on it (timeout, a departed replica) are
// serialised: exactly one of them wins. A waiter that gave up has therefore never been counted in a
// completed barrier, and no other replica can be touching its buffers when it unwinds.
//
// Waiting follows detail/backoff.hpp (spin, yield, then sleep on a wake_word until a deadline), and a
// wait that may fail checks its deadline in each of those phases. With more replicas than hardware
// threads it does not spin. Once a group has failed, the replicas leave without taking a lock, so
// that many of them on a loaded machine do not queue for one.

#include <distribute/detail/backoff.hpp>
#include <distribute/errors.hpp>

#include <atomic>
#include <chrono>
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

  explicit rendezvous(int n) : n_{static_cast<std::uint64_t>(n)} { spin_ = distribute::detail::may_spin(n); }

  // Forget everything: called between steps, when no replica is inside a collective.
  void reset() noexcept {
    state_.store(0, std::memory_order_relaxed);
    departed_.store(0, std::memory_order_relaxed);
    has_cause_.store(false, std::memory_order_relaxed);
    std::lock_guard lk(mu_);
    cause_ = nullptr;
    cause_message_.clear();
  }

  // Arrive and wait for the others. If `may_fail`, gives up at the deadline, when the group is aborted
  // or when a replica departed; otherwise (the second barrier of a collective, which every replica is
  // guaranteed to reach) waits unconditionally. A caller told `departed` or `timed_out` has failed the
  // group, and must then call `abort` with the reason: that releases the others.
  outcome arrive_and_wait(std::chrono::steady_clock::time_point deadline, bool may_fail) {
    std::uint64_t s = state_.load(std::memory_order_acquire);
    for (;;) {
      if (may_fail && (s & aborted_bit)) return outcome::aborted;
      const std::uint64_t arrivals = (s & count_mask) + 1;
      const std::uint64_t next = arrivals == n_ ? ((((s & gen_mask) + gen_one) & gen_mask) | (s & aborted_bit)) : s + 1;
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

  // A replica failed. The first failure is the cause that every other replica reports; later ones
  // change nothing and wake nobody.
  void abort(std::exception_ptr cause, std::string message) {
    bool first = false;
    if (!has_cause_.load(std::memory_order_acquire)) {
      std::lock_guard lk(mu_);
      if (!cause_) {
        cause_ = std::move(cause);
        cause_message_ = std::move(message);
        has_cause_.store(true, std::memory_order_release);
        first = true;
      }
    }
    const std::uint64_t before = state_.fetch_or(aborted_bit, std::memory_order_acq_rel);
    if (first || !(before & aborted_bit)) wake_all();
  }

  // Whether the group has failed in this step (a lock-free read).
  bool aborted() const noexcept { return (state_.load(std::memory_order_acquire) & aborted_bit) != 0; }

  std::exception_ptr cause() const {
    std::lock_guard lk(mu_);
    return cause_;
  }
  // The message of the failure that aborted the group. Whoever sets the aborted bit records a cause
  // right after (a waiter that withdrew does so once it has built its message), so a replica that saw
  // the bit waits here for that moment instead of reporting an empty reason. The message is written
  // once per step, before `has_cause_` is set, and read without the lock.
  std::string cause_message() {
    for (;;) {
      const std::uint32_t seen = wake_.current();
      if (has_cause_.load(std::memory_order_acquire)) return cause_message_;
      wake_.wait_until(seen, std::chrono::steady_clock::time_point::max());
    }
  }

 private:
  bool released(std::uint64_t s, std::uint64_t gen) const noexcept { return (s & gen_mask) != gen; }

  // Give up on a barrier of generation `gen`, unless it completed meanwhile. Returns true if given up.
  // It wakes nobody: the one that gave up records the cause next (`abort`), which wakes the others
  // once, with the reason ready, instead of twice, the first time only to wait for the reason.
  bool withdraw(std::uint64_t gen) noexcept {
    std::uint64_t s = state_.load(std::memory_order_acquire);
    while (!released(s, gen)) {
      if (state_.compare_exchange_weak(s, s | aborted_bit, std::memory_order_acq_rel, std::memory_order_acquire))
        return true;
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
    const auto until = may_fail ? deadline : std::chrono::steady_clock::time_point::max();
    if (distribute::detail::spin_then_yield([&] { return (o = check()).has_value(); }, spin_, until)) return settle(*o);
    for (;;) {
      // Read before checking: a change after the check bumps the word, and the sleep returns at once.
      const std::uint32_t seen = wake_.current();
      if ((o = check())) break;
      if (std::chrono::steady_clock::now() >= until) {
        o = outcome::timed_out;
        break;
      }
      wake_.wait_until(seen, until);
    }
    return settle(*o);
  }

  void wake_all() { wake_.wake_all(); }

  const std::uint64_t n_;
  bool spin_ = false;
  std::atomic<std::uint64_t> state_{0};
  std::atomic<int> departed_{0};
  std::atomic<bool> has_cause_{false};
  distribute::detail::wake_word wake_;
  mutable std::mutex mu_;  // for the cause, while it is being recorded
  std::exception_ptr cause_;
  std::string cause_message_;
};

}  // namespace distribute::comm::detail
