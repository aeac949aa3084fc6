#pragma once
// What the strategies need to know about a kind of device: its device policy. One strategy template
// serves every device (one_device_strategy<D>, mirrored_strategy<D>); the policy is its only
// device-specific part. The CPU's policy is here, the GPU's in strategy/detail/cuda_device_policy.cuh.
//
// device_policy<D> has:
//   solo_communicator                  the communicator of a group of one on D (collectives no-ops)
//   solo(device)                       one of them, for a replica on `device`
//   enter(device)                      held while a replica runs on the calling thread (a GPU made
//                                      current; nothing on the CPU)
//   checked(device, strategy)          the device, or std::invalid_argument naming it and the strategy
//   default_device()                   one_device_strategy's device when none is given
//   replica_group                      the replicas of one process and their communicator group:
//     communicator, engine_choice      a replica's communicator; the engine a user may choose
//     strategy_name                    for errors
//     all_devices()                    mirrored_strategy's devices when none are given
//     replica_group(devices, collective_options, engine_choice)
//     devices()                        the replicas' devices as the replicas see them (a GPU bound to
//                                      the replica's own stream)
//     endpoint(rank)                   replica `rank`'s communicator
//     meeting()                        where the replicas meet: depart, fail, first_failure, reset,
//                                      options, set_options (detail/run_loop.hpp)
//     prepare_step()                   before each step (a GPU group rebuilds a broken communicator)
//     hooks()                          the step loop's hooks (detail/run_loop.hpp)
//     engine()                         the engine it chose (where engine_choice is not no_engine_choice)

#include <distribute/collective_options.hpp>
#include <distribute/comm/local.hpp>
#include <distribute/comm/shared_memory.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/strategy/detail/run_loop.hpp>

#include <utility>
#include <vector>

namespace distribute::detail {

template <class D>
struct device_policy;  // one specialisation per device

// A group whose communicator the user does not choose.
struct no_engine_choice {};

template <>
struct device_policy<cpu> {
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
    using engine_choice = no_engine_choice;
    static constexpr const char* strategy_name = "mirrored_strategy";
    static std::vector<cpu> all_devices() { return all_cpu_replicas(); }

    replica_group(std::vector<cpu> devices, collective_options options, engine_choice)
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

}  // namespace distribute::detail
