#pragma once
// A thread of its own that runs the tasks it is given one at a time, in the order they were posted:
// what lets a replica's collectives go on while the replica computes, in the one order every
// replica issues them. The first task that throws stops it: the tasks after it are not run, and
// `drain` rethrows that exception (to every caller, as often as asked).
//
// Each task runs with the collective origin (collective_origin.hpp) its poster had when posting, so
// errors name the API and the step the replica was in, as they would had it called the collective
// itself.

#include <distribute/collective_origin.hpp>

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace distribute::detail {

class ordered_worker {
 public:
  ordered_worker() : thread_{[this] { loop(); }} {}
  // Tasks not started are dropped; the one running finishes first (a collective ends, or fails when
  // its group is aborted or its timeout passes).
  ~ordered_worker() {
    {
      const std::lock_guard lock{m_};
      stop_ = true;
      tasks_.clear();
    }
    wake_.notify_all();
    thread_.join();
  }
  ordered_worker(const ordered_worker&) = delete;
  ordered_worker& operator=(const ordered_worker&) = delete;

  void post(std::function<void()> task) {
    {
      const std::lock_guard lock{m_};
      tasks_.push_back({std::move(task), current_origin});
    }
    wake_.notify_all();
  }

  // Waits until every task posted so far has run; rethrows the first failure.
  void drain() {
    std::unique_lock lock{m_};
    done_.wait(lock, [&] { return (tasks_.empty() && !busy_) || failure_; });
    if (failure_) std::rethrow_exception(failure_);
  }

 private:
  struct task {
    std::function<void()> run;
    collective_origin origin;
  };

  void loop() {
    std::unique_lock lock{m_};
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (stop_) return;
      task t = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
      lock.unlock();
      std::exception_ptr error;
      try {
        current_origin = t.origin;
        t.run();
      } catch (...) {
        error = std::current_exception();
      }
      lock.lock();
      busy_ = false;
      if (error) {
        failure_ = error;
        tasks_.clear();
        stop_ = true;
      }
      done_.notify_all();
      if (stop_) return;
    }
  }

  std::mutex m_;
  std::condition_variable wake_, done_;
  std::deque<task> tasks_;
  bool busy_ = false, stop_ = false;
  std::exception_ptr failure_;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace distribute::detail
