#pragma once
// What the machine offers this process.

#include <thread>

#if defined(__linux__)
#  include <sched.h>
#endif
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#  include <cpuid.h>
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

// Whether the CPU has bfloat16 arithmetic units: AVX512-BF16 (CPUID leaf 7 subleaf 1, EAX bit 5) or
// AMX-BF16 (leaf 7 subleaf 0, EDX bit 22). False on other architectures.
inline bool cpu_has_bf16_units() noexcept {
#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
  unsigned r[4] = {0, 0, 0, 0};  // eax, ebx, ecx, edx
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, r[0], r[1], r[2], r[3]);
  const bool amx_bf16 = (r[3] >> 22) & 1u;
  __cpuid_count(7, 1, r[0], r[1], r[2], r[3]);
  const bool avx512_bf16 = (r[0] >> 5) & 1u;
  return amx_bf16 || avx512_bf16;
#else
  return false;
#endif
}

}  // namespace distribute::detail
