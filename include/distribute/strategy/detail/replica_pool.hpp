#pragma once
// Persistent threads for replicas 1..n-1; replica 0 runs on the calling thread. A step hands every
// thread the same job and waits until all of them have finished it. Threads live as long as the
// strategy, and between steps they wait as detail/backoff.hpp says (spin, yield, then sleep), so a
// training loop that calls `run` back to back pays a few microseconds per step, not two sleeps and
// wake-ups.
//
// Jobs must not throw: the strategy catches each replica's exception inside the job.

#include <distribute/detail/backoff.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace distribute::detail {

class replica_pool {
 public:
  explicit replica_pool(int n) : n_{n}, spin_{may_spin(n)} {
    threads_.reserve(static_cast<std::size_t>(n > 0 ? n - 1 : 0));
    for (int rank = 1; rank < n; ++rank) threads_.emplace_back([this, rank] { serve(rank); });
  }
  replica_pool(const replica_pool&) = delete;
  replica_pool& operator=(const replica_pool&) = delete;
  ~replica_pool() {
    stop_.store(true, std::memory_order_release);
    wake(job_cv_);
    for (auto& t : threads_) t.join();
  }

  // Runs `job(rank)` for every rank concurrently and returns when all have returned.
  template <class Job>
  void run(Job& job) noexcept {
    // Published by the release of the new generation; read by the workers after they acquire it.
    fn_ = [](void* ctx, int rank) noexcept { (*static_cast<Job*>(ctx))(rank); };
    ctx_ = &job;
    pending_.store(n_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    wake(job_cv_);
    job(0);
    auto all_done = [&] { return pending_.load(std::memory_order_acquire) == 0; };
    if (spin_then_yield(all_done, spin_)) return;
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, all_done);
  }

 private:
  void serve(int rank) {
    std::uint64_t seen = 0;
    for (;;) {
      auto next = [&] {
        return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
      };
      if (!spin_then_yield(next, spin_)) {
        std::unique_lock lk(mu_);
        job_cv_.wait(lk, next);
      }
      if (stop_.load(std::memory_order_acquire)) return;
      seen = generation_.load(std::memory_order_acquire);
      fn_(ctx_, rank);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) wake(done_cv_);
    }
  }

  // Taking the mutex orders the wake-up after any sleeper's check of its condition: none is lost.
  void wake(std::condition_variable& cv) {
    { std::lock_guard lk(mu_); }
    cv.notify_all();
  }

  int n_;
  bool spin_;
  std::mutex mu_;
  std::condition_variable job_cv_, done_cv_;
  void (*fn_)(void*, int) noexcept = nullptr;
  void* ctx_ = nullptr;
  std::atomic<int> pending_{0};
  std::atomic<std::uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

}  // namespace distribute::detail
