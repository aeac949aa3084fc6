#pragma once
// Where a strategy keeps the engine of one replica without naming the engine's type: strategies are
// core headers, and an engine (engine/cpu.hpp) brings its libraries only into programs that compute.
// The slot holds the options and the replica's share of the cores; the engine itself is made on
// first use, by code that includes it, and lives as long as the strategy.

#include <distribute/concepts/device.hpp>
#include <distribute/detail/hardware.hpp>
#include <distribute/engine/engine.hpp>

#include <memory>
#include <type_traits>

namespace distribute::detail {

struct engine_slot {
  engine_options options{};
  int share = 0;  // threads when options.threads is 0; 0: every core
  std::shared_ptr<void> instance;

  // The engine of a replica on `device` (a GPU engine works on the device's stream).
  template <device D>
  engine<D>& get(const D& device) {
    if (!instance) {
      if constexpr (std::is_constructible_v<engine<D>, engine_options, int, D>)
        instance = std::make_shared<engine<D>>(options, share, device);
      else
        instance = std::make_shared<engine<D>>(options, share);
    }
    return *static_cast<engine<D>*>(instance.get());
  }
  void reset(engine_options o, int s) {
    options = o;
    share = s;
    instance.reset();
  }
};

// The cores this process may run on, divided among `replicas` threads (at least one each).
inline int core_share(int replicas) noexcept {
  const int cores = static_cast<int>(usable_hardware_threads());
  return cores / (replicas > 0 ? replicas : 1) > 0 ? cores / (replicas > 0 ? replicas : 1) : 1;
}

}  // namespace distribute::detail
