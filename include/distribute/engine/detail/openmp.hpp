#pragma once
// OpenMP for the CPU engine's libraries: a scope in which the calling thread's parallel regions, and
// the libraries that take their thread count from OpenMP (oneDNN when it makes a primitive, Eigen),
// run on one thread; and a loop over independent items on a team of threads that carries the first
// exception out of the region (an exception must not leave an OpenMP region). Without OpenMP both
// run on the calling thread.

#include <cstdint>
#include <exception>
#if defined(_OPENMP)
#  include <omp.h>
#endif

namespace distribute::detail {

class one_openmp_thread {
 public:
  one_openmp_thread() noexcept {
#if defined(_OPENMP)
    saved_ = omp_get_max_threads();
    omp_set_num_threads(1);
#endif
  }
  ~one_openmp_thread() {
#if defined(_OPENMP)
    omp_set_num_threads(saved_);
#endif
  }
  one_openmp_thread(const one_openmp_thread&) = delete;
  one_openmp_thread& operator=(const one_openmp_thread&) = delete;

 private:
  int saved_ = 1;
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
