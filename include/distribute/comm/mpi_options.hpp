#pragma once
// The options of an MPI communicator (comm/mpi.hpp): its collectives' timeout, the check of every
// worker's call, how long a failed worker goes on before the job is aborted, and the shared-memory
// window of workers on one machine.

#include <distribute/collective_options.hpp>

#include <chrono>
#include <cstddef>

namespace distribute::comm {

struct mpi_options {
  collective_options collectives{};
#ifdef NDEBUG
  bool check_fingerprints = false;
#else
  bool check_fingerprints = true;
#endif
  // After a failure, how long the process may go on (to log, or write what it can) before the job is
  // aborted. A process that exits earlier aborts the job as it exits.
  std::chrono::milliseconds abort_grace = std::chrono::seconds(10);
  // Workers on one machine all-reduce through a shared-memory window, in chunks of this many bytes
  // (at least 4 KiB, a multiple of 64; two per worker are mapped). Read when the communicator is
  // made; workers that differ agree on the smaller chunk, and on no window if any turns it off.
  bool shared_memory = true;
  std::size_t shared_memory_chunk = std::size_t{1} << 20;
};

}  // namespace distribute::comm
