#pragma once
// The communicators the GPU strategies hand their replicas.
//
// `cuda_solo`: a group of one on a GPU (one_device_strategy<cuda>, run_on_primary): comm::local's
// group_of_one, whose reductions are no-ops that compile away, with the copies of all_gather and
// reduce_scatter through cudaMemcpy in the stream's order, because the buffers may be device memory.
//
// `cuda_replica`: one replica of mirrored_strategy<cuda>, on whichever engine the strategy chose when
// it was built (NCCL for one replica per GPU, cuda_peer for logical replicas sharing a GPU). One type
// for both keeps `replica_type` independent of the devices the user passes at run time.

#include <distribute/comm/local.hpp>
#include <distribute/config.hpp>
#include <distribute/cuda/comm/cuda_peer.cuh>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/dtype.hpp>
#include <distribute/reduce_op.hpp>
#if DISTRIBUTE_HAS_NCCL
#  include <distribute/cuda/comm/nccl.cuh>
#endif

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <variant>

namespace distribute::comm {

namespace detail {
// Copies between any pair of host and device memory (the runtime tells them apart by address), in
// the order of the replica's stream, and waits for them.
struct stream_copy {
  cudaStream_t stream = nullptr;
  template <class T>
  void operator()(std::span<const T> in, std::span<T> out) const {
    distribute::detail::cuda_check(cudaMemcpyAsync(out.data(), in.data(), in.size_bytes(), cudaMemcpyDefault, stream),
                                   "cudaMemcpyAsync");
    distribute::detail::cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
};
}  // namespace detail

class cuda_solo : public group_of_one<detail::stream_copy> {
 public:
  cuda_solo() = default;
  explicit cuda_solo(cudaStream_t stream) : group_of_one{detail::stream_copy{stream}} {}
};

class cuda_replica {
 public:
  explicit cuda_replica(cuda_peer e) : e_{e} {}
#if DISTRIBUTE_HAS_NCCL
  explicit cuda_replica(nccl e) : e_{e} {}
#endif

  int rank() const noexcept {
    return std::visit([](const auto& e) { return e.rank(); }, e_);
  }
  int size() const noexcept {
    return std::visit([](const auto& e) { return e.size(); }, e_);
  }
  // Whether this replica's collectives run on NCCL (else on cuda_peer kernels).
  bool uses_nccl() const noexcept { return e_.index() == 1; }

  template <element T>
  void all_reduce(reduce_op op, std::span<T> buf) {
    std::visit([&](auto& e) { e.all_reduce(op, buf); }, e_);
  }
  template <element T>
  void all_reduce(reduce_op op, std::span<const std::span<T>> bufs) {
    std::visit([&](auto& e) { e.all_reduce(op, bufs); }, e_);
  }
  void all_reduce_as_bfloat16(reduce_op op, std::span<const std::span<float>> bufs) {
    std::visit([&](auto& e) { e.all_reduce_as_bfloat16(op, bufs); }, e_);
  }
  template <element T>
  void reduce_scatter(reduce_op op, std::span<const T> in, std::span<T> out) {
    std::visit([&](auto& e) { e.reduce_scatter(op, in, out); }, e_);
  }
  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    std::visit([&](auto& e) { e.all_gather(in, out); }, e_);
  }
  template <element T>
  void broadcast(std::span<T> buf, int root) {
    std::visit([&](auto& e) { e.broadcast(buf, root); }, e_);
  }
  void barrier() {
    std::visit([](auto& e) { e.barrier(); }, e_);
  }

  // NCCL's split phase (the gradient overlap's buckets on a communication stream) and its
  // collectives inside CUDA graphs, passed through where the engine is NCCL. cuda_peer has neither:
  // `splits()` and `captures()` say so at run time, and the overlap and the replica then do not
  // call them (were they called, a start would all-reduce at once and a capture would count nothing).
  bool splits() const noexcept { return uses_nccl(); }
  bool captures() const noexcept { return uses_nccl(); }
  template <element T>
  void start_all_reduce(reduce_op op, std::span<const std::span<T>> bufs) {
    std::visit(
        [&](auto& e) {
          if constexpr (requires { e.start_all_reduce(op, bufs); }) e.start_all_reduce(op, bufs);
          else e.all_reduce(op, bufs);
        },
        e_);
  }
  void start_all_reduce_as_bfloat16(reduce_op op, std::span<const std::span<float>> bufs) {
    std::visit(
        [&](auto& e) {
          if constexpr (requires { e.start_all_reduce_as_bfloat16(op, bufs); })
            e.start_all_reduce_as_bfloat16(op, bufs);
          else e.all_reduce_as_bfloat16(op, bufs);
        },
        e_);
  }
  void finish_started() {
    std::visit(
        [](auto& e) {
          if constexpr (requires { e.finish_started(); }) e.finish_started();
        },
        e_);
  }
  void abandon_started() noexcept {
    std::visit(
        [](auto& e) {
          if constexpr (requires { e.abandon_started(); }) e.abandon_started();
        },
        e_);
  }
  std::size_t take_captured() noexcept {
    return std::visit(
        [](auto& e) -> std::size_t {
          if constexpr (requires { e.take_captured(); }) return e.take_captured();
          else return 0;
        },
        e_);
  }
  std::uint64_t generation() const noexcept {
    return std::visit(
        [](const auto& e) -> std::uint64_t {
          if constexpr (requires { e.generation(); }) return e.generation();
          else return 0;
        },
        e_);
  }
  void hold_graph(std::weak_ptr<std::function<void()>> destroy) {
    std::visit(
        [&](auto& e) {
          if constexpr (requires { e.hold_graph(destroy); }) e.hold_graph(std::move(destroy));
        },
        e_);
  }
  template <class Launch>
  void replay_captured(std::size_t collectives, Launch&& launch) {
    std::visit(
        [&](auto& e) {
          if constexpr (requires { e.replay_captured(collectives, launch); }) e.replay_captured(collectives, launch);
          else launch();
        },
        e_);
  }

 private:
#if DISTRIBUTE_HAS_NCCL
  std::variant<cuda_peer, nccl> e_;
#else
  std::variant<cuda_peer> e_;
#endif
};

}  // namespace distribute::comm
