#pragma once
// Collectives between processes (workers), over MPI.
//
// Every collective is built from non-blocking point-to-point messages (MPI_Isend / MPI_Irecv) and
// completed by polling against a deadline, so that a worker that died or stalled is reported instead
// of waited for: the call fails with `collective_timeout` naming the collective and the workers it
// was waiting for, and the job is then aborted (see detail/mpi_runtime.hpp), because a collective
// cannot be withdrawn once its messages are posted.
//
// The algorithms are the bandwidth-optimal rings (all-reduce = ring reduce-scatter + ring
// all-gather) rather than MPI's own non-blocking collectives, which Open MPI runs through a generic
// schedule several times slower than its blocking MPI_Allreduce. The ring also makes a reduction
// deterministic: each slice of the result is combined once, in a fixed order, and then copied to
// every worker, so every worker holds the same bits, run after run.
//
// With `check_fingerprints` (on by default in builds without NDEBUG), every collective starts with an
// exchange (through the shared-memory window when there is one) of what each worker called (kind,
// element type, op, count, root, sequence number); workers that disagree all get a `collective_mismatch` naming each worker's call, before any data
// moves. Without it, a size mismatch is still an error (a message longer or shorter than the
// receiver expects), but an op mismatch is not seen. All workers must use the same setting.
//
// When every worker runs on one machine, all-reduce does not pass messages at all: the workers share
// an MPI window (MPI_Win_allocate_shared) and reduce by reading each other's memory, which is several
// times faster than MPI's own transport at the sizes of gradients (detail/mpi_node_window.hpp). That
// path compares every worker's call in any build, so a mismatched all-reduce is always named there.
// Workers spread over several machines use the ring.

#include <distribute/collective_options.hpp>
#include <distribute/comm/detail/check.hpp>
#include <distribute/comm/detail/copy_bytes.hpp>
#include <distribute/comm/detail/flat_ranges.hpp>
#include <distribute/comm/detail/mpi_call.hpp>
#include <distribute/comm/detail/mpi_node_window.hpp>
#include <distribute/comm/detail/mpi_runtime.hpp>
#include <distribute/comm/detail/reduce_kernel.hpp>
#include <distribute/detail/backoff.hpp>
#include <distribute/dtype.hpp>
#include <distribute/errors.hpp>
#include <distribute/reduce_op.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

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

class mpi {
 public:
  // The processes of MPI_COMM_WORLD (initialising MPI if the program has not).
  mpi() : mpi(mpi_options{}) {}
  explicit mpi(mpi_options options) : mpi(world(), options) {}
  // The processes of `comm`, which is duplicated so that these collectives never match the
  // program's own messages.
  explicit mpi(MPI_Comm comm, mpi_options options = {}) : s_{std::make_shared<state>(comm, options)} {}

  int rank() const noexcept { return s_->rank; }
  int size() const noexcept { return s_->size; }
  MPI_Comm native_handle() const noexcept { return s_->comm; }

  const mpi_options& options() const noexcept { return s_->options; }
  // Only between collectives, with the same values on every worker.
  void set_options(const mpi_options& options) noexcept { s_->options = options; }

  // Whether an earlier collective failed; then every further one fails at once.
  bool failed() const noexcept { return !s_->failure.empty(); }

  // This worker takes no further part in the job (its step failed, say): every further collective
  // here fails at once, workers on this machine waiting for it stop at once with `message`, and the
  // job is aborted when this process exits or after `abort_grace`.
  void leave(const std::string& message) {
    if (!s_->failure.empty()) return;
    s_->failure = message;
    if (s_->window) s_->window->mark_failed(message);
    detail::mpi_runtime::instance().fail(message, s_->options.abort_grace);
  }

  // Whether all-reduce goes through a shared-memory window (every worker on this machine, and
  // `shared_memory` on) rather than the ring of messages.
  bool uses_shared_memory() const noexcept { return s_->window != nullptr; }

  template <detail::mpi_value T>
  void all_reduce(reduce_op op, std::span<T> buf) {
    all_reduce(op, buf, size());
  }
  // `mean` divides by `mean_over` contributions instead of the worker count: for engines that reduce
  // several replicas per worker first.
  template <detail::mpi_value T>
  void all_reduce(reduce_op op, std::span<T> buf, int mean_over) {
    all_reduce(op, std::span<const std::span<T>>(&buf, 1), mean_over);
  }
  // Several buffers as one collective: reduced as if they were one, in place, without packing.
  template <detail::mpi_value T>
  void all_reduce(reduce_op op, std::span<const std::span<T>> bufs) {
    all_reduce(op, bufs, size());
  }
  template <detail::mpi_value T>
  void all_reduce(reduce_op op, std::span<const std::span<T>> bufs, int mean_over) {
    all_reduce_each(op, std::span<const std::span<const std::span<T>>>(&bufs, 1), mean_over);
  }

  // One all-reduce in which this worker contributes several lists of buffers of the same shape (the
  // buffers of its replicas), combined in list order, and every list receives the result. Through
  // shared memory the lists are read and written where they are, with no extra pass over them.
  template <detail::mpi_value T>
  void all_reduce_each(reduce_op op, std::span<const std::span<const std::span<T>>> lists, int mean_over) {
    if (lists.empty()) throw std::invalid_argument("distribute: all_reduce_each needs at least one list of buffers");
    if (mean_over < 1) throw std::invalid_argument("distribute: a mean over " + std::to_string(mean_over) + " contributions");
    const auto first = lists[0];
    for (const auto list : lists) {
      bool same = list.size() == first.size();
      for (std::size_t i = 0; same && i < list.size(); ++i) same = list[i].size() == first[i].size();
      if (!same) throw std::invalid_argument("distribute: all_reduce_each needs lists of buffers of one shape");
    }
    std::size_t total = 0;
    for (auto b : first) total += b.size();
    auto c = begin(collective_kind::all_reduce, detail::type_code<T>(), op, total);
    if (s_->window) {
      s_->window->all_reduce(op, lists, total, mean_over, c.call, c.deadline,
                             [&](detail::window_failure f) { report_window_failure(c, std::move(f)); });
      return;
    }
    // Over the ring: combine into the first list, all-reduce it, copy it to the others.
    const reduce_op partial = op == reduce_op::mean ? reduce_op::sum : op;
    std::vector<const void*> srcs(lists.size());
    if (lists.size() > 1)
      detail::for_each_run_at(first, 0, total, total + 1, [&](std::size_t i, std::size_t at, std::size_t len, std::size_t) {
        detail::combine_lists(partial, lists, i, at, len, first[i].data() + at, srcs.data());
      });
    ring_all_reduce(op, first, mean_over, c);
    for (std::size_t l = 1; l < lists.size(); ++l)
      for (std::size_t i = 0; i < first.size(); ++i)
        if (!first[i].empty()) detail::copy_bytes(lists[l][i].data(), first[i].data(), first[i].size_bytes());
  }

  // in.size() == size() * out.size(); this worker receives the reduction of block rank().
  template <detail::mpi_value T>
  void reduce_scatter(reduce_op op, std::span<const T> in, std::span<T> out) {
    detail::check_block_sizes("reduce_scatter", in.size(), out.size(), size());
    auto c = begin(collective_kind::reduce_scatter, detail::type_code<T>(), op, in.size());
    T* work = scratch<T>(s_->packed, in.size());
    if (!in.empty()) std::memcpy(work, in.data(), in.size_bytes());
    const std::span<T> whole(work, in.size());
    ring_reduce_scatter(op, std::span<const std::span<T>>(&whole, 1), in.size(), size(), c);
    if (!out.empty()) std::memcpy(out.data(), work + static_cast<std::size_t>(rank()) * out.size(), out.size_bytes());
  }

  // out.size() == size() * in.size(); block w of `out` is worker w's `in`. `in` may be block rank()
  // of `out` itself.
  template <detail::mpi_value T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    detail::check_block_sizes("all_gather", out.size(), in.size(), size());
    std::vector<std::size_t> counts(static_cast<std::size_t>(size()), in.size());
    auto c = begin(collective_kind::all_gather, detail::type_code<T>(), reduce_op::sum, in.size());
    ring_all_gather(in, out, counts, c);
  }
  // Blocks of different sizes: worker w contributes counts[w] elements (its `in`), and `out` holds
  // them all in worker order. Every worker passes the same counts.
  template <detail::mpi_value T>
  void all_gather(std::span<const T> in, std::span<T> out, std::span<const std::size_t> counts) {
    if (counts.size() != static_cast<std::size_t>(size()))
      throw std::invalid_argument("distribute: all_gather needs one count per worker (" + std::to_string(size()) +
                                  "), got " + std::to_string(counts.size()));
    const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
    if (in.size() != counts[static_cast<std::size_t>(rank())] || out.size() != total)
      throw std::invalid_argument("distribute: all_gather with counts: worker " + std::to_string(rank()) + " gives " +
                                  std::to_string(in.size()) + " elements (its count is " +
                                  std::to_string(counts[static_cast<std::size_t>(rank())]) + ") into " +
                                  std::to_string(out.size()) + " (the counts add up to " + std::to_string(total) + ")");
    auto c = begin(collective_kind::all_gather, detail::type_code<T>(), reduce_op::sum, total);
    ring_all_gather(in, out, std::vector<std::size_t>(counts.begin(), counts.end()), c);
  }

  template <detail::mpi_value T>
  void broadcast(std::span<T> buf, int root) {
    detail::check_root(root, size());
    auto c = begin(collective_kind::broadcast, detail::type_code<T>(), reduce_op::sum, buf.size(), root);
    auto& reqs = s_->requests;
    reqs.clear();
    if (rank() == root) {
      for (int w = 0; w < size(); ++w)
        if (w != root) post_send(buf.data(), buf.size_bytes(), w, tag_broadcast);
    } else {
      post_recv(buf.data(), buf.size_bytes(), root, tag_broadcast);
    }
    complete(c);
  }

  void barrier() {
    auto c = begin(collective_kind::barrier, 0, reduce_op::sum, 0);
    // Dissemination: after round k every worker has heard, indirectly, from 2^k others.
    for (int d = 1; d < size(); d *= 2) {
      s_->requests.clear();
      post_recv(nullptr, 0, (rank() - d + size()) % size(), tag_barrier);
      post_send(nullptr, 0, (rank() + d) % size(), tag_barrier);
      complete(c);
    }
  }

 private:
  using collective_kind = detail::collective_kind;

  enum tag : int { tag_fingerprint = 1, tag_reduce = 2, tag_gather = 3, tag_broadcast = 4, tag_barrier = 5 };
  // Messages larger than this are split: MPI counts are ints.
  static constexpr std::size_t max_message = std::size_t{1} << 30;

  struct state {
    state(MPI_Comm parent, const mpi_options& opts) : options{opts} {
      detail::mpi_runtime::instance();
      if (const int rc = MPI_Comm_dup(parent, &comm); rc != MPI_SUCCESS)
        throw std::runtime_error("distribute: MPI_Comm_dup failed: " + detail::mpi_error_string(rc));
      // Errors come back as codes, to be reported as exceptions that name the collective.
      MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
      MPI_Comm_rank(comm, &rank);
      MPI_Comm_size(comm, &size);
      window = detail::mpi_node_window::create(comm, rank, size, options.shared_memory, options.shared_memory_chunk);
    }
    ~state() {
      int finalized = 0;
      MPI_Finalized(&finalized);
      // A communicator with requests that never completed is left to the abort, and so is the window
      // of a worker leaving by an exception: freeing it waits for every other worker.
      if (finalized || !failure.empty()) return;
      if (window && std::uncaught_exceptions() == 0) window->release();
      MPI_Comm_free(&comm);
    }
    state(const state&) = delete;
    state& operator=(const state&) = delete;

    MPI_Comm comm = MPI_COMM_NULL;
    int rank = 0, size = 1;
    mpi_options options;
    std::int64_t seq = 0;
    std::vector<MPI_Request> requests;
    std::vector<int> peers;  // the worker of each request
    std::vector<int> expected;  // bytes a receive must get; -1 for a send
    std::vector<MPI_Status> statuses;
    std::vector<std::byte> packed;    // a copy of a const input
    std::vector<std::byte> incoming;  // the pieces being received, before they are combined
    std::unique_ptr<detail::mpi_node_window> window;  // when every worker is on this machine
    std::string failure;
  };

  struct active_call {
    detail::mpi_call call;
    std::chrono::steady_clock::time_point deadline;
  };

  static MPI_Comm world() {
    detail::mpi_runtime::instance();
    return MPI_COMM_WORLD;
  }

  // Room for `n` elements of T in a scratch buffer (grown, never shrunk: steps repeat their sizes).
  template <class T>
  static T* scratch(std::vector<std::byte>& buffer, std::size_t n) {
    if (buffer.size() < n * sizeof(T)) {
      buffer.clear();
      buffer.shrink_to_fit();
      buffer.resize(n * sizeof(T));
    }
    return reinterpret_cast<T*>(buffer.data());
  }

  // Starts a collective: refuses on a failed communicator, numbers it, and compares fingerprints.
  active_call begin(collective_kind kind, std::int64_t type, reduce_op op, std::size_t count, int root = 0) {
    state& s = *s_;
    active_call c{{static_cast<std::int64_t>(kind), type, static_cast<std::int64_t>(op), static_cast<std::int64_t>(count),
                   root, s.seq++},
                  std::chrono::steady_clock::now() + s.options.collectives.timeout};
    c.call.set_origin(distribute::detail::current_origin);
    if (!s.failure.empty())
      throw collective_aborted("distribute: " + detail::describe_at(c.call) + " on worker " + std::to_string(s.rank) +
                               " cannot run: an earlier collective failed: " + s.failure);
    if (s.options.check_fingerprints && s.size > 1) {
      // Through shared memory the calls are compared in one meeting; an all-reduce there compares
      // them itself, in any build.
      if (!s.window) check_fingerprints(c);
      else if (kind != collective_kind::all_reduce)
        s.window->check_calls(c.call, c.deadline, [&](detail::window_failure f) { report_window_failure(c, std::move(f)); });
    }
    return c;
  }

  void check_fingerprints(const active_call& c) {
    std::vector<detail::mpi_call> calls(static_cast<std::size_t>(size()));
    calls[static_cast<std::size_t>(rank())] = c.call;
    // A ring all-gather of one fingerprint per worker.
    active_call exchange = c;
    for (int s = 0; s < size() - 1; ++s) {
      const int send_block = (rank() - s + size()) % size(), recv_block = (rank() - s - 1 + size()) % size();
      s_->requests.clear();
      post_recv(&calls[static_cast<std::size_t>(recv_block)], sizeof(detail::mpi_call), left(), tag_fingerprint);
      post_send(&calls[static_cast<std::size_t>(send_block)], sizeof(detail::mpi_call), right(), tag_fingerprint);
      complete(exchange);
    }
    if (auto message = detail::compare_calls(calls); !message.empty()) throw collective_mismatch(message);
  }

  int left() const noexcept { return (rank() - 1 + size()) % size(); }
  int right() const noexcept { return (rank() + 1) % size(); }

  void post_send(const void* data, std::size_t bytes, int to, int tag) {
    post(const_cast<void*>(data), bytes, to, tag, true);
  }
  void post_recv(void* data, std::size_t bytes, int from, int tag) { post(data, bytes, from, tag, false); }

  void post(void* data, std::size_t bytes, int peer, int tag, bool send) {
    auto* p = static_cast<std::byte*>(data);
    std::size_t done = 0;
    do {
      const int n = static_cast<int>(std::min(max_message, bytes - done));
      MPI_Request r = MPI_REQUEST_NULL;
      const int rc = send ? MPI_Isend(p + done, n, MPI_BYTE, peer, tag, s_->comm, &r)
                          : MPI_Irecv(p + done, n, MPI_BYTE, peer, tag, s_->comm, &r);
      if (rc != MPI_SUCCESS) {
        s_->requests.push_back(r);
        s_->peers.push_back(peer);
        s_->expected.push_back(-1);
        fail_with<collective_aborted>(std::string("distribute: posting a message to worker ") + std::to_string(peer) +
                                      " failed: " + detail::mpi_error_string(rc));
      }
      s_->requests.push_back(r);
      s_->peers.resize(s_->requests.size(), peer);
      s_->expected.push_back(send ? -1 : n);
      done += static_cast<std::size_t>(n);
    } while (done < bytes);
  }

  // Polls the posted requests until all complete, the deadline passes, or MPI reports an error.
  // MPI progresses the messages inside MPI_Testall, so the first waits spin; a long wait (a slow
  // peer) backs off to short sleeps so as not to take a core from the replicas.
  void complete(const active_call& c) {
    state& s = *s_;
    complete_range(c, 0, s.requests.size());
    s.requests.clear();
    s.peers.clear();
    s.expected.clear();
  }

  // A shorter message than the receive posted is not an error to MPI, but it is to us: the workers
  // disagree on the size, and part of the result would be stale.
  void check_received(const active_call& c, std::size_t first, std::size_t count) {
    state& s = *s_;
    for (std::size_t i = first; i < first + count; ++i) {
      if (s.expected[i] < 0) continue;
      int got = 0;
      MPI_Get_count(&s.statuses[i], MPI_BYTE, &got);
      const int wanted = std::exchange(s.expected[i], -1);  // checked once: a null request reports 0 bytes
      if (got != wanted)
        fail_with<collective_mismatch>("distribute: " + detail::describe_at(c.call) + " on worker " + std::to_string(rank()) +
                                       " of " + std::to_string(size()) + " received " + std::to_string(got) +
                                       " bytes from worker " + std::to_string(s.peers[i]) + " where it expected " +
                                       std::to_string(wanted) +
                                       ": the workers called collectives of different sizes (turn on check_fingerprints "
                                       "to see each worker's call)");
    }
  }

  [[noreturn]] void report_error(const active_call& c, int rc, const std::vector<MPI_Status>& statuses) {
    int code = rc, peer = -1;
    if (rc == MPI_ERR_IN_STATUS) {
      for (std::size_t i = 0; i < statuses.size(); ++i)
        if (statuses[i].MPI_ERROR != MPI_SUCCESS && statuses[i].MPI_ERROR != MPI_ERR_PENDING) {
          code = statuses[i].MPI_ERROR;
          peer = s_->peers[i];
          break;
        }
    }
    int error_class = code;
    MPI_Error_class(code, &error_class);
    std::string where = "distribute: " + detail::describe_at(c.call) + " on worker " + std::to_string(rank()) + " of " +
                        std::to_string(size());
    if (error_class == MPI_ERR_TRUNCATE)
      fail_with<collective_mismatch>(where + " received a larger message than it expected" +
                                     (peer >= 0 ? " from worker " + std::to_string(peer) : std::string{}) +
                                     ": the workers called collectives of different sizes (turn on "
                                     "check_fingerprints to see each worker's call)");
    fail_with<collective_aborted>(where + " failed" + (peer >= 0 ? " talking to worker " + std::to_string(peer) : std::string{}) +
                                  ": " + detail::mpi_error_string(code));
  }

  [[noreturn]] void report_window_failure(const active_call& c, detail::window_failure f) {
    const std::string where = "distribute: " + detail::describe_at(c.call) + " on worker " + std::to_string(rank()) +
                              " of " + std::to_string(size());
    switch (f.what) {
      case detail::window_failure::kind::mismatch:
        throw collective_mismatch(f.message);  // found before any data moved: the communicator goes on
      case detail::window_failure::kind::peer_failed:
        fail_with<collective_aborted>(where + " stopped: worker " + std::to_string(f.worker) + " failed: " + f.message);
      case detail::window_failure::kind::timeout:
        break;
    }
    std::string msg = where + " " + timed_out_after(c) + " waiting for worker" + (f.late.size() == 1 ? " " : "s ");
    for (std::size_t i = 0; i < f.late.size(); ++i) msg += (i ? ", " : "") + std::to_string(f.late[i]);
    fail_with<collective_timeout>(msg + " (a worker died, stalled, or called a different collective)");
  }

  // "timed out after T ms (waited W ms)": W counts from the start of the collective, whose deadline
  // is T later.
  std::string timed_out_after(const active_call& c) const {
    const auto timeout = s_->options.collectives.timeout;
    return distribute::detail::timed_out_after(timeout, c.deadline - timeout);
  }

  [[noreturn]] void report_timeout(const active_call& c) {
    std::vector<int> waiting;
    for (std::size_t i = 0; i < s_->requests.size(); ++i) {
      int done = 1;
      if (s_->requests[i] != MPI_REQUEST_NULL) MPI_Request_get_status(s_->requests[i], &done, MPI_STATUS_IGNORE);
      if (!done && std::find(waiting.begin(), waiting.end(), s_->peers[i]) == waiting.end()) waiting.push_back(s_->peers[i]);
    }
    std::sort(waiting.begin(), waiting.end());
    std::string msg = "distribute: " + detail::describe_at(c.call) + " on worker " + std::to_string(rank()) + " of " +
                      std::to_string(size()) + " " + timed_out_after(c);
    // A ring step waits for its neighbours only: the worker named may itself be waiting for the one
    // that never joined, which the workers next to that one name.
    if (!waiting.empty()) {
      msg += " waiting for a message from worker";
      msg += waiting.size() == 1 ? " " : "s ";
      for (std::size_t i = 0; i < waiting.size(); ++i) msg += (i ? ", " : "") + std::to_string(waiting[i]);
    }
    msg += " (a worker died, stalled, or called a different collective)";
    fail_with<collective_timeout>(msg);
  }

  // The messages of this collective may still be in flight into the caller's buffers: the
  // communicator is unusable, and the job is aborted (now if the process exits, else after the grace).
  template <class Error>
  [[noreturn]] void fail_with(const std::string& message) {
    leave(message);
    throw Error(message);
  }

  // Received pieces are combined while they are still in cache: a piece is about a quarter of a
  // core's L2, and two are in flight.
  template <class T>
  static constexpr std::size_t piece_elements = std::max<std::size_t>(1, (std::size_t{256} << 10) / sizeof(T));

  // Waits for requests [first, first + count) (and progresses the others).
  void complete_range(const active_call& c, std::size_t first, std::size_t count) {
    state& s = *s_;
    if (count == 0) return;
    auto& statuses = s.statuses;
    statuses.resize(s.requests.size());
    const auto start = std::chrono::steady_clock::now();
    for (std::uint64_t i = 0;; ++i) {
      int done = 0;
      const int rc = MPI_Testall(static_cast<int>(count), s.requests.data() + first, &done, statuses.data() + first);
      if (rc != MPI_SUCCESS) report_error(c, rc, statuses);
      if (done) {
        check_received(c, first, count);
        return;
      }
      if ((i & 63) != 63) continue;
      const auto now = std::chrono::steady_clock::now();
      if (now >= c.deadline) report_timeout(c);
      if (now - start > std::chrono::milliseconds(100)) std::this_thread::sleep_for(std::chrono::microseconds(20));
      else if (now - start > std::chrono::milliseconds(1)) std::this_thread::yield();
    }
  }

  // Ring reduce-scatter in place over the buffers taken as one: afterwards block rank() holds the
  // reduction of every worker's block rank() (divided by `mean_over` for a mean); other blocks hold
  // partial results. At step s this worker sends block (rank-s-1) and receives block (rank-s-2) from
  // its left, which it combines as (left's partial, own), so block b is combined in the order b+1,
  // b+2, ..., b.
  template <class T>
  void ring_reduce_scatter(reduce_op op, std::span<const std::span<T>> bufs, std::size_t n, int mean_over,
                           const active_call& c) {
    const int k = size(), r = rank();
    const reduce_op sum_op = op == reduce_op::mean ? reduce_op::sum : op;
    constexpr std::size_t piece = piece_elements<T>;
    if (k > 1) {
      T* const slots = scratch<T>(s_->incoming, 2 * piece);
      std::vector<std::span<T>> pieces;
      for (int s = 0; s < k - 1; ++s) {
        const int sb = ((r - s - 1) % k + k) % k, rb = ((r - s - 2) % k + k) % k;
        s_->requests.clear();
        s_->peers.clear();
        s_->expected.clear();
        detail::for_each_run(bufs, detail::block_begin(n, k, sb), detail::block_begin(n, k, sb + 1), piece,
                       [&](T* p, std::size_t m, std::size_t) { post_send(p, m * sizeof(T), right(), tag_reduce); });
        pieces.clear();
        detail::for_each_run(bufs, detail::block_begin(n, k, rb), detail::block_begin(n, k, rb + 1), piece,
                       [&](T* p, std::size_t m, std::size_t) { pieces.emplace_back(p, m); });
        std::vector<std::size_t> index(pieces.size());  // of each piece's receive in the request list
        auto receive = [&](std::size_t i) {
          index[i] = s_->requests.size();
          post_recv(slots + (i % 2) * piece, pieces[i].size_bytes(), left(), tag_reduce);
        };
        for (std::size_t i = 0; i < std::min<std::size_t>(2, pieces.size()); ++i) receive(i);
        for (std::size_t i = 0; i < pieces.size(); ++i) {
          complete_range(c, index[i], 1);
          const void* srcs[2] = {slots + (i % 2) * piece, pieces[i].data()};
          void* dst[1] = {pieces[i].data()};
          detail::reduce_range<T>(sum_op, srcs, 2, 0, pieces[i].size(), dst, 1);
          if (i + 2 < pieces.size()) receive(i + 2);
        }
        complete(c);  // the sends
      }
    }
    if (op == reduce_op::mean)
      detail::for_each_run(bufs, detail::block_begin(n, k, r), detail::block_begin(n, k, r + 1), std::max<std::size_t>(n, 1), [&](T* p, std::size_t m, std::size_t) {
        for (std::size_t i = 0; i < m; ++i) p[i] = distribute::detail::finish(op, p[i], mean_over);
      });
  }

  template <class T>
  void ring_all_reduce(reduce_op op, std::span<const std::span<T>> bufs, int mean_over, const active_call& c) {
    std::size_t n = 0;
    for (const auto b : bufs) n += b.size();
    ring_reduce_scatter(op, bufs, n, mean_over, c);
    const int k = size(), r = rank();
    for (int s = 0; s < k - 1; ++s) {
      const int sb = ((r - s) % k + k) % k, rb = ((r - s - 1) % k + k) % k;
      s_->requests.clear();
      s_->peers.clear();
      s_->expected.clear();
      detail::for_each_run(bufs, detail::block_begin(n, k, rb), detail::block_begin(n, k, rb + 1), piece_elements<T>,
                     [&](T* p, std::size_t m, std::size_t) { post_recv(p, m * sizeof(T), left(), tag_gather); });
      detail::for_each_run(bufs, detail::block_begin(n, k, sb), detail::block_begin(n, k, sb + 1), piece_elements<T>,
                     [&](T* p, std::size_t m, std::size_t) { post_send(p, m * sizeof(T), right(), tag_gather); });
      complete(c);
    }
  }

  template <class T>
  void ring_all_gather(std::span<const T> in, std::span<T> out, const std::vector<std::size_t>& counts, const active_call& c) {
    const int k = size(), r = rank();
    std::vector<std::size_t> offsets(counts.size() + 1, 0);
    for (std::size_t w = 0; w < counts.size(); ++w) offsets[w + 1] = offsets[w] + counts[w];
    T* mine = out.data() + offsets[static_cast<std::size_t>(r)];
    if (!in.empty() && in.data() != mine) std::memmove(mine, in.data(), in.size_bytes());
    for (int s = 0; s < k - 1; ++s) {
      const auto sb = static_cast<std::size_t>(((r - s) % k + k) % k), rb = static_cast<std::size_t>(((r - s - 1) % k + k) % k);
      s_->requests.clear();
      post_recv(out.data() + offsets[rb], counts[rb] * sizeof(T), left(), tag_gather);
      post_send(out.data() + offsets[sb], counts[sb] * sizeof(T), right(), tag_gather);
      complete(c);
    }
  }

  std::shared_ptr<state> s_;
};

}  // namespace distribute::comm

namespace distribute {
// The name the strategies use: multi_worker_mirrored_strategy<cpu, mpi>.
using mpi = comm::mpi;
}  // namespace distribute
