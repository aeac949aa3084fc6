#pragma once
// What a rank called, as the ranks of a shared-memory group publish it to each other before any rank
// touches another's memory (comm/shared_memory.hpp): the kind of collective, its element type, op,
// root and sizes, its buffers, and where it was issued; whether two ranks called the same, and the
// call in words for the error that says they did not. The MPI communicator's fingerprints
// (mpi_call.hpp) and the GPU communicators use the same kinds.

#include <distribute/collective_origin.hpp>
#include <distribute/dtype.hpp>
#include <distribute/reduce_op.hpp>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace distribute::comm::detail {

// graph_replay: the replay of a CUDA graph holding `count` collectives of each replica (GPU replicas
// meet before launching it: cuda/comm/nccl.cuh).
enum class collective_kind : std::uint8_t { all_reduce, reduce_scatter, all_gather, broadcast, barrier, graph_replay };

inline const char* to_string(collective_kind k) noexcept {
  switch (k) {
    case collective_kind::all_reduce: return "all_reduce";
    case collective_kind::reduce_scatter: return "reduce_scatter";
    case collective_kind::all_gather: return "all_gather";
    case collective_kind::broadcast: return "broadcast";
    case collective_kind::barrier: return "barrier";
    case collective_kind::graph_replay: return "replay of a CUDA graph";
  }
  return "collective";
}

struct segment {
  void* data;
  std::size_t size;
};

// What a rank called, as published to the others.
struct descriptor {
  collective_kind kind = collective_kind::barrier;
  dtype type = dtype::float32;
  reduce_op op = reduce_op::sum;
  int root = 0;
  std::size_t count = 0;          // elements: all buffers of an all_reduce together, or the input
  std::size_t out_count = 0;      // elements of the output (reduce_scatter, all_gather)
  const segment* segs = nullptr;  // the buffers of an all_reduce, or the buffer of a broadcast
  std::size_t n_segs = 0;
  const void* in = nullptr;
  void* out = nullptr;
  // Where it was issued (collective_origin.hpp): filled in when the rank posts it.
  const char* api = nullptr;
  std::int64_t step = -1;
  bool in_step = false;
};

inline bool same_call(const descriptor& a, const descriptor& b) noexcept {
  if (a.kind != b.kind || !distribute::detail::same_api(a.api, b.api)) return false;
  if (a.kind == collective_kind::barrier) return true;
  if (a.type != b.type || a.count != b.count || a.out_count != b.out_count || a.n_segs != b.n_segs) return false;
  if ((a.kind == collective_kind::all_reduce || a.kind == collective_kind::reduce_scatter) && a.op != b.op)
    return false;
  if (a.kind == collective_kind::broadcast && a.root != b.root) return false;
  for (std::size_t i = 0; i < a.n_segs; ++i)
    if (a.segs[i].size != b.segs[i].size) return false;
  return true;
}

inline std::string describe(const descriptor& d) {
  std::string s = to_string(d.kind);
  const std::string t(distribute::to_string(d.type));
  switch (d.kind) {
    case collective_kind::barrier: return s + distribute::detail::describe_origin(d.api, d.step, d.in_step);
    case collective_kind::graph_replay:
      return s + " holding " + std::to_string(d.count) + " collective" + (d.count == 1 ? "" : "s") +
             distribute::detail::describe_origin(d.api, d.step, d.in_step);
    case collective_kind::all_reduce:
    case collective_kind::reduce_scatter:
      s += "(";
      s += distribute::to_string(d.op);
      s += ")";
      break;
    case collective_kind::broadcast: s += " from replica " + std::to_string(d.root); break;
    case collective_kind::all_gather: break;
  }
  s += " of " + std::to_string(d.count) + " " + t;
  if (d.kind == collective_kind::all_reduce && d.n_segs != 1) {
    s += " in " + std::to_string(d.n_segs) + " buffers (";
    for (std::size_t i = 0; i < d.n_segs && i < 8; ++i) s += (i ? ", " : "") + std::to_string(d.segs[i].size);
    if (d.n_segs > 8) s += ", ...";
    s += ")";
  }
  if (d.kind == collective_kind::reduce_scatter || d.kind == collective_kind::all_gather)
    s += " into " + std::to_string(d.out_count);
  return s + distribute::detail::describe_origin(d.api, d.step, d.in_step);
}

inline std::string list_replicas(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "replica " : "replicas ";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// The buffers as segments, and their total length.
template <class T>
std::vector<segment> segments_of(std::span<const std::span<T>> bufs, std::size_t& total) {
  std::vector<segment> segs;
  segs.reserve(bufs.size());
  total = 0;
  for (auto b : bufs) {
    segs.push_back({b.data(), b.size()});
    total += b.size();
  }
  return segs;
}

}  // namespace distribute::comm::detail
