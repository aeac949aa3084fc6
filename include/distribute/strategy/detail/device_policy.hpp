#pragma once
// The CPU's device policy: what one_device_strategy<cpu> and mirrored_strategy<cpu> need to know
// about the CPU (the `device_policy` concept, concepts/device_policy.hpp, says what a policy has).
// The GPU's is cuda/strategy/detail/device_policy.cuh.

#include <distribute/collective_options.hpp>
#include <distribute/comm/local.hpp>
#include <distribute/comm/shared_memory.hpp>
#include <distribute/concepts/device_policy.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/strategy/detail/run_loop.hpp>

#include <utility>
#include <vector>

namespace distribute::detail {

template <class D>
struct device_policy;  // one specialisation per device

// A group whose communicator the user does not choose.
struct no_collective_engine_choice {};

template <>
struct device_policy<cpu> {
  using device_type = cpu;
  using solo_communicator = comm::local;
  static solo_communicator solo(const cpu&) noexcept { return {}; }
  struct entered {};
  static entered enter(const cpu&) noexcept { return {}; }
  static cpu checked(cpu device, const char*) noexcept { return device; }
  static cpu default_device() noexcept { return cpu{}; }

  // CPU replicas are threads of this process; their collectives work on each other's memory.
  class replica_group {
   public:
    using communicator = comm::shared_memory;
    using collective_engine_choice = no_collective_engine_choice;
    static constexpr const char* strategy_name = "mirrored_strategy";
    static std::vector<cpu> all_devices() { return all_cpu_replicas(); }

    replica_group(std::vector<cpu> devices, collective_options options, collective_engine_choice)
        : devices_{std::move(devices)}, group_{static_cast<int>(devices_.size()), options} {}

    std::vector<cpu>& devices() noexcept { return devices_; }
    communicator endpoint(int rank) { return group_.endpoint(rank); }
    comm::shared_memory_group& meeting() noexcept { return group_; }
    const comm::shared_memory_group& meeting() const noexcept { return group_; }
    void prepare_step() { group_.reset(); }
    no_replica_hooks hooks() const noexcept { return {}; }

   private:
    std::vector<cpu> devices_;
    comm::shared_memory_group group_;
  };
};

static_assert(distribute::device_policy<device_policy<cpu>>);

}  // namespace distribute::detail
