#pragma once
// Collectives between processes (workers), over MPI.
//
// This header is over 600 lines for one class, and stays one: every member of `mpi` posts and
// completes its requests in the one state its copies share (detail/mpi_state.hpp) and fails through
// one path (`fail_with`, which takes the worker out of the job), and the collectives, the rings they
// are built from and the point-to-point messages are all made of those members. What needs neither
// lives apart: the options (mpi_options.hpp), the calls' fingerprints (detail/mpi_call.hpp), the
// messages' headers (detail/mpi_p2p.hpp) and the shared-memory path (detail/mpi_node_window.hpp).
//
// Every collective is built from non-blocking point-to-point messages (MPI_Isend / MPI_Irecv) and
// completed by polling against a deadline, so that a worker that died or stalled is reported instead
// of waited for: the call fails with `collective_timeout` naming the collective and the workers it
// was waiting for, and the job is then aborted (see comm/mpi_runtime.hpp), because a collective
// cannot be withdrawn once its messages are posted.
//
// The algorithms are the bandwidth-optimal rings (all-reduce = ring reduce-scatter + ring
// all-gather) rather than MPI's own non-blocking collectives, which Open MPI runs through a generic
// schedule several times slower than its blocking MPI_Allreduce. The ring also makes a reduction
// deterministic: each slice of the result is combined once, in a fixed order, and then copied to
// every worker, so every worker holds the same bits, run after run.
//
// With `check_fingerprints` (on by default in builds without NDEBUG), every collective starts with
// an exchange (through the shared-memory window when there is one) of what each worker called
// (kind, element type, op, count, root, sequence number); workers that disagree all get a
// `collective_mismatch` naming each worker's call, before any data moves. Without it, a size
// mismatch is still an error (a message longer or shorter than the receiver expects), but an op
// mismatch is not seen. All workers must use the same setting.
//
// When every worker runs on one machine, all-reduce does not pass messages at all: the workers share
// an MPI window (MPI_Win_allocate_shared) and reduce by reading each other's memory, which is several
// times faster than MPI's own transport at the sizes of gradients (detail/mpi_node_window.hpp). That
// path compares every worker's call in any build, so a mismatched all-reduce is always named there.
// Workers spread over several machines use the ring.
//
// Point-to-point messages between two workers:
//
//   send(buf, dst, tag)   to worker `dst` of this communicator; returns at once
//   recv(buf, src, tag)   the message worker `src` sent with `tag`, into `buf`
//
// - `tag` is 0 <= tag < tag_limit() (65536, or less where MPI's MPI_TAG_UB is lower); `dst` and `src`
//   are other workers of this communicator (never this one). Anything else is std::invalid_argument.
// - `send` copies `buf` and posts the copy (MPI_Isend), then returns: it never waits for the
//   receiver, whatever the size, so workers that all send before they receive (a ring, a pipeline's
//   activations forward and gradients backward at once) do not deadlock. The copy is freed once MPI
//   has delivered it, which every later call on this communicator checks. A send is not waited for
//   by `barrier` or the collectives: waiting there would deadlock `send; barrier; recv` once a
//   message is too large for MPI to deliver eagerly. Only when the last copy of the communicator goes
//   does it wait for its sends in flight (within the timeout; one it gives up on is reported on
//   stderr and its memory left to MPI). A large message moves while its sender is inside some call on
//   this communicator (MPI has no progress of its own here): a sender that computes for long between
//   calls delays it.
// - Between one pair, messages with the same tag arrive in the order they were sent (MPI's
//   non-overtaking rule); messages with different tags may be received in any order.
// - `recv` waits for the message within `collective_options::timeout`, polling as the collectives do.
//   If none comes it throws `collective_timeout`:
//     distribute: worker 1 waited 2000 ms for a message from worker 0 (recv of 64 float32, tag 3 from
//     <the receiver's collective_origin>) that was never sent
// - The element type and count must be the sender's. Otherwise the message is still received (into
//   scratch memory: the sender is not left waiting) and `recv` throws `collective_mismatch`:
//     distribute: worker 1's recv of 64 float32 from worker 0 (tag 3)<origin> met worker 0's send of
//     80 float32<origin>
// - Either error, or an MPI error, is a failure of this worker as a failed collective is: the
//   communicator refuses further calls and the job is aborted (comm/mpi_runtime.hpp). Once this
//   process has failed on any MPI communicator, every communicator of it refuses further calls.
// - The messages never match the collectives' own (their tags are disjoint: detail/mpi_p2p.hpp) nor
//   the program's (the communicator is a duplicate).
//
// Sub-communicators: `split(color, key)` is a collective (MPI_Comm_split semantics) that returns a
// communicator of the workers that passed the same `color` (>= 0), ranked by `key`, then by rank
// here. It owns its MPI communicator (freed with its last copy), starts with a copy of these options,
// and gets its own shared-memory window for all-reduce when its workers share a machine, as the
// world does. Its errors name workers by their rank in the communicator the chain of splits started
// from (the "worker" numbers of the whole job), and say which rank they have in the split one.

#include <distribute/concepts/communicator.hpp>
#include <distribute/collective_options.hpp>
#include <distribute/comm/argument_checks.hpp>
#include <distribute/comm/detail/copy_bytes.hpp>
#include <distribute/comm/detail/flat_ranges.hpp>
#include <distribute/comm/detail/mpi_call.hpp>
#include <distribute/comm/detail/mpi_node_window.hpp>
#include <distribute/comm/detail/mpi_p2p.hpp>
#include <distribute/comm/detail/mpi_state.hpp>
#include <distribute/comm/detail/reduce_kernel.hpp>
#include <distribute/comm/mpi_options.hpp>
#include <distribute/comm/mpi_runtime.hpp>
#include <distribute/detail/backoff.hpp>
#include <distribute/dtype.hpp>
#include <distribute/errors.hpp>
#include <distribute/reduce_op.hpp>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
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
    mpi_runtime::instance().fail(message, s_->options.abort_grace);
  }

  // Whether all-reduce goes through a shared-memory window (every worker on this machine, and
  // `shared_memory` on) rather than the ring of messages.
  bool uses_shared_memory() const noexcept { return s_->window != nullptr; }

  template <detail::mpi_value T>
  void all_reduce(reduce_op op, std::span<T> buf) {
    all_reduce(op, buf, size());
  }
  // `mean` divides by `mean_over` contributions instead of the worker count: for communicators that reduce
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
    if (mean_over < 1)
      throw std::invalid_argument("distribute: a mean over " + std::to_string(mean_over) + " contributions");
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
      detail::for_each_run_at(first, 0, total, total + 1,
                              [&](std::size_t i, std::size_t at, std::size_t len, std::size_t) {
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
    check_block_sizes("reduce_scatter", in.size(), out.size(), size());
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
    check_block_sizes("all_gather", out.size(), in.size(), size());
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
    check_root(root, size());
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

  // --- point-to-point (see the top of this file) ---

  // Tags are 0 <= tag < tag_limit().
  int tag_limit() const noexcept { return s_->tag_limit; }

  // Sends `buf` to worker `dst` of this communicator, matched by `tag`. Returns at once: `buf` may be
  // reused, and the receiver gets the values it held.
  template <element T>
  void send(std::span<const T> buf, int dst, int tag) {
    check_p2p("send", dst, tag);
    state& s = *s_;
    auto m = std::make_unique<detail::p2p_send>();
    m->header = detail::p2p_header::of<T>(buf.size(), distribute::detail::current_origin);
    m->dst = dst;
    m->tag = tag;
    refuse_if_failed([&] { return detail::describe_send(name(rank()), name(dst), tag, m->header); });
    reap_sends();
    m->data = spare_buffer(buf.size_bytes());
    if (!buf.empty()) detail::copy_bytes(m->data.data(), buf.data(), buf.size_bytes());
    detail::p2p_send& posted = *m;
    // Kept before posting: whatever was posted reads this memory until MPI is done with it.
    s.sends.push_back(std::move(m));
    const int mpi_tag = detail::p2p_tag_base + tag;
    auto isend = [&](const void* data, std::size_t bytes) {
      MPI_Request r = MPI_REQUEST_NULL;
      const int rc = MPI_Isend(data, static_cast<int>(bytes), MPI_BYTE, dst, mpi_tag, s.comm, &r);
      if (rc != MPI_SUCCESS)
        fail_with<collective_aborted>(
            "distribute: " + detail::describe_send(name(rank()), name(dst), tag, posted.header) +
            " could not be posted: " + mpi_error_string(rc));
      posted.requests.push_back(r);
    };
    isend(&posted.header, sizeof posted.header);
    for (std::size_t at = 0; at < posted.data.size(); at += max_message)
      isend(posted.data.data() + at, std::min(max_message, posted.data.size() - at));
  }
  template <element T>
  void send(std::span<T> buf, int dst, int tag) {
    send(std::span<const T>(buf), dst, tag);
  }

  // Receives into `buf` the message worker `src` of this communicator sent with `tag`, waiting for it
  // within the timeout. Its element type and count must be `buf`'s.
  template <element T>
  void recv(std::span<T> buf, int src, int tag) {
    check_p2p("recv", src, tag);
    state& s = *s_;
    const auto mine = detail::p2p_header::of<T>(buf.size(), distribute::detail::current_origin);
    const std::string me = "worker " + std::to_string(name(rank())), from = "worker " + std::to_string(name(src));
    auto described = [&] {
      return me + "'s recv of " + mine.payload() + " from " + from + " (tag " + std::to_string(tag) + ")" +
             mine.origin();
    };
    refuse_if_failed(described);
    reap_sends();
    const int mpi_tag = detail::p2p_tag_base + tag;
    const auto timeout = s.options.collectives.timeout;

    // The header: what the sender called.
    detail::p2p_header theirs;
    MPI_Request header = MPI_REQUEST_NULL;
    MPI_Status status;
    if (const int rc = MPI_Irecv(&theirs, sizeof theirs, MPI_BYTE, src, mpi_tag, s.comm, &header); rc != MPI_SUCCESS)
      fail_with<collective_aborted>("distribute: " + described() + " could not be posted: " + mpi_error_string(rc));
    if (!poll(&header, 1, &status, std::chrono::steady_clock::now() + timeout, described)) {
      // Withdrawn (or completed, should it match meanwhile) before `theirs` goes out of scope.
      MPI_Cancel(&header);
      MPI_Wait(&header, MPI_STATUS_IGNORE);
      fail_with<collective_timeout>("distribute: " + me + " waited " + std::to_string(timeout.count()) +
                                    " ms for a message from " + from + " (recv of " + mine.payload() + ", tag " +
                                    std::to_string(tag) + mine.origin() + ") that was never sent");
    }
    int got = 0;
    MPI_Get_count(&status, MPI_BYTE, &got);
    if (got != static_cast<int>(sizeof theirs) || theirs.bytes < 0)
      fail_with<collective_mismatch>("distribute: " + described() +
                                     " met a message that is not a send of this library");

    // The data, exactly as announced: into `buf`, or into scratch memory when it is not what `buf` is.
    const bool same = theirs.same_payload(mine) && theirs.bytes == mine.bytes;
    std::vector<std::byte> elsewhere;
    std::byte* into = reinterpret_cast<std::byte*>(buf.data());
    if (!same) {
      elsewhere.resize(static_cast<std::size_t>(theirs.bytes));
      into = elsewhere.data();
    }
    const auto bytes = static_cast<std::size_t>(theirs.bytes);
    std::vector<MPI_Request> pieces;
    std::vector<std::size_t> lengths;
    for (std::size_t at = 0; at < bytes; at += max_message) {
      lengths.push_back(std::min(max_message, bytes - at));
      pieces.push_back(MPI_REQUEST_NULL);
      if (const int rc =
              MPI_Irecv(into + at, static_cast<int>(lengths.back()), MPI_BYTE, src, mpi_tag, s.comm, &pieces.back());
          rc != MPI_SUCCESS)
        fail_with<collective_aborted>("distribute: " + described() + " could not be posted: " + mpi_error_string(rc));
    }
    std::vector<MPI_Status> statuses(pieces.size());
    // The sender posted its data with its header: a fresh timeout is only for a sender that stopped
    // between the two (or that holds a large message back while it computes).
    if (!poll(pieces.data(), static_cast<int>(pieces.size()), statuses.data(),
              std::chrono::steady_clock::now() + timeout, described)) {
      // The data may still arrive: the scratch memory is left to it (the job is being aborted).
      if (!same) (void)new std::vector<std::byte>(std::move(elsewhere));
      fail_with<collective_timeout>("distribute: " + described() + " received the header of " + from +
                                    "'s message but not its data within " + std::to_string(timeout.count()) + " ms");
    }
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      MPI_Get_count(&statuses[i], MPI_BYTE, &got);
      if (got != static_cast<int>(lengths[i]))
        fail_with<collective_mismatch>("distribute: " + described() + " received " + std::to_string(got) +
                                       " bytes where the sender announced " + std::to_string(lengths[i]));
    }
    if (!same)
      fail_with<collective_mismatch>("distribute: " + described() + " met " + from + "'s send of " + theirs.payload() +
                                     theirs.origin());
  }

  // --- sub-communicators ---

  // A collective: the communicator of the workers that passed the same `color` (>= 0), ranked by
  // `key`, then by their rank here (MPI_Comm_split). See the top of this file.
  mpi split(int color, int key) {
    if (color < 0) throw std::invalid_argument("distribute: split needs a color >= 0, got " + std::to_string(color));
    // The colors and keys first, through a collective that is bounded by the timeout and checked like
    // any other: MPI_Comm_split itself waits without limit for every worker.
    std::vector<int> all(2 * static_cast<std::size_t>(size()));
    {
      const collective_label label("split");
      const int mine[2] = {color, key};
      all_gather(std::span<const int>(mine, 2), std::span<int>(all));
    }
    std::vector<int> members;
    for (int q = 0; q < size(); ++q)
      if (all[2 * static_cast<std::size_t>(q)] == color) members.push_back(q);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return all[2 * static_cast<std::size_t>(a) + 1] < all[2 * static_cast<std::size_t>(b) + 1];
    });
    std::vector<int> names;
    for (const int q : members) names.push_back(name(q));
    MPI_Comm sub = MPI_COMM_NULL;
    if (const int rc = MPI_Comm_split(s_->comm, color, key, &sub); rc != MPI_SUCCESS)
      fail_with<collective_aborted>("distribute: split(color " + std::to_string(color) + ") on " + where() +
                                    " failed: " + mpi_error_string(rc));
    return mpi(std::make_shared<state>(adopt, sub, s_->options, std::move(names)));
  }

 private:
  using collective_kind = detail::collective_kind;

  enum tag : int { tag_fingerprint = 1, tag_reduce = 2, tag_gather = 3, tag_broadcast = 4, tag_barrier = 5 };
  // Messages larger than this are split: MPI counts are ints.
  static constexpr std::size_t max_message = std::size_t{1} << 30;

  using state = detail::mpi_state;
  static constexpr state::adopt_t adopt{};

  explicit mpi(std::shared_ptr<state> s) noexcept : s_{std::move(s)} {}

  // How worker `r` of this communicator is named in messages.
  int name(int r) const noexcept { return s_->names.empty() ? r : s_->names[static_cast<std::size_t>(r)]; }
  // "worker 1 of 3"; in a split communicator "worker 3 (rank 1 of 2 of a split communicator)".
  std::string where() const {
    if (s_->names.empty()) return "worker " + std::to_string(rank()) + " of " + std::to_string(size());
    return "worker " + std::to_string(name(rank())) + " (rank " + std::to_string(rank()) + " of " +
           std::to_string(size()) + " of a split communicator)";
  }
  std::string worker(int r) const { return "worker " + std::to_string(name(r)); }
  template <class Ranks>
  std::string workers(const Ranks& ranks) const {
    std::string s = ranks.size() == 1 ? "worker " : "workers ";
    for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(name(ranks[i]));
    return s;
  }

  // A failed communicator, or one of a process that failed on another communicator, refuses at once.
  // `describe()` names the call and the worker.
  template <class Describe>
  void refuse_if_failed(Describe&& describe) const {
    const state& s = *s_;
    auto& runtime = mpi_runtime::instance();
    if (s.failure.empty() && !runtime.failed()) return;
    const std::string why = s.failure.empty() ? runtime.failure_message() : s.failure;
    throw collective_aborted("distribute: " + describe() + " cannot run: an earlier collective failed: " + why);
  }

  void check_p2p(const char* what, int peer, int tag) const {
    if (tag < 0 || tag >= tag_limit())
      throw std::invalid_argument(std::string("distribute: ") + what + " on " + where() + " needs a tag 0 <= tag < " +
                                  std::to_string(tag_limit()) + ", got " + std::to_string(tag));
    if (peer < 0 || peer >= size() || peer == rank())
      throw std::invalid_argument(std::string("distribute: ") + what + " on " + where() + " (tag " +
                                  std::to_string(tag) + ") names rank " + std::to_string(peer) +
                                  "; it must be another rank of this communicator (0.." + std::to_string(size() - 1) +
                                  ", this worker is rank " + std::to_string(rank()) + ")");
  }

  // Memory for a send's copy: a delivered send's, when one is large enough.
  std::vector<std::byte> spare_buffer(std::size_t bytes) {
    auto& spare = s_->spare;
    for (auto it = spare.begin(); it != spare.end(); ++it)
      if (it->capacity() >= bytes) {
        std::vector<std::byte> b = std::move(*it);
        spare.erase(it);
        b.resize(bytes);
        return b;
      }
    return std::vector<std::byte>(bytes);
  }

  // Frees (for reuse) the copies of the sends MPI has delivered.
  void reap_sends() {
    state& s = *s_;
    for (std::size_t i = 0; i < s.sends.size();) {
      auto& m = *s.sends[i];
      int done = 0;
      if (const int rc =
              MPI_Testall(static_cast<int>(m.requests.size()), m.requests.data(), &done, MPI_STATUSES_IGNORE);
          rc != MPI_SUCCESS)
        fail_with<collective_aborted>(
            "distribute: " + detail::describe_send(name(rank()), name(m.dst), m.tag, m.header) +
            " failed: " + mpi_error_string(rc));
      if (!done) {
        ++i;
        continue;
      }
      constexpr std::size_t kept = 4;
      if (m.data.capacity() > 0 && s.spare.size() < kept) s.spare.push_back(std::move(m.data));
      s.sends.erase(s.sends.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  // Polls `n` requests until all complete (true) or `deadline` passes (false), backing off as
  // complete_range does; an MPI error fails the communicator.
  template <class Describe>
  bool poll(MPI_Request* requests, int n, MPI_Status* statuses, std::chrono::steady_clock::time_point deadline,
            Describe&& describe) {
    const auto start = std::chrono::steady_clock::now();
    for (std::uint64_t i = 0;; ++i) {
      int done = 0;
      if (const int rc = MPI_Testall(n, requests, &done, statuses); rc != MPI_SUCCESS)
        fail_with<collective_aborted>("distribute: " + describe() + " failed: " + mpi_error_string(rc));
      if (done) return true;
      if ((i & 63) != 63) continue;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return false;
      if (now - start > std::chrono::milliseconds(100)) std::this_thread::sleep_for(std::chrono::microseconds(20));
      else if (now - start > std::chrono::milliseconds(1)) std::this_thread::yield();
    }
  }

  struct active_call {
    detail::mpi_call call;
    std::chrono::steady_clock::time_point deadline;
  };

  static MPI_Comm world() {
    mpi_runtime::instance();
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
    active_call c{{static_cast<std::int64_t>(kind), type, static_cast<std::int64_t>(op),
                   static_cast<std::int64_t>(count), root, s.seq++},
                  std::chrono::steady_clock::now() + s.options.collectives.timeout};
    c.call.set_origin(distribute::detail::current_origin);
    refuse_if_failed([&] { return detail::describe_at(c.call) + " on " + where(); });
    if (!s.sends.empty()) reap_sends();
    if (s.options.check_fingerprints && s.size > 1) {
      // Through shared memory the calls are compared in one meeting; an all-reduce there compares
      // them itself, in any build.
      if (!s.window) check_fingerprints(c);
      else if (kind != collective_kind::all_reduce)
        s.window->check_calls(c.call, c.deadline,
                              [&](detail::window_failure f) { report_window_failure(c, std::move(f)); });
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
    if (auto message = detail::compare_calls(calls, s_->names); !message.empty()) throw collective_mismatch(message);
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
        fail_with<collective_aborted>("distribute: " + where() + " could not post a message to " + worker(peer) + ": " +
                                      mpi_error_string(rc));
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
        fail_with<collective_mismatch>(
            "distribute: " + detail::describe_at(c.call) + " on " + where() + " received " + std::to_string(got) +
            " bytes from " + worker(s.peers[i]) + " where it expected " + std::to_string(wanted) +
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
    const std::string at = "distribute: " + detail::describe_at(c.call) + " on " + where();
    if (error_class == MPI_ERR_TRUNCATE)
      fail_with<collective_mismatch>(at + " received a larger message than it expected" +
                                     (peer >= 0 ? " from " + worker(peer) : std::string{}) +
                                     ": the workers called collectives of different sizes (turn on "
                                     "check_fingerprints to see each worker's call)");
    fail_with<collective_aborted>(at + " failed" + (peer >= 0 ? " talking to " + worker(peer) : std::string{}) + ": " +
                                  mpi_error_string(code));
  }

  [[noreturn]] void report_window_failure(const active_call& c, detail::window_failure f) {
    const std::string at = "distribute: " + detail::describe_at(c.call) + " on " + where();
    switch (f.what) {
      case detail::window_failure::kind::mismatch:
        throw collective_mismatch(f.message);  // found before any data moved: the communicator goes on
      case detail::window_failure::kind::peer_failed:
        fail_with<collective_aborted>(at + " stopped: " + worker(f.worker) + " failed: " + f.message);
      case detail::window_failure::kind::timeout: break;
    }
    fail_with<collective_timeout>(at + " " + timed_out_after(c) + " waiting for " + workers(f.late) +
                                  " (a worker died, stalled, or called a different collective)");
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
      if (!done && std::find(waiting.begin(), waiting.end(), s_->peers[i]) == waiting.end())
        waiting.push_back(s_->peers[i]);
    }
    std::sort(waiting.begin(), waiting.end());
    std::string msg = "distribute: " + detail::describe_at(c.call) + " on " + where() + " " + timed_out_after(c);
    // A ring step waits for its neighbours only: the worker named may itself be waiting for the one
    // that never joined, which the workers next to that one name.
    if (!waiting.empty()) msg += " waiting for a message from " + workers(waiting);
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
        detail::for_each_run(
            bufs, detail::block_begin(n, k, sb), detail::block_begin(n, k, sb + 1), piece,
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
      detail::for_each_run(bufs, detail::block_begin(n, k, r), detail::block_begin(n, k, r + 1),
                           std::max<std::size_t>(n, 1), [&](T* p, std::size_t m, std::size_t) {
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
  void ring_all_gather(std::span<const T> in, std::span<T> out, const std::vector<std::size_t>& counts,
                       const active_call& c) {
    const int k = size(), r = rank();
    std::vector<std::size_t> offsets(counts.size() + 1, 0);
    for (std::size_t w = 0; w < counts.size(); ++w) offsets[w + 1] = offsets[w] + counts[w];
    T* mine = out.data() + offsets[static_cast<std::size_t>(r)];
    if (!in.empty() && in.data() != mine) std::memmove(mine, in.data(), in.size_bytes());
    for (int s = 0; s < k - 1; ++s) {
      const auto sb = static_cast<std::size_t>(((r - s) % k + k) % k),
                 rb = static_cast<std::size_t>(((r - s - 1) % k + k) % k);
      s_->requests.clear();
      post_recv(out.data() + offsets[rb], counts[rb] * sizeof(T), left(), tag_gather);
      post_send(out.data() + offsets[sb], counts[sb] * sizeof(T), right(), tag_gather);
      complete(c);
    }
  }

  std::shared_ptr<state> s_;
};

static_assert(distribute::point_to_point_communicator<mpi>);

}  // namespace distribute::comm

namespace distribute {
// The name the strategies use: multi_worker_mirrored_strategy<cpu, mpi>.
using mpi = comm::mpi;
}  // namespace distribute
