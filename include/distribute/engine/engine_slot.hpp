#pragma once
// Where a strategy keeps the compute engine of one replica: its options (compute_options, set by
// strategy.set_compute_options), its share of the cores, and the engine, made on first use. The slot
// names the engine's type, `engine<D>`, but does not need its definition: strategies are core headers,
// and an engine (engine/cpu.hpp) brings its libraries only into programs that compute, where
// `get` is first called. The options' path is strategy -> engine_slot<D> -> engine<D>(options, share).

#include <distribute/concepts/device.hpp>
#include <distribute/detail/hardware.hpp>
#include <distribute/engine/compute_options.hpp>
#include <distribute/engine/engine.hpp>

#include <memory>
#include <type_traits>

namespace distribute {

template <device D>
class engine_slot {
 public:
  // The engine of a replica on `device` (a GPU engine works on the device's stream), made on first
  // use with the slot's options and share.
  engine<D>& get(const D& device) {
    if (!instance_) {
      if constexpr (std::is_constructible_v<engine<D>, compute_options, int, D>)
        instance_ = std::make_shared<engine<D>>(options_, share_, device);
      else instance_ = std::make_shared<engine<D>>(options_, share_);
    }
    return *instance_;
  }
  // New options and share; the engine is made anew at its next use (with empty caches).
  void reset(const compute_options& options, int share) {
    options_ = options;
    share_ = share;
    instance_.reset();
  }

 private:
  compute_options options_{};
  int share_ = 0;  // threads when options_.threads is 0; 0: every core
  std::shared_ptr<engine<D>> instance_;
};

// The cores this process may run on, divided among `replicas` threads (at least one each).
inline int core_share(int replicas) noexcept {
  const int cores = static_cast<int>(detail::usable_hardware_threads());
  const int each = cores / (replicas > 0 ? replicas : 1);
  return each > 0 ? each : 1;
}

}  // namespace distribute
