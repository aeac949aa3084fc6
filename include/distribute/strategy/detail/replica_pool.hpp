#pragma once
// Persistent threads for replicas 1..n-1; replica 0 runs on the calling thread. A step hands every
// thread the same job and waits until all of them have finished it. Threads live as long as the
// strategy, so a step costs two wake-ups, not n thread creations.
//
// Jobs must not throw: the strategy catches each replica's exception inside the job.

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace distribute::detail {

class replica_pool {
 public:
  explicit replica_pool(int n) : n_{n} {
    threads_.reserve(static_cast<std::size_t>(n > 0 ? n - 1 : 0));
    for (int rank = 1; rank < n; ++rank) threads_.emplace_back([this, rank] { serve(rank); });
  }
  replica_pool(const replica_pool&) = delete;
  replica_pool& operator=(const replica_pool&) = delete;
  ~replica_pool() {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    job_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  int size() const noexcept { return n_; }

  // Runs `job(rank)` for every rank concurrently and returns when all have returned.
  template <class Job>
  void run(Job& job) noexcept {
    {
      std::lock_guard lk(mu_);
      fn_ = [](void* ctx, int rank) noexcept { (*static_cast<Job*>(ctx))(rank); };
      ctx_ = &job;
      pending_ = n_ - 1;
      ++generation_;
    }
    job_cv_.notify_all();
    job(0);
    std::unique_lock lk(mu_);
    done_cv_.wait(lk, [&] { return pending_ == 0; });
  }

 private:
  void serve(int rank) {
    std::uint64_t seen = 0;
    for (;;) {
      void (*fn)(void*, int) noexcept;
      void* ctx;
      {
        std::unique_lock lk(mu_);
        job_cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        fn = fn_;
        ctx = ctx_;
      }
      fn(ctx, rank);
      bool last;
      {
        std::lock_guard lk(mu_);
        last = --pending_ == 0;
      }
      if (last) done_cv_.notify_one();
    }
  }

  int n_;
  std::mutex mu_;
  std::condition_variable job_cv_, done_cv_;
  void (*fn_)(void*, int) noexcept = nullptr;
  void* ctx_ = nullptr;
  int pending_ = 0;
  std::uint64_t generation_ = 0;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace distribute::detail
