#pragma once
// Collectives between GPU replicas of one process, done by our own kernels on the replicas' device
// buffers. It serves what NCCL cannot: several logical replicas on ONE GPU (NCCL refuses two ranks on
// one device), and GPUs of one process that can read each other's memory (peer access).
//
// The protocol is the shared-memory communicator's (comm/shared_memory.hpp), with GPU kernels as
// the work: every replica waits for its stream (its buffers are then final), posts where its
// buffers are, meets the others (timeouts, failures and mismatches as on the CPU, see
// detail/gpu_meeting.hpp), reduces its own slice of the flattened buffers over every replica's
// copy, in the shared-memory communicator's tree over replica order, writing the result into every
// copy, waits for its kernel and meets again. Results are bit-identical on every replica and from
// run to run, and each element is combined in the shared-memory communicator's order, so they are
// also the shared-memory communicator's bits.
//
// Buffers are spans of device memory on the replica's own GPU, used in place, or of host memory,
// staged through the device. Every collective has completed when it returns.

#include <distribute/collective_options.hpp>
#include <distribute/comm/argument_checks.hpp>
#include <distribute/concepts/communicator.hpp>
#include <distribute/cuda/comm/detail/bfloat16_wire.cuh>
#include <distribute/cuda/comm/detail/cuda_kernels.cuh>
#include <distribute/cuda/comm/detail/gpu_meeting.hpp>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/tensor/tensor.cuh>
#include <distribute/dtype.hpp>
#include <distribute/errors.hpp>
#include <distribute/reduce_op.hpp>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute::comm {

class cuda_peer;

// The shared state of one group of GPU replicas. `devices` may repeat a GPU (logical replicas on one
// device); distinct GPUs must be able to access each other's memory. Each device's stream is where
// that replica's collectives run.
class cuda_peer_group {
 public:
  explicit cuda_peer_group(std::vector<cuda> devices, collective_options options = {})
      : devices_{check(std::move(devices))}, meeting_{static_cast<int>(devices_.size()), options} {
    staging_.reserve(devices_.size());
    for (const auto& d : devices_) staging_.emplace_back(d.index());
    enable_peer_access();
  }
  cuda_peer_group(const cuda_peer_group&) = delete;
  cuda_peer_group& operator=(const cuda_peer_group&) = delete;

  int size() const noexcept { return static_cast<int>(devices_.size()); }
  const cuda& device(int rank) const { return devices_[static_cast<std::size_t>(rank)]; }
  inline cuda_peer endpoint(int rank);

  detail::gpu_meeting& meeting() noexcept { return meeting_; }
  const collective_options& options() const noexcept { return meeting_.options(); }
  void set_options(collective_options o) noexcept { meeting_.set_options(o); }

 private:
  friend class cuda_peer;

  static std::vector<cuda> check(std::vector<cuda> devices) {
    if (devices.empty()) throw std::invalid_argument("distribute: a cuda_peer group needs at least one device");
    if (devices.size() > static_cast<std::size_t>(detail::max_peer_replicas))
      throw std::invalid_argument("distribute: a cuda_peer group holds at most " +
                                  std::to_string(detail::max_peer_replicas) + " replicas, got " +
                                  std::to_string(devices.size()));
    return devices;
  }

  // Each replica's kernels read every other replica's buffers (tensors and staging come from the
  // devices' memory pools, which peer access alone does not open).
  void enable_peer_access() {
    for (const auto& a : devices_)
      for (const auto& b : devices_)
        if (a.index() != b.index() && !distribute::detail::share_pool(a.index(), b.index()))
          throw std::invalid_argument("distribute: cuda_peer needs peer access between its GPUs, and " + a.name() +
                                      " cannot access the memory of " + b.name() + " (use the nccl communicator)");
  }

  std::vector<cuda> devices_;
  detail::gpu_meeting meeting_;
  std::vector<detail::host_staging> staging_;
};

// One replica's endpoint of a `cuda_peer_group`. Cheap to copy; the group must outlive it.
class cuda_peer {
 public:
  cuda_peer(cuda_peer_group& group, int rank) : g_{&group}, rank_{rank} {
    if (rank < 0 || rank >= group.size())
      throw std::invalid_argument("distribute: rank " + std::to_string(rank) + " is not in a cuda_peer group of " +
                                  std::to_string(group.size()));
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return g_->size(); }
  const cuda& device() const { return g_->device(rank_); }

  template <element T>
  void all_reduce(reduce_op op, std::span<T> buf) {
    const std::span<T> one[1] = {buf};
    all_reduce(op, std::span<const std::span<T>>(one));
  }

  // Float buffers all-reduced as bfloat16 (gradient_reduction::compression): cuda/comm/detail/bfloat16_wire.cuh.
  void all_reduce_as_bfloat16(reduce_op op, std::span<const std::span<float>> bufs) {
    detail::all_reduce_as_bfloat16(*this, op, bufs, device().index(), stream());
  }

  template <element T>
  void all_reduce(reduce_op op, std::span<const std::span<T>> bufs) {
    std::size_t total = 0;
    for (auto b : bufs) total += b.size();
    auto& st = staging();
    const auto guard = current();
    std::vector<detail::host_staging::buffer> where;
    where.reserve(bufs.size());
    for (auto b : bufs) where.push_back({b.data(), b.size_bytes()});
    st.begin(where, stream(), "all_reduce");
    std::vector<detail::segment> segs;
    segs.reserve(bufs.size());
    for (std::size_t i = 0; i < bufs.size(); ++i) segs.push_back({st.stage(i, true, true, stream()), bufs[i].size()});
    detail::descriptor d{.kind = detail::collective_kind::all_reduce,
                         .type = dtype_of<T>,
                         .op = op,
                         .count = total,
                         .segs = segs.data(),
                         .n_segs = segs.size()};
    collective(d, [&](std::uint64_t seq) {
      // This replica's slice of the flattened buffers (comm/detail/peer_reduction.hpp).
      const int n = size();
      const auto [lo, hi] = detail::slice_of(total, rank_, n);
      std::size_t offset = 0;
      for (std::size_t i = 0; i < segs.size() && offset < hi; offset += segs[i].size, ++i) {
        const std::size_t b = std::max(lo, offset), e = std::min(hi, offset + segs[i].size);
        if (b >= e) continue;
        detail::peer_pointers<T> p{};
        for (int q = 0; q < n; ++q) {
          T* base = static_cast<T*>(meeting().posted(q, seq).segs[i].data) + (b - offset);
          p.src[q] = base;
          p.dst[q] = base;
        }
        detail::launch_reduce<T>(op, p, n, n, e - b, device().index(), stream());
      }
    });
    unstage();
  }

  template <element T>
  void reduce_scatter(reduce_op op, std::span<const T> in, std::span<T> out) {
    check_block_sizes("reduce_scatter", in.size(), out.size(), size());
    auto& st = staging();
    const auto guard = current();
    st.begin({{in.data(), in.size_bytes()}, {out.data(), out.size_bytes()}}, stream(), "reduce_scatter");
    const void* din = st.stage(0, true, false, stream());
    void* dout = st.stage(1, false, true, stream());
    detail::descriptor d{.kind = detail::collective_kind::reduce_scatter,
                         .type = dtype_of<T>,
                         .op = op,
                         .count = in.size(),
                         .out_count = out.size(),
                         .in = din,
                         .out = dout};
    collective(d, [&](std::uint64_t seq) {
      const std::size_t m = out.size();
      detail::peer_pointers<T> p{};
      for (int q = 0; q < size(); ++q)
        p.src[q] = static_cast<const T*>(meeting().posted(q, seq).in) + static_cast<std::size_t>(rank_) * m;
      p.dst[0] = static_cast<T*>(dout);
      detail::launch_reduce<T>(op, p, size(), 1, m, device().index(), stream());
    });
    unstage();
  }

  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    check_block_sizes("all_gather", out.size(), in.size(), size());
    auto& st = staging();
    const auto guard = current();
    st.begin({{in.data(), in.size_bytes()}, {out.data(), out.size_bytes()}}, stream(), "all_gather");
    const void* din = st.stage(0, true, false, stream());
    void* dout = st.stage(1, false, true, stream());
    detail::descriptor d{.kind = detail::collective_kind::all_gather,
                         .type = dtype_of<T>,
                         .count = in.size(),
                         .out_count = out.size(),
                         .in = din,
                         .out = dout};
    collective(d, [&](std::uint64_t seq) {
      const std::size_t bytes = in.size_bytes();
      for (int q = 0; q < size(); ++q)
        detail::copy_device(static_cast<char*>(dout) + static_cast<std::size_t>(q) * bytes, device().index(),
                            meeting().posted(q, seq).in, g_->device(q).index(), bytes, stream(), device().index());
    });
    unstage();
  }

  template <element T>
  void broadcast(std::span<T> buf, int root) {
    check_root(root, size());
    auto& st = staging();
    const auto guard = current();
    st.begin({{buf.data(), buf.size_bytes()}}, stream(), "broadcast");
    detail::segment seg{st.stage(0, rank_ == root, rank_ != root, stream()), buf.size()};
    detail::descriptor d{.kind = detail::collective_kind::broadcast,
                         .type = dtype_of<T>,
                         .root = root,
                         .count = buf.size(),
                         .segs = &seg,
                         .n_segs = 1};
    collective(d, [&](std::uint64_t seq) {
      if (rank_ == root) return;
      detail::copy_device(seg.data, device().index(), meeting().posted(root, seq).segs[0].data,
                          g_->device(root).index(), buf.size_bytes(), stream(), device().index());
    });
    unstage();
  }

  // Also orders GPU work: each replica's queued work has finished before any replica leaves.
  void barrier() {
    const auto guard = current();
    sync();
    meeting().meet(rank_, detail::descriptor{.kind = detail::collective_kind::barrier});
  }

 private:
  detail::gpu_meeting& meeting() const noexcept { return g_->meeting_; }
  detail::host_staging& staging() const noexcept { return g_->staging_[static_cast<std::size_t>(rank_)]; }
  cudaStream_t stream() const { return device().stream(); }
  distribute::detail::device_guard current() const { return distribute::detail::device_guard(device().index()); }
  void sync() const {
    distribute::detail::cuda_check(cudaStreamSynchronize(stream()), "cudaStreamSynchronize", device().index());
  }
  void unstage() {
    if (staging().finish(stream())) sync();
  }

  // Inputs final, meet, work, wait for the work, meet again. A replica whose work fails still meets
  // again (the others may be reading its buffers) and then fails the group.
  template <class Work>
  void collective(const detail::descriptor& d, Work&& work) {
    sync();
    const std::uint64_t seq = meeting().meet(rank_, d);
    std::exception_ptr failed;
    try {
      work(seq);
      sync();
    } catch (...) {
      failed = std::current_exception();
    }
    meeting().meet_again();
    if (failed) {
      meeting().fail(rank_, failed);
      std::rethrow_exception(failed);
    }
  }

  cuda_peer_group* g_;
  int rank_;
};

static_assert(distribute::communicator<cuda_peer>);

inline cuda_peer cuda_peer_group::endpoint(int rank) { return cuda_peer(*this, rank); }

}  // namespace distribute::comm
