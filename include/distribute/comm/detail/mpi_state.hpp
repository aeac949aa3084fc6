#pragma once
// What one MPI communicator (comm/mpi.hpp) holds, shared by its copies: the duplicated MPI
// communicator, its rank and size, its options, the requests of the collective in progress and their
// scratch memory, the shared-memory window of workers on one machine, the failure that ended it, and
// the point-to-point sends still in flight. Made by the communicator (a duplicate of the program's) or
// by split (a communicator MPI made, adopted); freeing it waits, within the timeout, for the sends in
// flight and frees the MPI communicator, except after a failure (then it is left to the job's abort).

#include <distribute/comm/detail/mpi_node_window.hpp>
#include <distribute/comm/detail/mpi_p2p.hpp>
#include <distribute/comm/mpi_options.hpp>
#include <distribute/comm/mpi_runtime.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace distribute::comm::detail {

struct mpi_state {
  // How a communicator made for a state (by split) is handed over.
  struct adopt_t {};

  mpi_state(MPI_Comm parent, const mpi_options& opts) : options{opts} {
    mpi_runtime::instance();
    if (const int rc = MPI_Comm_dup(parent, &comm); rc != MPI_SUCCESS)
      throw std::runtime_error("distribute: MPI_Comm_dup failed: " + mpi_error_string(rc));
    set_up();
  }
  // A communicator made for this state (by split); `worker_names[r]`: how rank r is named.
  mpi_state(adopt_t, MPI_Comm own, const mpi_options& opts, std::vector<int> worker_names)
      : comm{own}, options{opts}, names{std::move(worker_names)} {
    set_up();
  }
  ~mpi_state() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    // A communicator with requests that never completed is left to the abort, and so is the window
    // of a worker leaving by an exception: freeing it waits for every other worker. So is the memory
    // of sends in flight: MPI may still read it.
    if (finalized || !failure.empty()) {
      for (auto& m : sends) (void)m.release();
      return;
    }
    finish_sends();
    if (window && std::uncaught_exceptions() == 0) window->release();
    MPI_Comm_free(&comm);
  }

  void set_up() {
    // Errors come back as codes, to be reported as exceptions that name the collective.
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int* tag_ub = nullptr;
    int found = 0;
    MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &found);
    if (found && tag_ub) tag_limit = std::min(tag_limit, *tag_ub - detail::p2p_tag_base + 1);
    window = detail::mpi_node_window::create(comm, rank, size, options.shared_memory, options.shared_memory_chunk);
    if (window && !names.empty()) window->name_workers(names);
  }

  // Waits, within the timeout, for the sends still in flight; gives up on the others (their memory
  // stays with MPI).
  void finish_sends() noexcept {
    const auto deadline = std::chrono::steady_clock::now() + options.collectives.timeout;
    for (auto& m : sends) {
      int done = 0;
      while (MPI_Testall(static_cast<int>(m->requests.size()), m->requests.data(), &done, MPI_STATUSES_IGNORE) ==
                 MPI_SUCCESS &&
             !done && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (done) continue;
      const int from = names.empty() ? rank : names[static_cast<std::size_t>(rank)];
      const int to = names.empty() ? m->dst : names[static_cast<std::size_t>(m->dst)];
      std::fprintf(stderr, "distribute: %s was not received within %lld ms of the communicator's end\n",
                   detail::describe_send(from, to, m->tag, m->header).c_str(),
                   static_cast<long long>(options.collectives.timeout.count()));
      for (auto& r : m->requests)
        if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
      (void)m.release();
    }
    sends.clear();
  }
  mpi_state(const mpi_state&) = delete;
  mpi_state& operator=(const mpi_state&) = delete;

  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
  mpi_options options;
  std::int64_t seq = 0;
  std::vector<MPI_Request> requests;
  std::vector<int> peers;     // the worker of each request
  std::vector<int> expected;  // bytes a receive must get; -1 for a send
  std::vector<MPI_Status> statuses;
  std::vector<std::byte> packed;                    // a copy of a const input
  std::vector<std::byte> incoming;                  // the pieces being received, before they are combined
  std::unique_ptr<detail::mpi_node_window> window;  // when every worker is on this machine
  std::string failure;
  std::vector<int> names;  // how each rank is named in messages (split communicators); empty: by rank
  int tag_limit = detail::p2p_tag_limit;
  std::vector<std::unique_ptr<detail::p2p_send>> sends;  // in flight
  std::vector<std::vector<std::byte>> spare;             // memory of delivered sends, for the next ones
};

}  // namespace distribute::comm::detail
