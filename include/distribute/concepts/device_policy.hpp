#pragma once
// What the strategies need to know about a kind of device: its device policy. One strategy template
// serves every device (one_device_strategy<D>, mirrored_strategy<D>); the policy is its only
// device-specific part. The CPU's is strategy/detail/device_policy.hpp, the GPU's
// cuda/strategy/detail/device_policy.cuh; each asserts this concept beside its definition, and the
// strategies assert it for the device they are given.
//
// A policy P (detail::device_policy<D>) has:
//   device_type                        D
//   solo_communicator, solo(device)    the communicator of a group of one on D (collectives no-ops)
//   enter(device)                      held while a replica runs on the calling thread (a GPU made
//                                      current; nothing on the CPU)
//   checked(device, strategy)          the device, or std::invalid_argument naming it and the strategy
//   default_device()                   one_device_strategy's device when none is given
//   replica_group                      the replicas of one process and their communicator group:
//     communicator                     a replica's communicator
//     collective_engine_choice         what a user may choose of it (no_collective_engine_choice: nothing)
//     strategy_name                    for errors
//     all_devices()                    mirrored_strategy's devices when none are given
//     replica_group(devices, collective_options, collective_engine_choice)
//     devices()                        the replicas' devices as the replicas see them (a GPU bound to
//                                      the replica's own stream)
//     endpoint(rank)                   replica `rank`'s communicator
//     meeting()                        where the replicas meet: depart, fail, first_failure, reset,
//                                      options, set_options (strategy/detail/run_loop.hpp)
//     prepare_step()                   before each step (a GPU group rebuilds a broken communicator)
//     hooks()                          the step loop's hooks (strategy/detail/run_loop.hpp)
//     collective_engine()              the engine of collectives it chose (where there is a choice)

#include <distribute/collective_options.hpp>
#include <distribute/concepts/communicator.hpp>
#include <distribute/concepts/device.hpp>

#include <concepts>
#include <vector>

namespace distribute {

template <class P>
concept device_policy =
    device<typename P::device_type> && communicator<typename P::solo_communicator> &&
    communicator<typename P::replica_group::communicator> &&
    requires(const typename P::device_type& d, typename P::replica_group& g, int rank) {
      { P::solo(d) } -> std::convertible_to<typename P::solo_communicator>;
      P::enter(d);
      { P::checked(d, "strategy") } -> std::convertible_to<typename P::device_type>;
      { P::default_device() } -> std::convertible_to<typename P::device_type>;
      typename P::replica_group::collective_engine_choice;
      { P::replica_group::strategy_name } -> std::convertible_to<const char*>;
      { P::replica_group::all_devices() } -> std::convertible_to<std::vector<typename P::device_type>>;
      requires std::constructible_from<typename P::replica_group, std::vector<typename P::device_type>,
                                       collective_options, typename P::replica_group::collective_engine_choice>;
      { g.devices() } -> std::convertible_to<std::vector<typename P::device_type>&>;
      { g.endpoint(rank) } -> std::convertible_to<typename P::replica_group::communicator>;
      g.meeting();
      g.prepare_step();
      g.hooks();
    };

}  // namespace distribute
