#pragma once
// All-reduce between workers on one machine through an MPI shared-memory window.
//
// When every process of the communicator runs on one machine (MPI_Comm_split_type with
// MPI_COMM_TYPE_SHARED finds them all), MPI_Win_allocate_shared maps a slot of each worker into every
// other: the workers then reduce by reading each other's slots directly, as replica threads do in one
// process, instead of passing messages through MPI's transport (which copies every byte in and out
// of its own buffers, and hands large messages over in a rendezvous). MPI still provides the memory,
// the placement of the processes and the launch; the window only replaces the messages.
//
// Each slot has a control block (a phase counter, what the worker's current collective is, a failure
// flag) and two halves of `chunk_bytes` used in turn. A buffer of n elements is processed in chunks of
// at most chunk_bytes; for each chunk, with P workers and the chunk cut into P segments:
//
//   A  copy every segment but my own (r) into my half; publish; wait for everyone
//      (the first chunk also compares what every worker called: a mismatch is found here, in any
//      build, and the chunk is abandoned before anyone reads a half, so its half is used again)
//   D  reduce segment r: my own data and segment r of every other half, in worker order, into my
//      buffer and into segment r of my half (then free: I did not copy it in A); publish; wait
//   F  copy segment q of worker q's half into my buffer, for every q != r
//
// Every element is combined once, by one worker, in worker order, and copied to the others: all
// workers hold the same bits, whatever the chunk size. A small buffer takes one meeting instead: every
// worker copies all of it in, publishes, waits, and reduces all of it from every slot in worker order
// (the same sum, so the same bits everywhere; see small_bytes). Two halves make the reuse safe: a worker writes
// a half again two chunks later, after its wait in D of the chunk between, and every other worker
// finished reading that half (F) before it published that chunk's A.
//
// A wait polls the other workers' counters against the deadline and their failure flags; a worker
// that is late is named, one that failed is reported with its own message. The counters are C++
// atomics in memory shared between processes (lock-free, so address-free).

#include <distribute/comm/detail/copy_bytes.hpp>
#include <distribute/comm/detail/flat_ranges.hpp>
#include <distribute/comm/detail/mpi_call.hpp>
#include <distribute/comm/detail/reduce_kernel.hpp>
#include <distribute/comm/mpi_runtime.hpp>
#include <distribute/detail/backoff.hpp>
#include <distribute/reduce_op.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace distribute::comm::detail {

// Why a wait in the window did not end with every worker there.
struct window_failure {
  enum class kind { timeout, peer_failed, mismatch };
  kind what = kind::timeout;
  std::vector<int> late;  // timeout: the workers that had not arrived
  int worker = -1;        // peer_failed: the worker that failed
  std::string message;    // peer_failed: its message; mismatch: every worker's call
};

// A worker's contribution to `len` elements at (buffer i, element at) of its lists of buffers: its one
// list's, or its lists' combined (the tree over list order of reduce_kernel.hpp), written to `to`
// (which may be the first list's own elements). `srcs` has room for a pointer per list.
template <class T>
void combine_lists(reduce_op op, std::span<const std::span<const std::span<T>>> lists, std::size_t i, std::size_t at,
                   std::size_t len, T* to, const void** srcs) {
  if (lists.size() == 1) {
    if (to != lists[0][i].data() + at) copy_bytes(to, lists[0][i].data() + at, len * sizeof(T));
    return;
  }
  for (std::size_t l = 0; l < lists.size(); ++l) srcs[l] = lists[l][i].data() + at;
  void* dst[1] = {to};
  reduce_range<T>(op, srcs, static_cast<int>(lists.size()), 0, len, dst, 1);
}

class mpi_node_window {
 public:
  static_assert(std::atomic<std::uint64_t>::is_always_lock_free && std::atomic<std::uint32_t>::is_always_lock_free,
                "counters shared between processes must be lock-free");

  // Collective over `comm` (rank `rank` of `size`). Null when some worker does not `want` it, when
  // the workers are not all on one machine, or when MPI could not make the window; every worker gets
  // the same answer, and the smallest chunk any worker asked for.
  static std::unique_ptr<mpi_node_window> create(MPI_Comm comm, int rank, int size, bool want,
                                                 std::size_t chunk_bytes) {
    if (size < 2) return nullptr;
    // Workers that disagree would otherwise wait in different collectives, or read each other's
    // slots at different offsets.
    unsigned long long agreed[2] = {want ? 1ull : 0ull, static_cast<unsigned long long>(chunk_bytes)};
    MPI_Allreduce(MPI_IN_PLACE, agreed, 2, MPI_UNSIGNED_LONG_LONG, MPI_MIN, comm);
    if (agreed[0] == 0) return nullptr;
    chunk_bytes = static_cast<std::size_t>(agreed[1]);
    MPI_Comm node = MPI_COMM_NULL;
    if (MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) != MPI_SUCCESS) return nullptr;
    int node_size = 0;
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
    if (node_size != size) return nullptr;  // the same answer everywhere: some worker is elsewhere

    chunk_bytes = std::max<std::size_t>(chunk_bytes, 4096) / 64 * 64;
    auto w = std::unique_ptr<mpi_node_window>(new mpi_node_window(rank, size, chunk_bytes));
    MPI_Info info = MPI_INFO_NULL;
    MPI_Info_create(&info);
    // Each slot where its owner runs (first touch), rather than one block on one NUMA node.
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    void* base = nullptr;
    const int rc =
        MPI_Win_allocate_shared(static_cast<MPI_Aint>(slot_bytes(chunk_bytes)), 1, info, comm, &base, &w->win_);
    MPI_Info_free(&info);
    int ok = rc == MPI_SUCCESS ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm);
    if (!ok) return nullptr;  // a window made on some workers only is left, not freed (freeing is collective)
    for (int q = 0; q < size; ++q) {
      MPI_Aint bytes = 0;
      int unit = 0;
      void* p = nullptr;
      MPI_Win_shared_query(w->win_, q, &bytes, &unit, &p);
      // MPI aligns a slot only to 8 bytes; a page boundary lies at the same place in every mapping.
      const auto at = (reinterpret_cast<std::uintptr_t>(p) + page - 1) / page * page;
      w->slots_[static_cast<std::size_t>(q)] = reinterpret_cast<std::byte*>(at);
    }
    new (w->slots_[static_cast<std::size_t>(rank)]) control{};
    MPI_Barrier(comm);  // every control block is constructed before anyone reads one
    return w;
  }

  mpi_node_window(const mpi_node_window&) = delete;
  mpi_node_window& operator=(const mpi_node_window&) = delete;
  // The window is left to the end of the job unless `release` ran: freeing it waits for every worker.
  ~mpi_node_window() = default;

  // Collective: every worker frees its window at the same point (when its communicator goes away).
  void release() {
    if (win_ != MPI_WIN_NULL) MPI_Win_free(&win_);
  }

  // How the workers are named in the window's messages (see compare_calls); by default their ranks.
  void name_workers(std::vector<int> names) { names_ = std::move(names); }

  // Tells the other workers that this one failed (they stop waiting for it at once).
  void mark_failed(const std::string& message) noexcept {
    control& c = ctl(rank_);
    const std::size_t n = std::min(message.size(), sizeof(c.message) - 1);
    std::memcpy(c.message, message.data(), n);
    c.message[n] = '\0';
    c.failed.store(1, std::memory_order_release);
  }

  // Compares what every worker called (the fingerprint check of collectives that do not move their
  // data through the window): one meeting, and a `mismatch` failure on every worker that disagrees.
  template <class Fail>
  void check_calls(const mpi_call& call, std::chrono::steady_clock::time_point deadline, Fail&& fail) {
    write_call(call);
    publish();
    wait_all(deadline, fail);
    compare_calls_or_fail(deadline, fail);
  }

  // All-reduce of n elements. This worker contributes the sum (or other op) of `locals`: one or more
  // lists of buffers of the same shape, each taken as one sequence of n elements (the buffers of
  // several replicas of this worker), and every list receives the result. A mean is summed and
  // divided by `mean_over`. `fail` is called (and must throw) when a wait fails or the workers disagree.
  template <class T, class Fail>
  void all_reduce(reduce_op op, std::span<const std::span<const std::span<T>>> locals, std::size_t n, int mean_over,
                  const mpi_call& call, std::chrono::steady_clock::time_point deadline, Fail&& fail) {
    const int P = size_, r = rank_;
    const std::size_t R = locals.size();
    const reduce_op sum_op = op == reduce_op::mean ? reduce_op::sum : op;
    const std::size_t chunk = std::max<std::size_t>(1, chunk_bytes_ / sizeof(T));
    const std::size_t chunks = std::max<std::size_t>(1, (n + chunk - 1) / chunk);
    const std::size_t everything = n + 1;  // a run length that never cuts
    const auto first = locals[0];
    srcs_.resize(static_cast<std::size_t>(P) + R);
    dsts_.resize(R + 1);
    // Pointers to the run at (buffer, at) of every local list.
    auto gather = [&](auto* out, std::size_t buffer, std::size_t at) {
      for (std::size_t l = 0; l < R; ++l) out[l] = locals[l][buffer].data() + at;
    };
    if (n * sizeof(T) * static_cast<std::size_t>(P) <= small_bytes && n * sizeof(T) <= chunk_bytes_)
      return small_all_reduce(op, locals, n, mean_over, call, deadline, fail);
    for (std::size_t c = 0; c < chunks; ++c) {
      const std::size_t lo = c * chunk, m = std::min(chunk, n - lo);
      auto seg = [&](int q) { return block_begin(m, P, q); };
      auto in_half = [&](int q) { return current_half<T>(q); };

      // A: publish what the others reduce (this worker's contributions combined, in local order).
      T* const mine = in_half(r);
      for (int q = 0; q < P; ++q) {
        if (q == r) continue;
        for_each_run_at(first, lo + seg(q), lo + seg(q + 1), everything,
                        [&](std::size_t i, std::size_t at, std::size_t len, std::size_t off) {
                          combine_lists(sum_op, locals, i, at, len, mine + seg(q) + off, srcs_.data());
                        });
      }
      if (c == 0) write_call(call);
      publish();
      wait_all(deadline, fail);
      if (c == 0) compare_calls_or_fail(deadline, fail);

      // D: reduce my segment, in worker order, into every local list and my half. Every worker's
      // contribution is its lists combined first (as the others published theirs), so the grouping is
      // the same in every segment: the tree over workers of the trees over their lists
      // (reduce_kernel.hpp); this worker's own tree is combined chunk by chunk on the way.
      for_each_run_at(first, lo + seg(r), lo + seg(r + 1), everything,
                      [&](std::size_t i, std::size_t at, std::size_t len, std::size_t off) {
                        T* const out = mine + seg(r) + off;
                        for (int q = 0; q < P; ++q)
                          srcs_[static_cast<std::size_t>(q)] = q == r ? nullptr : in_half(q) + seg(r) + off;
                        gather(srcs_.data() + P, i, at);  // this worker's lists
                        auto reduce = [&](int n_dst) {
                          if (R == 1) {
                            srcs_[static_cast<std::size_t>(r)] = srcs_[static_cast<std::size_t>(P)];
                            reduce_range<T>(sum_op, srcs_.data(), P, 0, len, dsts_.data(), n_dst);
                          } else {
                            reduce_nested_range<T>(sum_op, srcs_.data(), P, r, srcs_.data() + P, static_cast<int>(R), 0,
                                                   len, dsts_.data(), n_dst);
                          }
                        };
                        dsts_[0] = out;
                        if (op == reduce_op::mean) {
                          reduce(1);
                          for (std::size_t e = 0; e < len; ++e)
                            out[e] = distribute::detail::finish(op, out[e], mean_over);
                          for (std::size_t l = 0; l < R; ++l)
                            copy_bytes(locals[l][i].data() + at, out, len * sizeof(T));
                        } else {
                          gather(dsts_.data() + 1, i, at);
                          reduce(static_cast<int>(R) + 1);
                        }
                      });
      publish();
      wait_all(deadline, fail);

      // F: take every other worker's segment, into every local list.
      for (int q = 0; q < P; ++q) {
        if (q == r) continue;
        const T* const from = in_half(q) + seg(q);
        for_each_run_at(first, lo + seg(q), lo + seg(q + 1), everything,
                        [&](std::size_t i, std::size_t at, std::size_t len, std::size_t off) {
                          for (std::size_t l = 0; l < R; ++l)
                            copy_bytes(locals[l][i].data() + at, from + off, len * sizeof(T));
                        });
      }
      ++turn_;
    }
  }

 private:
  // While the buffer times the worker count is at most this many bytes, an all-reduce is one meeting
  // rather than two: every worker publishes its whole buffer and reduces all of it itself, reading
  // every slot in worker order, so every worker computes the same bits. It reads P times the bytes,
  // which costs less than a second meeting while they are few (measured with 2 workers: 4-byte
  // all-reduces 1.15-2.2x MPI_Allreduce this way, 0.9-1.65x in two meetings; even at 64 KiB).
  static constexpr std::size_t small_bytes = std::size_t{128} << 10;

  template <class T, class Fail>
  void small_all_reduce(reduce_op op, std::span<const std::span<const std::span<T>>> locals, std::size_t n,
                        int mean_over, const mpi_call& call, std::chrono::steady_clock::time_point deadline,
                        Fail& fail) {
    const int P = size_;
    const std::size_t R = locals.size();
    const reduce_op sum_op = op == reduce_op::mean ? reduce_op::sum : op;
    const auto first = locals[0];
    const std::size_t everything = n + 1;
    auto in_half = [&](int q) { return current_half<T>(q); };
    T* const mine = in_half(rank_);
    for_each_run_at(first, 0, n, everything, [&](std::size_t i, std::size_t at, std::size_t len, std::size_t off) {
      combine_lists(sum_op, locals, i, at, len, mine + off, srcs_.data());
    });
    write_call(call);
    publish();
    wait_all(deadline, fail);
    compare_calls_or_fail(deadline, fail);
    for_each_run_at(first, 0, n, everything, [&](std::size_t i, std::size_t at, std::size_t len, std::size_t off) {
      for (int q = 0; q < P; ++q) srcs_[static_cast<std::size_t>(q)] = in_half(q) + off;
      T* const out = first[i].data() + at;
      void* dst[1] = {out};
      reduce_range<T>(sum_op, srcs_.data(), P, 0, len, dst, 1);
      if (op == reduce_op::mean)
        for (std::size_t e = 0; e < len; ++e) out[e] = distribute::detail::finish(op, out[e], mean_over);
      for (std::size_t l = 1; l < R; ++l) copy_bytes(locals[l][i].data() + at, out, len * sizeof(T));
    });
    ++turn_;
  }

  // The half of worker q's slot that this chunk uses.
  template <class T>
  T* current_half(int q) const noexcept {
    return reinterpret_cast<T*>(slots_[static_cast<std::size_t>(q)] + header_bytes + (turn_ & 1) * chunk_bytes_);
  }

  struct control {
    alignas(64) std::atomic<std::uint64_t> phase{0};  // polled by every other worker: a line of its own
    // What the worker called, written before the phase that publishes it. Two, used in turn: a worker
    // writes one again only after every other worker has published the phase after reading it.
    alignas(64) mpi_call calls[2]{};
    alignas(64) std::atomic<std::uint32_t> failed{0};
    char message[1024]{};
  };
  static constexpr std::size_t page = 4096;
  static constexpr std::size_t header_bytes = (sizeof(control) + page - 1) / page * page;
  static constexpr std::size_t slot_bytes(std::size_t chunk_bytes) noexcept {
    return page + header_bytes + 2 * chunk_bytes;
  }

  mpi_node_window(int rank, int size, std::size_t chunk_bytes)
      : rank_{rank}, size_{size}, chunk_bytes_{chunk_bytes}, slots_(static_cast<std::size_t>(size)) {}

  control& ctl(int q) noexcept {
    return *std::launder(reinterpret_cast<control*>(slots_[static_cast<std::size_t>(q)]));
  }

  void write_call(const mpi_call& call) noexcept { ctl(rank_).calls[calls_ & 1] = call; }

  // After the meeting that published every worker's call: everyone compares the same records and
  // reaches the same verdict. On a mismatch the workers meet once more (so that no record is rewritten
  // before everyone has read it, and the counters stay in step) and `fail` reports it; the
  // communicator goes on.
  template <class Fail>
  void compare_calls_or_fail(std::chrono::steady_clock::time_point deadline, Fail& fail) {
    std::vector<mpi_call> calls(static_cast<std::size_t>(size_));
    for (int q = 0; q < size_; ++q) calls[static_cast<std::size_t>(q)] = ctl(q).calls[calls_ & 1];
    ++calls_;
    if (auto message = compare_calls(calls, names_); !message.empty()) {
      publish();
      wait_all(deadline, fail);
      fail(window_failure{window_failure::kind::mismatch, {}, -1, std::move(message)});
    }
  }

  void publish() noexcept { ctl(rank_).phase.store(++phase_, std::memory_order_release); }

  // Until every worker has published phase_. Spins while the others are likely running, then yields,
  // then sleeps in short steps (a slow peer should not take a core from the replicas).
  template <class Fail>
  void wait_all(std::chrono::steady_clock::time_point deadline, Fail& fail) {
    auto arrived = [&] {
      for (int q = 0; q < size_; ++q)
        if (ctl(q).phase.load(std::memory_order_acquire) < phase_) return false;
      return true;
    };
    if (arrived()) return;
    const auto start = std::chrono::steady_clock::now();
    for (std::uint64_t i = 1;; ++i) {
      if (arrived()) return;
      if ((i & 63) != 0) {
        distribute::detail::cpu_relax();
        continue;
      }
      for (int q = 0; q < size_; ++q)
        if (q != rank_ && ctl(q).failed.load(std::memory_order_acquire) &&
            ctl(q).phase.load(std::memory_order_acquire) < phase_)
          fail(window_failure{window_failure::kind::peer_failed, {}, q, std::string(ctl(q).message)});
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        window_failure f;
        for (int q = 0; q < size_; ++q)
          if (ctl(q).phase.load(std::memory_order_acquire) < phase_) f.late.push_back(q);
        if (f.late.empty()) return;
        fail(std::move(f));
      }
      if (now - start > std::chrono::milliseconds(100)) std::this_thread::sleep_for(std::chrono::microseconds(20));
      else if (now - start > distribute::detail::spin_time) std::this_thread::yield();
    }
  }

  int rank_, size_;
  std::size_t chunk_bytes_;
  std::vector<std::byte*> slots_;  // every worker's slot, mapped here
  std::vector<const void*> srcs_;
  std::vector<void*> dsts_;
  MPI_Win win_ = MPI_WIN_NULL;
  std::uint64_t phase_ = 0;  // phases this worker has published
  std::vector<int> names_;   // how each worker is named in messages; empty: by rank
  std::uint64_t turn_ = 0;   // chunks done: which half is next
  std::uint64_t calls_ = 0;  // calls compared: which record is next
};

}  // namespace distribute::comm::detail
