#pragma once
// mirrored_strategy on GPUs: one replica per device of the list, each on its own persistent thread
// (replica 0 on the caller's) with its own stream, and the device made current on that thread.
//
//   mirrored_strategy<cuda> s;                                  every visible GPU
//   mirrored_strategy<cuda> s{{cuda{0}, cuda{2}}};              a device list
//   mirrored_strategy<cuda> s{cuda_replicas(4)};                4 logical replicas sharing cuda:0
//
// The engine: NCCL when every replica has its own GPU (and NCCL is available), else our cuda_peer
// kernels (logical replicas sharing a GPU, or GPUs with peer access); `cuda_engine` forces one.
//
// The step semantics are the CPU strategy's (strategy/mirrored_strategy.hpp): per-replica arguments
// unwrapped, a throwing replica makes the others' collectives fail at once and `run` rethrows it, a
// collective a replica never joins fails with `collective_timeout`, mismatched collectives with
// `collective_mismatch`, and the next `run` starts clean (NCCL communicators aborted by a failure are
// rebuilt). In addition, `run` returns only once every replica's stream has finished the work the
// step queued on it, so results read after `run` are complete.

#include <distribute/collective_options.hpp>
#include <distribute/comm/cuda_peer.cuh>
#include <distribute/concepts/strategy.hpp>
#include <distribute/config.hpp>
#include <distribute/device/cuda.cuh>
#include <distribute/per_replica.hpp>
#include <distribute/replica_context.hpp>
#include <distribute/strategy/detail/cuda_replica_comm.cuh>
#include <distribute/strategy/detail/cuda_replica_hooks.cuh>
#include <distribute/strategy/detail/replica_pool.hpp>
#include <distribute/strategy/detail/strategy_base.hpp>
#include <distribute/strategy/mirrored_strategy.hpp>
#include <distribute/tensor/cuda_tensor.cuh>
#if DISTRIBUTE_HAS_NCCL
#  include <distribute/comm/nccl.cuh>
#endif

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute {

enum class cuda_engine : std::uint8_t { automatic, nccl, cuda_peer };

constexpr std::string_view to_string(cuda_engine e) noexcept {
  switch (e) {
    case cuda_engine::automatic: return "automatic";
    case cuda_engine::nccl: return "nccl";
    case cuda_engine::cuda_peer: return "cuda_peer";
  }
  return "unknown";
}

template <>
class mirrored_strategy<cuda> : public strategy_base<mirrored_strategy<cuda>, std::dynamic_extent> {
 public:
  using device_type = cuda;
  using replica_type = replica_context<cuda, comm::cuda_replica>;
  // The context of `run_on_primary`: the primary device, a group of one.
  using primary_replica_type = replica_context<cuda, comm::cuda_solo>;

  // One replica per visible GPU.
  mirrored_strategy() : mirrored_strategy(all_cuda_devices()) {}
  explicit mirrored_strategy(std::vector<cuda> devices, collective_options options = {},
                             cuda_engine engine = cuda_engine::automatic)
      : state_{std::make_unique<state>(check_devices(std::move(devices)), options, engine)} {}

  int num_replicas_in_sync() const noexcept { return static_cast<int>(state_->devices.size()); }
  // The replicas' devices, each bound to its replica's stream.
  std::span<const cuda> devices() const noexcept { return state_->devices; }
  // The engine the strategy chose (never `automatic`).
  cuda_engine engine() const noexcept { return state_->engine; }

  const collective_options& options() const noexcept { return state_->meeting().options(); }
  // Between steps only.
  void set_options(collective_options options) { state_->meeting().set_options(options); }

  template <class F, class... A>
  auto run(F&& fn, A&&... args) {
    state& st = *state_;
    const detail::exclusive_step exclusive(st.in_step, "mirrored_strategy<cuda>");
    (detail::check_run_argument(args, st.devices.size()), ...);
    st.prepare_step();
    auto& meeting = st.meeting();
    detail::cuda_replica_hooks hooks{st.devices, meeting.options().timeout, [&st](int rank) noexcept { st.abort_replica(rank); },
                                     [](const std::exception_ptr&) {}};
    return detail::run_replicas(st.pool, st.replicas, meeting, st.steps++, hooks, fn, args...);
  }

  // Calls `fn(primary, args...)` once, on the calling thread, on the primary device as a group of
  // one (collectives are no-ops). `broadcast` afterwards brings mirrored state back into sync.
  template <class F, class... A>
  decltype(auto) run_on_primary(F&& fn, A&&... args) {
    const cuda& dev = state_->devices[0];
    const detail::device_guard current(dev.index());
    primary_replica_type r{dev, comm::cuda_solo{dev.stream()}};
    return std::invoke(fn, r, detail::unwrap_for(args, 0)...);
  }

 private:
  friend class strategy_base<mirrored_strategy<cuda>, std::dynamic_extent>;

  struct state {
    state(std::vector<cuda> devs, collective_options options, cuda_engine requested)
        : streams{make_streams(devs)},
          devices{bind(devs, streams)},
          engine{choose(devices, requested)},
          pool(static_cast<int>(devices.size())) {
      const int n = static_cast<int>(devices.size());
      // Copies between the replicas' GPUs (broadcast of mirrored tensors) read pool memory of
      // another GPU: opened where the GPUs can reach each other (elsewhere the driver stages them).
      for (const auto& a : devices)
        for (const auto& b : devices) (void)detail::share_pool(a.index(), b.index());
      if (engine == cuda_engine::cuda_peer) {
        peer = std::make_unique<comm::cuda_peer_group>(devices, options);
        for (int r = 0; r < n; ++r) replicas.emplace_back(devices[static_cast<std::size_t>(r)], comm::cuda_replica{peer->endpoint(r)});
      } else {
#if DISTRIBUTE_HAS_NCCL
        nccl = std::make_unique<comm::nccl_group>(devices, options);
        for (int r = 0; r < n; ++r) replicas.emplace_back(devices[static_cast<std::size_t>(r)], comm::cuda_replica{nccl->endpoint(r)});
#endif
      }
    }

    comm::detail::gpu_meeting& meeting() const {
#if DISTRIBUTE_HAS_NCCL
      if (nccl) return nccl->meeting();
#endif
      return peer->meeting();
    }

    // Ends an NCCL kernel of replica `rank` that waits for partners that gave up (the step loop's
    // hooks call it once a failed replica's work has not finished within the collective timeout);
    // the group is rebuilt at the next step. The peer engine has no communicator to abort.
    void abort_replica([[maybe_unused]] int rank) noexcept {
#if DISTRIBUTE_HAS_NCCL
      if (nccl) nccl->abort_replica(rank);
#endif
    }

    void prepare_step() {
#if DISTRIBUTE_HAS_NCCL
      if (nccl && nccl->broken()) nccl->rebuild();
#endif
      meeting().reset();
    }

    static std::vector<detail::owned_stream> make_streams(const std::vector<cuda>& devs) {
      std::vector<detail::owned_stream> out;
      out.reserve(devs.size());
      for (const auto& d : devs) out.emplace_back(d.index());
      return out;
    }
    static std::vector<cuda> bind(const std::vector<cuda>& devs, const std::vector<detail::owned_stream>& streams) {
      std::vector<cuda> out;
      for (std::size_t r = 0; r < devs.size(); ++r) out.push_back(devs[r].on(streams[r].get()));
      return out;
    }
    static cuda_engine choose(const std::vector<cuda>& devs, cuda_engine requested) {
      std::set<int> ordinals;
      for (const auto& d : devs) ordinals.insert(d.index());
      const bool distinct = ordinals.size() == devs.size();
      if (requested == cuda_engine::nccl && !DISTRIBUTE_HAS_NCCL)
        throw std::invalid_argument("distribute: mirrored_strategy<cuda> was asked for NCCL, which this build lacks (<nccl.h>)");
      if (requested == cuda_engine::nccl && !distinct)
        throw std::invalid_argument("distribute: NCCL takes one replica per GPU, and the device list repeats a GPU "
                                    "(use cuda_engine::cuda_peer, or automatic, for logical replicas on one GPU)");
      if (requested != cuda_engine::automatic) return requested;
      return distinct && DISTRIBUTE_HAS_NCCL ? cuda_engine::nccl : cuda_engine::cuda_peer;
    }

    std::vector<detail::owned_stream> streams;
    std::vector<cuda> devices;
    cuda_engine engine;
    std::unique_ptr<comm::cuda_peer_group> peer;
#if DISTRIBUTE_HAS_NCCL
    std::unique_ptr<comm::nccl_group> nccl;
#endif
    std::vector<replica_type> replicas;
    std::atomic<bool> in_step{false};
    std::int64_t steps = 0;  // `run` calls started: collectives name their step (collective_origin.hpp)
    detail::replica_pool pool;  // last: its threads stop before the rest is destroyed
  };

  static std::vector<cuda> check_devices(std::vector<cuda> devices) {
    if (devices.empty()) throw std::invalid_argument("distribute: mirrored_strategy<cuda> needs at least one device");
    const int n = cuda_device_count();
    for (const auto& d : devices)
      if (d.index() < 0 || d.index() >= n)
        throw std::invalid_argument("distribute: mirrored_strategy<cuda> on " + d.name() + ", but " + std::to_string(n) +
                                    " CUDA device(s) are visible");
    return devices;
  }

  std::vector<cuda>& devices_for_factory() noexcept { return state_->devices; }

  std::unique_ptr<state> state_;
};

static_assert(strategy<mirrored_strategy<cuda>>);

}  // namespace distribute
