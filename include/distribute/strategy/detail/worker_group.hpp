#pragma once
// The device policy of multi_worker_mirrored_strategy<D, Comm>: a worker's replicas, their
// communicators and the job around them. One strategy template serves every device; this is its only
// device-specific part. CPU replicas joined by MPI are here; GPUs joined by NCCL in
// cuda/strategy/detail/worker_group.cuh.
//
// worker_group<D, Comm> has:
//   options_type, communicator          the strategy's options; a replica's communicator
//   strategy_name                       for errors
//   worker_group(options, argc, argv)   a collective of the workers (argc/argv may be null)
//   devices(), options()
//   worker_index(), num_workers(), local_replicas(), total_replicas(), first_replica(w),
//   replicas_of(w), worker_of(replica), layout()
//   endpoint(local rank)                a replica's communicator
//   cross()                             the workers' MPI communicator (comm::mpi), for what the
//                                       strategy moves between workers on the host
//   meeting(), prepare_step()           where this worker's replicas meet in a step (run_loop.hpp)
//   hooks(failed)                       the step loop's hooks; `failed(exception_ptr)` on a failed step
//   partner_failure()                   another worker's failure learnt out of band, if any
//   leave(message, cause)               this worker leaves the job after a failure
//   core_shares()                       {threads per replica's engine, threads of the primary's}
//   broadcasts_in_step<T>               a mirrored T that a step's collectives broadcast (device state)

#include <distribute/comm/hierarchical.hpp>
#include <distribute/comm/mpi.hpp>
#include <distribute/comm/mpi_runtime.hpp>
#include <distribute/device/cpu.hpp>
#include <distribute/detail/hardware.hpp>
#include <distribute/strategy/detail/run_loop.hpp>

#include <algorithm>
#include <exception>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace distribute {

struct multi_worker_options {
  // CPU replicas of this worker (threads of this process). Workers may differ.
  int local_replicas = 1;
  // Timeout, fingerprint checks, shared memory and the grace before a failed job is aborted.
  comm::mpi_options mpi{};
  // How a worker's replicas take part in an all-reduce across workers (comm/hierarchical.hpp):
  // by default, with every worker on one machine, the first replica does it alone in one pass when
  // the replicas outnumber the hardware threads (the worker's own, or the machine's).
  comm::local_reduction local_reduction = comm::local_reduction::automatic;
};

namespace detail {

template <class D, class Comm>
class worker_group;  // one specialisation per device and communicator

// The step loop's hooks of CPU replicas: nothing around a replica's step; a failed step is reported.
template <class F>
struct reporting_hooks : no_replica_hooks {
  F failed;
  void step_failed(const std::exception_ptr& e) const { failed(e); }
};

// CPU replicas, threads of this worker, joined across workers by MPI: a hierarchical group
// (comm/hierarchical.hpp) of shared memory in the worker and MPI between workers.
template <>
class worker_group<cpu, comm::mpi> : public comm::hierarchical_group<comm::mpi> {
 public:
  using options_type = multi_worker_options;
  using communicator = comm::hierarchical<comm::mpi>;
  static constexpr const char* strategy_name = "multi_worker_mirrored_strategy";
  template <class T>
  static constexpr bool broadcasts_in_step = false;

  worker_group(const multi_worker_options& options, int* argc, char*** argv)
      : hierarchical_group(start(options, argc, argv), options.local_replicas, options.mpi.collectives,
                           options.local_reduction),
        options_{options},
        devices_(cpu_replicas(options.local_replicas)) {}

  std::vector<cpu>& devices() noexcept { return devices_; }
  const std::vector<cpu>& devices() const noexcept { return devices_; }
  const multi_worker_options& options() const noexcept { return options_; }

  comm::shared_memory_group& meeting() noexcept { return local_group(); }
  void prepare_step() { local_group().reset(); }
  template <class F>
  reporting_hooks<F> hooks(F failed) const {
    return {{}, std::move(failed)};
  }
  // CPU workers learn of each other's failures in their MPI collectives.
  std::optional<std::string> partner_failure() const noexcept { return std::nullopt; }
  // Every further collective fails at once, and the job is aborted when this process exits (or after
  // the grace): the other workers stop within their collective timeout at most.
  void leave(const std::string& message, const std::string&) { cross().leave(message); }

  // Each replica's engine gets its share of the cores: of this worker's when its affinity mask
  // differs from the machine's (mpirun/srun binding), of the machine's among every replica of the
  // job when all workers share this machine and nothing binds them; the primary alone, the worker's.
  std::pair<int, int> core_shares() {
    const int mine = static_cast<int>(std::max(1u, usable_hardware_threads()));
    const int machine = static_cast<int>(std::thread::hardware_concurrency());
    int share = std::max(1, mine / local_replicas());
    int primary = mine;
    if (cross().uses_shared_memory() && machine > 0 && mine >= machine) {
      share = std::max(1, std::min(share, machine / total_replicas()));
      primary = std::max(1, machine / num_workers());
    }
    return {share, primary};
  }

 private:
  // MPI initialised with the program's arguments when given (the launcher may pass some).
  static comm::mpi start(const multi_worker_options& options, int* argc, char*** argv) {
    if (argc) comm::mpi_runtime::instance(argc, argv);
    return comm::mpi(options.mpi);
  }

  multi_worker_options options_;
  std::vector<cpu> devices_;
};

}  // namespace detail
}  // namespace distribute
