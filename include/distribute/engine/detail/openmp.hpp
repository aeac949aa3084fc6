#pragma once
// OpenMP for the CPU engine's libraries: a scope in which the calling thread's parallel regions, and
// the libraries that take their thread count from OpenMP (oneDNN when it makes a primitive, Eigen),
// run on a given count of threads (or one); and a loop over independent items on a team of threads that carries the first
// exception out of the region (an exception must not leave an OpenMP region). Without OpenMP both
// run on the calling thread.

#include <cstdint>
#include <exception>
#if defined(_OPENMP)
#  include <omp.h>
#endif

namespace distribute::detail {

// A scope in which the calling thread's parallel regions get `count` threads (at least one).
class openmp_thread_count {
 public:
  explicit openmp_thread_count(int count) noexcept {
#if defined(_OPENMP)
    saved_ = omp_get_max_threads();
    omp_set_num_threads(count < 1 ? 1 : count);
#else
    (void)count;
#endif
  }
  ~openmp_thread_count() {
#if defined(_OPENMP)
    omp_set_num_threads(saved_);
#endif
  }
  openmp_thread_count(const openmp_thread_count&) = delete;
  openmp_thread_count& operator=(const openmp_thread_count&) = delete;

 private:
  int saved_ = 1;
};

class one_openmp_thread : public openmp_thread_count {
 public:
  one_openmp_thread() noexcept : openmp_thread_count{1} {}
};

// The calling thread's OpenMP thread count (the team its next parallel region gets); 1 without OpenMP.
inline int openmp_threads() noexcept {
#if defined(_OPENMP)
  return omp_get_max_threads();
#else
  return 1;
#endif
}

// f(item) for every item in [0, items), split statically over `team` threads (at least one); the
// first exception any call threw is rethrown once all have finished.
template <class F>
void parallel_items(std::int64_t items, int team, F&& f) {
  std::exception_ptr failed;
#if defined(_OPENMP)
#  pragma omp parallel for num_threads(team < 1 ? 1 : team) schedule(static)
#else
  (void)team;
#endif
  for (std::int64_t item = 0; item < items; ++item) {
    try {
      f(item);
    } catch (...) {
#if defined(_OPENMP)
#  pragma omp critical(distribute_parallel_items)
#endif
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
}

}  // namespace distribute::detail
