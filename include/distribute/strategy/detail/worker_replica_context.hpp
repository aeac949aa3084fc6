#pragma once
// The replica context of a multi-worker strategy. Its collectives span every replica of every worker
// and `replica_id()` is the replica's place among all of them; per-replica and mirrored values hold
// this worker's replicas only, so `local(x)` picks by the replica's index within its worker.

#include <distribute/concepts/communicator.hpp>
#include <distribute/concepts/device.hpp>
#include <distribute/per_replica.hpp>
#include <distribute/replica_context.hpp>

#include <cstddef>
#include <utility>

namespace distribute::detail {

template <device D, communicator C>
class worker_replica_context : public replica_context<D, C> {
 public:
  worker_replica_context(D device, C comm, int local_index, int worker_index, engine_slot<D>* slot = nullptr,
                         collective_meter* meter = nullptr)
      : replica_context<D, C>(std::move(device), std::move(comm), slot, meter),
        local_index_{local_index},
        worker_index_{worker_index} {}

  // This replica's index among its worker's replicas, and the worker's index among the workers.
  int local_replica_id() const noexcept { return local_index_; }
  int worker_index() const noexcept { return worker_index_; }

  template <class T, std::size_t E>
  T& local(per_replica<T, E>& v) const {
    return v[index()];
  }
  template <class T, std::size_t E>
  const T& local(const per_replica<T, E>& v) const {
    return v[index()];
  }
  template <class T, std::size_t E>
  T& local(mirrored<T, E>& v) const {
    return v[index()];
  }
  template <class T, std::size_t E>
  const T& local(const mirrored<T, E>& v) const {
    return v[index()];
  }

 private:
  std::size_t index() const noexcept { return static_cast<std::size_t>(local_index_); }

  int local_index_;
  int worker_index_;
};

}  // namespace distribute::detail
