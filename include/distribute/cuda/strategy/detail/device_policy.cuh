#pragma once
// The GPU's device policy (the `device_policy` concept, concepts/device_policy.hpp, says what a policy
// has): what makes
// one_device_strategy<cuda> and mirrored_strategy<cuda> the CPU strategies' templates instantiated
// for `cuda`.
//
// A replica makes its GPU current on its thread for the step and waits for its stream before it
// departs. The replicas of one process each get a stream of their own (bound into their device), and
// their collectives run on NCCL when every replica has its own GPU (and NCCL is available), else on
// the cuda_peer kernels (logical replicas sharing a GPU, or GPUs with peer access); `cuda_collective_engine`
// forces one. After a failure, NCCL communicators a failed replica aborted are rebuilt at the next
// step.

#include <distribute/collective_options.hpp>
#include <distribute/config.hpp>
#include <distribute/cuda/comm/cuda_peer.cuh>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/strategy/detail/replica_comm.cuh>
#include <distribute/cuda/strategy/detail/replica_hooks.cuh>
#include <distribute/cuda/tensor/tensor.cuh>
#include <distribute/strategy/detail/device_policy.hpp>
#if DISTRIBUTE_HAS_NCCL
#  include <distribute/cuda/comm/nccl.cuh>
#endif

#include <cstdint>
#include <exception>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace distribute {

// The engine of the collectives of mirrored_strategy<cuda>'s replicas (s.collective_engine()).
enum class cuda_collective_engine : std::uint8_t { automatic, nccl, cuda_peer };

constexpr std::string_view to_string(cuda_collective_engine e) noexcept {
  switch (e) {
    case cuda_collective_engine::automatic: return "automatic";
    case cuda_collective_engine::nccl: return "nccl";
    case cuda_collective_engine::cuda_peer: return "cuda_peer";
  }
  return "unknown";
}

namespace detail {

template <>
struct device_policy<cuda> {
  using device_type = cuda;
  using solo_communicator = comm::cuda_solo;
  static solo_communicator solo(const cuda& device) { return solo_communicator{device.stream()}; }
  static device_guard enter(const cuda& device) { return device_guard(device.index()); }
  static cuda checked(cuda device, const char* strategy) {
    const int n = cuda_device_count();
    if (device.index() < 0 || device.index() >= n)
      throw std::invalid_argument(std::string("distribute: ") + strategy + "<cuda> on " + device.name() + ", but " +
                                  std::to_string(n) + " CUDA device(s) are visible");
    return device;
  }
  static cuda default_device() noexcept { return cuda{0}; }

  class replica_group {
   public:
    using communicator = comm::cuda_replica;
    using collective_engine_choice = cuda_collective_engine;
    static constexpr const char* strategy_name = "mirrored_strategy<cuda>";
    static std::vector<cuda> all_devices() { return all_cuda_devices(); }

    replica_group(const std::vector<cuda>& devices, collective_options options, cuda_collective_engine requested)
        : streams_{make_streams(devices)}, devices_{bind(devices, streams_)}, engine_{choose(devices_, requested)} {
      // Copies between the replicas' GPUs (broadcast of mirrored tensors) read pool memory of another
      // GPU: opened where the GPUs can reach each other (elsewhere the driver stages them).
      for (const auto& a : devices_)
        for (const auto& b : devices_) (void)share_pool(a.index(), b.index());
      if (engine_ == cuda_collective_engine::cuda_peer) {
        peer_ = std::make_unique<comm::cuda_peer_group>(devices_, options);
      } else {
#if DISTRIBUTE_HAS_NCCL
        nccl_ = std::make_unique<comm::nccl_group>(devices_, options);
#endif
      }
    }

    std::vector<cuda>& devices() noexcept { return devices_; }
    const std::vector<cuda>& devices() const noexcept { return devices_; }
    cuda_collective_engine collective_engine() const noexcept { return engine_; }

    communicator endpoint(int rank) {
#if DISTRIBUTE_HAS_NCCL
      if (nccl_) return communicator{nccl_->endpoint(rank)};
#endif
      return communicator{peer_->endpoint(rank)};
    }

    // Where the replicas meet: the engine's host-side meeting (a type internal to the communicators).
    auto& meeting() const {
#if DISTRIBUTE_HAS_NCCL
      if (nccl_) return nccl_->meeting();
#endif
      return peer_->meeting();
    }

    void prepare_step() {
#if DISTRIBUTE_HAS_NCCL
      if (nccl_ && nccl_->broken()) nccl_->rebuild();
#endif
      meeting().reset();
    }

    // A replica's thread makes its GPU current and drains its stream; after a failure an NCCL kernel
    // that waits for partners that gave up is ended by aborting the replica's communicator (the group
    // is rebuilt at the next step). The peer engine has no communicator to abort.
    auto hooks() {
      return cuda_replica_hooks{devices_, meeting().options().timeout,
                                [this]([[maybe_unused]] int rank) noexcept {
#if DISTRIBUTE_HAS_NCCL
                                  if (nccl_) nccl_->abort_replica(rank);
#endif
                                },
                                [](const std::exception_ptr&) {}};
    }

   private:
    static std::vector<owned_stream> make_streams(const std::vector<cuda>& devices) {
      std::vector<owned_stream> out;
      out.reserve(devices.size());
      for (const auto& d : devices) out.emplace_back(d.index());
      return out;
    }
    static std::vector<cuda> bind(const std::vector<cuda>& devices, const std::vector<owned_stream>& streams) {
      std::vector<cuda> out;
      for (std::size_t r = 0; r < devices.size(); ++r) out.push_back(devices[r].on(streams[r].get()));
      return out;
    }
    static cuda_collective_engine choose(const std::vector<cuda>& devices, cuda_collective_engine requested) {
      std::set<int> ordinals;
      for (const auto& d : devices) ordinals.insert(d.index());
      const bool distinct = ordinals.size() == devices.size();
      if (requested == cuda_collective_engine::nccl && !DISTRIBUTE_HAS_NCCL)
        throw std::invalid_argument(
            "distribute: mirrored_strategy<cuda> was asked for NCCL, which this build lacks (<nccl.h>)");
      if (requested == cuda_collective_engine::nccl && !distinct)
        throw std::invalid_argument(
            "distribute: NCCL takes one replica per GPU, and the device list repeats a GPU "
            "(use cuda_collective_engine::cuda_peer, or automatic, for logical replicas on one GPU)");
      if (requested != cuda_collective_engine::automatic) return requested;
      // One replica talks to nobody: cuda_peer's collectives are then its own buffers, where an NCCL
      // communicator of one rank would cost its start-up and device memory for nothing.
      return distinct && devices.size() >= 2 && DISTRIBUTE_HAS_NCCL ? cuda_collective_engine::nccl
                                                                    : cuda_collective_engine::cuda_peer;
    }

    std::vector<owned_stream> streams_;
    std::vector<cuda> devices_;
    cuda_collective_engine engine_;
    std::unique_ptr<comm::cuda_peer_group> peer_;
#if DISTRIBUTE_HAS_NCCL
    std::unique_ptr<comm::nccl_group> nccl_;
#endif
  };
};

static_assert(distribute::device_policy<device_policy<cuda>>);

}  // namespace detail

// The name cuda_collective_engine had before.
using cuda_engine [[deprecated("distribute: cuda_engine is now cuda_collective_engine")]] = cuda_collective_engine;

}  // namespace distribute
