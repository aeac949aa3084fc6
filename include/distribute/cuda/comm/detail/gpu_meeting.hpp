#pragma once
// The host-side meeting of the GPU replicas of one process, shared by the `cuda_peer` and `nccl`
// communicators. It gives GPU collectives the failure semantics of the CPU ones (comm/shared_memory.hpp)
// before any GPU work is queued: every replica posts what it is about to call, the replicas meet
// (with the group's timeout, and at once when a replica has failed or has left the step without
// joining), and they compare the posts, so that a mismatch is a `collective_mismatch` naming the
// replicas instead of a GPU kernel that waits forever for a partner.
//
// Posts live in one of two places by the parity of the collective's number: a rank can only post
// collective k+2 once every rank has completed collective k+1, which no rank does before it has
// finished reading the posts of collective k. A post holds its own copy of the caller's segment list:
// the others read it (to compare sizes, and cuda_peer to find the buffers) after a fast replica may
// have returned from a collective that queued nothing, and freed its list.

#include <distribute/collective_options.hpp>
#include <distribute/comm/shared_memory.hpp>
#include <distribute/errors.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute::comm::detail {

class gpu_meeting {
 public:
  // `size` replicas of this process; `first_replica` is the number of the first of them among all
  // replicas in sync (non-zero under several workers), used to name replicas in messages.
  gpu_meeting(int size, collective_options options, int first_replica = 0)
      : size_{check_size(size)},
        first_{first_replica},
        options_{options},
        rendezvous_{size},
        slots_(static_cast<std::size_t>(size)) {}
  gpu_meeting(const gpu_meeting&) = delete;
  gpu_meeting& operator=(const gpu_meeting&) = delete;

  int size() const noexcept { return size_; }
  const collective_options& options() const noexcept { return options_; }
  void set_options(collective_options o) noexcept { options_ = o; }

  // Between steps only.
  void reset() noexcept {
    rendezvous_.reset();
    aborted_.store(false, std::memory_order_relaxed);
    for (auto& s : slots_) {
      s.seq.store(0, std::memory_order_relaxed);
      s.departed.store(false, std::memory_order_relaxed);
    }
  }
  void depart(int local) {
    slots_[idx(local)].departed.store(true, std::memory_order_release);
    rendezvous_.depart();
  }
  void fail(int local, std::exception_ptr cause) {
    abort(cause, "replica " + std::to_string(first_ + local) + " failed: " + what(cause));
  }
  void abort(std::exception_ptr cause, std::string message) {
    aborted_.store(true, std::memory_order_release);
    rendezvous_.abort(std::move(cause), std::move(message));
  }
  std::exception_ptr first_failure() const { return rendezvous_.cause(); }
  // Polled by replicas waiting on the GPU: another replica has failed.
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }
  std::string abort_reason() { return rendezvous_.cause_message(); }

  // Posts `d` as `local`'s next collective and meets the others. Returns the collective's number in
  // this step (0-based). Throws `collective_timeout`, `collective_aborted` or `collective_mismatch`;
  // every replica of a mismatch throws, after a second meeting so that none unwinds while another
  // still reads its post.
  std::uint64_t meet(int local, const descriptor& d) {
    slot& mine = slots_[idx(local)];
    const std::uint64_t seq = mine.seq.load(std::memory_order_relaxed);
    mine.posted[seq & 1] = d;
    auto& segs = mine.segs[seq & 1];
    segs.assign(d.segs, d.segs + d.n_segs);
    mine.posted[seq & 1].segs = segs.data();
    mine.posted[seq & 1].api = distribute::detail::current_origin.api;
    mine.posted[seq & 1].step = distribute::detail::current_origin.step;
    mine.posted[seq & 1].in_step = distribute::detail::current_origin.in_step;
    mine.seq.store(seq + 1, std::memory_order_release);
    if (size_ == 1) {
      if (aborted()) fail_meeting(rendezvous::outcome::aborted, local, d, seq);
      return seq;
    }
    const auto started = std::chrono::steady_clock::now();
    const auto outcome = rendezvous_.arrive_and_wait(started + options_.timeout, /*may_fail=*/true);
    if (outcome != rendezvous::outcome::completed) fail_meeting(outcome, local, d, seq, started);
    if (auto message = mismatch(seq)) {
      rendezvous_.arrive_and_wait({}, /*may_fail=*/false);
      throw collective_mismatch(*message);
    }
    return seq;
  }
  // Every replica that passed `meet` calls this once its work is done; it cannot fail.
  void meet_again() {
    if (size_ > 1) rendezvous_.arrive_and_wait({}, /*may_fail=*/false);
  }
  const descriptor& posted(int local, std::uint64_t seq) const { return slots_[idx(local)].posted[seq & 1]; }

  // A replica that gave up waiting on the GPU fails the whole group, so that the others stop too.
  [[noreturn]] void fail_waiting(int local, const descriptor& d, std::uint64_t seq, const std::string& why) {
    fail_waiting(where(local, d, seq), why);
  }
  // The same for work that is not one collective of the meeting (`what` names it).
  [[noreturn]] void fail_waiting(const std::string& what, const std::string& why) {
    const std::string msg = "distribute: " + what + " " + why;
    const collective_timeout error(msg);
    abort(std::make_exception_ptr(error), msg);
    throw error;
  }
  [[noreturn]] void fail_aborted(int local, const descriptor& d, std::uint64_t seq) {
    throw collective_aborted("distribute: " + where(local, d, seq) + " was abandoned because " + abort_reason());
  }
  std::string where(int local, const descriptor& d, std::uint64_t seq) const {
    return describe(d) + " (collective #" + std::to_string(seq + 1) + " of this step) on replica " +
           std::to_string(first_ + local);
  }

 private:
  struct alignas(64) slot {
    descriptor posted[2];
    std::vector<segment> segs[2];  // what posted[i].segs points at
    std::atomic<std::uint64_t> seq{0};
    std::atomic<bool> departed{false};
  };

  static int check_size(int n) {
    if (n < 1) throw std::invalid_argument("distribute: a GPU replica group needs at least one replica");
    return n;
  }
  static std::size_t idx(int local) noexcept { return static_cast<std::size_t>(local); }
  static std::string what(const std::exception_ptr& e) {
    try {
      if (e) std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      return ex.what();
    } catch (...) {
      return "an exception not derived from std::exception";
    }
    return "unknown error";
  }

  std::vector<int> named(const std::vector<int>& locals) const {
    std::vector<int> out;
    for (int q : locals) out.push_back(first_ + q);
    return out;
  }

  std::optional<std::string> mismatch(std::uint64_t seq) const {
    bool all_same = true;
    for (int q = 1; q < size_ && all_same; ++q) all_same = same_call(posted(0, seq), posted(q, seq));
    if (all_same) return std::nullopt;
    std::vector<std::pair<const descriptor*, std::vector<int>>> groups;
    for (int q = 0; q < size_; ++q) {
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& gr) { return same_call(*gr.first, posted(q, seq)); });
      if (it == groups.end()) groups.push_back({&posted(q, seq), {q}});
      else it->second.push_back(q);
    }
    std::string msg = "distribute: replicas disagree on collective #" + std::to_string(seq + 1) + " of this step: ";
    for (std::size_t i = 0; i < groups.size(); ++i)
      msg += (i ? "; " : "") + list_replicas(named(groups[i].second)) + " called " + describe(*groups[i].first);
    return msg;
  }

  // `started`: when the meeting began (for a timeout's message).
  [[noreturn]] void fail_meeting(rendezvous::outcome outcome, int local, const descriptor& d, std::uint64_t seq,
                                 std::chrono::steady_clock::time_point started = {}) {
    if (outcome == rendezvous::outcome::aborted) fail_aborted(local, d, seq);
    std::vector<int> departed, behind;
    for (int q = 0; q < size_; ++q) {
      const auto& s = slots_[idx(q)];
      if (s.departed.load(std::memory_order_acquire)) departed.push_back(q);
      else if (s.seq.load(std::memory_order_acquire) <= seq) behind.push_back(q);
    }
    std::string msg = "distribute: " + where(local, d, seq);
    if (outcome == rendezvous::outcome::departed) {
      msg += " can never complete: " + list_replicas(named(departed)) +
             " finished the step without joining it (every replica must call the same collectives in the same order)";
    } else {
      msg += " " + distribute::detail::timed_out_after(options_.timeout, started);
      if (!behind.empty()) msg += ": " + list_replicas(named(behind)) + " never joined it";
    }
    const collective_timeout error(msg);
    abort(std::make_exception_ptr(error), msg);
    throw error;
  }

  int size_;
  int first_;
  collective_options options_;
  rendezvous rendezvous_;
  std::vector<slot> slots_;
  std::atomic<bool> aborted_{false};
};

}  // namespace distribute::comm::detail
