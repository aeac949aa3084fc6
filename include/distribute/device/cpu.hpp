#pragma once
// The host CPU as a device. Several logical `cpu` devices in one process are replicas that run on
// their own threads and share memory; `index` tells them apart.

#include <distribute/concepts/device.hpp>
#include <distribute/detail/hardware.hpp>

#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace distribute {

class cpu {
 public:
  static constexpr bool host_memory = true;  // device_traits

  constexpr cpu() noexcept = default;
  constexpr explicit cpu(int index) noexcept : index_{index} {}

  constexpr int index() const noexcept { return index_; }
  std::string name() const { return "cpu:" + std::to_string(index_); }

  friend constexpr bool operator==(const cpu&, const cpu&) noexcept = default;

 private:
  int index_ = 0;
};

static_assert(device<cpu>);

// `n` logical CPU devices, cpu:0 .. cpu:n-1: the replicas of a mirrored strategy on the CPU.
inline std::vector<cpu> cpu_replicas(int n) {
  if (n < 1)
    throw std::invalid_argument("distribute::cpu_replicas: need at least one replica, got " + std::to_string(n));
  std::vector<cpu> devices;
  devices.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) devices.emplace_back(i);
  return devices;
}

// One logical CPU replica per hardware thread this process may run on (at least one).
inline std::vector<cpu> all_cpu_replicas() {
  const unsigned n = detail::usable_hardware_threads();
  return cpu_replicas(n == 0 ? 1 : static_cast<int>(n));
}

}  // namespace distribute
