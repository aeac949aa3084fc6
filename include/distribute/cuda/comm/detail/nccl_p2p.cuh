#pragma once
// Point-to-point over the NCCL communicator (cuda/comm/nccl.cuh): the contract of its deferred
// sends, the header that travels ahead of each message's data, a send waiting to be issued, and
// its issue.
//
// `send(buf, dst, tag)` and `recv(buf, src, tag)` between two ranks, with ncclSend /
// ncclRecv on the replica's stream, time-bounded as the collectives are. NCCL's own send waits on
// the GPU until its receiver is there, so a send here is deferred instead, to keep the contract of
// the other communicators that `send` never waits for its receiver:
// - `send` copies `buf` (the copy is taken before it returns) and returns without issuing anything.
//   This replica's pending sends are issued, in one NCCL group together with it, by its next `recv`,
//   collective, barrier or `flush()`, which then also waits until they are received (NCCL completes
//   a group as a whole). So two ranks that each send one message to the other and then receive one
//   do not deadlock (each one's send goes out with its receive), nor does a pipeline stage that
//   sends several messages forward before it receives one back. But:
//   * a rank that sends and then waits for something outside this communicator must call `flush()`
//     first, or its receiver waits for the message until the timeout; so must a rank that sends and
//     then calls a collective while its receiver is still in a receive for that message (the send
//     would go out only with the collective, which needs the receiver's collective first: within a
//     process the replicas meet before issuing, and NCCL runs a group's collective before its sends);
//   * a receive returns only once the receivers of this replica's pending sends have received them:
//     two ranks that each send the other two messages and then receive two wait for each other
//     (each one's first receive waits for its second message to be received) until the timeout.
//     MPI and shared memory have neither restriction.
// - NCCL has no tags: the messages between two ranks are received in the order they were sent. The
//   tag (0 <= tag < tag_limit), element type and count travel ahead of the data and are checked on
//   arrival: a receive that meets a message with another tag or element type throws
//   `collective_mismatch` naming both ends. A different count can leave NCCL waiting for data that
//   never comes: it is then reported as a timeout. Either failure, or a receive that times out,
//   aborts the communicator, as a failed collective does.
//
// A message is two NCCL sends: a header (tag, element type, count, where it was issued), then the
// data (none when empty); the receiver checks the header once both have arrived.

#include <distribute/collective_origin.hpp>
#include <distribute/cuda/comm/detail/nccl_calls.cuh>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/memory.cuh>
#include <distribute/dtype.hpp>

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute::comm::detail {

struct nccl_p2p_header {
  std::int64_t tag = 0;
  std::int64_t type = 0;   // dtype
  std::int64_t count = 0;  // elements
  std::int64_t step = -1;  // where it was issued (collective_origin.hpp)
  std::int64_t in_step = 0;
  char api[48]{};

  template <element T>
  static nccl_p2p_header of(int tag, std::size_t count, const collective_origin& o) noexcept {
    nccl_p2p_header h;
    h.tag = tag;
    h.type = static_cast<std::int64_t>(dtype_of<T>);
    h.count = static_cast<std::int64_t>(count);
    h.step = o.step;
    h.in_step = o.in_step ? 1 : 0;
    if (o.api) std::strncpy(h.api, o.api, sizeof h.api - 1);
    return h;
  }

  // "64 float32"
  std::string payload() const {
    const bool known = type >= 0 && type <= static_cast<std::int64_t>(dtype::bfloat16);
    return std::to_string(count) + " " +
           (known ? std::string(distribute::to_string(static_cast<dtype>(type)))
                  : "elements of type #" + std::to_string(type));
  }
  std::string origin() const {
    const std::string label(api, strnlen(api, sizeof api));
    return distribute::detail::describe_origin(label.c_str(), step, in_step != 0);
  }
};

// Where the data starts in a pending send's memory (after the header, on a 256-byte boundary).
inline constexpr std::size_t nccl_p2p_data_offset = 256;
static_assert(sizeof(nccl_p2p_header) <= nccl_p2p_data_offset);

// Refuses a tag outside 0 <= tag < `tag_limit`, or a peer that is not another rank of the group, of
// a send or receive (`what`) on rank `rank` of `size`.
inline void check_p2p(const char* what, int rank, int size, int peer, int tag, int tag_limit) {
  if (tag < 0 || tag >= tag_limit)
    throw std::invalid_argument(std::string("distribute: ") + what + " on replica " + std::to_string(rank) +
                                " needs a tag 0 <= tag < " + std::to_string(tag_limit) + ", got " +
                                std::to_string(tag));
  if (peer < 0 || peer >= size || peer == rank)
    throw std::invalid_argument(std::string("distribute: ") + what + " on replica " + std::to_string(rank) + " (tag " +
                                std::to_string(tag) + ") names rank " + std::to_string(peer) +
                                "; it must be another rank of this group (0.." + std::to_string(size - 1) + ")");
}

// A send not yet issued to NCCL: its own copy of the header and data, on the sender's GPU.
struct nccl_pending_send {
  int dst = 0;
  ncclDataType_t type = ncclFloat32;
  std::size_t count = 0;
  distribute::detail::device_allocation memory;  // header, then the data at nccl_p2p_data_offset

  // `buf` for rank `dst`, matched by `tag`, copied on `stream` of GPU `ordinal`. From pageable memory
  // the copy has been taken when the call returns.
  template <element T>
  static nccl_pending_send copy_of(std::span<const T> buf, int dst, int tag, int ordinal, cudaStream_t stream) {
    const auto header = nccl_p2p_header::of<T>(tag, buf.size(), distribute::detail::current_origin);
    nccl_pending_send m{
        dst, nccl_type<T>(), buf.size(),
        distribute::detail::device_allocation(ordinal, nccl_p2p_data_offset + buf.size_bytes(), stream)};
    auto* base = static_cast<char*>(m.memory.get());
    distribute::detail::cuda_check(cudaMemcpyAsync(base, &header, sizeof header, cudaMemcpyHostToDevice, stream),
                                   "cudaMemcpyAsync (send header)", ordinal);
    if (!buf.empty()) {
      const auto where = distribute::detail::locate(buf.data());
      if (where.on_device && where.ordinal != ordinal)
        throw std::invalid_argument("distribute: send on cuda:" + std::to_string(ordinal) +
                                    " got a buffer in the memory of cuda:" + std::to_string(where.ordinal));
      distribute::detail::cuda_check(
          cudaMemcpyAsync(base + nccl_p2p_data_offset, buf.data(), buf.size_bytes(), cudaMemcpyDefault, stream),
          "cudaMemcpyAsync (send data)", ordinal);
      // Host memory may be page-locked, and then copied later: the caller may reuse `buf` at once.
      if (!where.on_device)
        distribute::detail::cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize", ordinal);
    }
    return m;
  }
};

// Issues the sends of `pending` on `comm` and `stream`, inside the NCCL group call in progress, and
// moves them to `issued` (their memory is kept until the group call has completed).
inline void issue_pending_sends(std::vector<nccl_pending_send>& pending, std::vector<nccl_pending_send>& issued,
                                ncclComm_t comm, cudaStream_t stream) {
  for (auto& m : pending) {
    auto* base = static_cast<char*>(m.memory.get());
    nccl_check(ncclSend(base, sizeof(nccl_p2p_header), ncclInt8, m.dst, comm, stream), "ncclSend", comm);
    if (m.count != 0)
      nccl_check(ncclSend(base + nccl_p2p_data_offset, m.count, m.type, m.dst, comm, stream), "ncclSend", comm);
    issued.push_back(std::move(m));
  }
  pending.clear();
}

}  // namespace distribute::comm::detail
