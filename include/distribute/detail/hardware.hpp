#pragma once
// What the machine offers this process.

#include <thread>

#if defined(__linux__)
#  include <sched.h>
#endif

namespace distribute::detail {

// The hardware threads this process may run on: its affinity mask where the system has one (a job
// pinned by taskset, srun or mpirun sees its share, not the whole machine).
inline unsigned usable_hardware_threads() noexcept {
#if defined(__linux__) && defined(CPU_COUNT)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return static_cast<unsigned>(n);
  }
#endif
  return std::thread::hardware_concurrency();
}

}  // namespace distribute::detail
