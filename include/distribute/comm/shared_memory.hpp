#pragma once
// Collectives between the replica threads of one process.
//
// This header is over 600 lines for two classes that stay together: the group's meeting and the
// endpoint's collectives share one failure path (a rank that fails or leaves releases the others'
// waits), and the endpoint works on the group's private state.
//
// Every rank publishes where its buffers are, the ranks meet, and then each rank does its own share
// of the work directly on the others' memory: for an all-reduce, rank r owns one slice of the
// (flattened) buffers, reads that slice from every rank, combines the contributions in rank order
// and writes the result into that slice of every rank's buffer. No thread reduces everything alone,
// nothing is staged through an extra copy, and the result is bit-identical on every rank and from run
// to run. A second meeting tells every rank that all slices are written.
//
// Before any rank touches another's memory, the published descriptions (collective, dtype, op, root,
// sizes) are compared; replicas that disagree all get a `collective_mismatch` naming what each one
// called. A rank that waits longer than the group's timeout, or that waits for a replica that has
// left the step, gets `collective_timeout`; when any rank fails, the others get `collective_aborted`
// at once.
//
// Point-to-point: `send(buf, dst, tag)` and `recv(buf, src, tag)` between two replica threads (see
// detail/mailbox.hpp). A send never waits for its receiver; a recv waits for the message within the
// group's timeout. A message whose element type or length differs from what the receiver asked for,
// a sender that never sends, or one that finished the step without sending, fails the receiver (and
// the group) with an error naming both ends.
//
// Sub-groups: `split(color, key)` (as MPI_Comm_split) gives every replica an endpoint of the group of
// the replicas that passed the same color, ranked by key then by rank. A sub-group lives as long as
// its parent; it starts its steps, and fails, with the parent, and its errors name replicas by their
// rank in the outermost group.

#include <distribute/concepts/communicator.hpp>
#include <distribute/comm/argument_checks.hpp>
#include <distribute/comm/detail/collective_descriptor.hpp>
#include <distribute/comm/detail/mailbox.hpp>
#include <distribute/comm/detail/reduce_kernel.hpp>
#include <distribute/comm/detail/rendezvous.hpp>
#include <distribute/collective_options.hpp>
#include <distribute/collective_origin.hpp>
#include <distribute/dtype.hpp>
#include <distribute/errors.hpp>
#include <distribute/reduce_op.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute {

namespace comm {

class shared_memory;

// The shared state of one group of replica threads. Create one per group; each thread talks through
// its own `shared_memory` endpoint from `endpoint(rank)`.
class shared_memory_group {
 public:
  explicit shared_memory_group(int size, collective_options options = {})
      : shared_memory_group(size, options, nullptr, {}) {}
  shared_memory_group(const shared_memory_group&) = delete;
  shared_memory_group& operator=(const shared_memory_group&) = delete;

  int size() const noexcept { return size_; }
  inline shared_memory endpoint(int rank);

  const collective_options& options() const noexcept { return options_; }
  // Only between steps, while no rank is inside a collective. Sub-groups follow.
  void set_options(collective_options options) {
    options_ = options;
    for_each_child([&](shared_memory_group& c) { c.set_options(options); });
  }

  // Start a new step: clears failures, departures, collective counts and undelivered messages, in
  // the sub-groups too. Only while no rank is inside a collective.
  void reset() {
    rendezvous_.reset();
    for (auto& s : slots_) {
      s.seq.store(0, std::memory_order_relaxed);
      s.departed.store(false, std::memory_order_relaxed);
    }
    for (int q = 0; q < size_; ++q) {
      auto& box = mailboxes_[static_cast<std::size_t>(q)];
      std::lock_guard lk(box.mu);
      box.queue.clear();
      box.wait = {};
    }
    for_each_child([](shared_memory_group& c) { c.reset(); });
  }

  // Rank `rank` has finished its part of the step; collectives and receives still waiting for it
  // fail at once, in the sub-groups too.
  void depart(int rank) {
    slots_[static_cast<std::size_t>(rank)].departed.store(true, std::memory_order_release);
    rendezvous_.depart();
    wake_mailboxes();
    for_each_child([&](shared_memory_group& c) {
      const int r = c.rank_of(name(rank));
      if (r >= 0) c.depart(r);
    });
  }

  // Rank `rank` failed with `cause`; every rank waiting in, or later entering, a collective of this
  // step (of this group, its parent or its sub-groups) fails with `collective_aborted`. The first
  // cause is kept.
  void fail(int rank, std::exception_ptr cause) {
    abort_all(cause, "replica " + std::to_string(name(rank)) + " failed: " + what(cause));
  }

  // The first failure of this step, or null.
  std::exception_ptr first_failure() const { return rendezvous_.cause(); }

  // How replica `rank` of this group is named in messages: its rank in the outermost group.
  int name(int rank) const noexcept { return names_.empty() ? rank : names_[static_cast<std::size_t>(rank)]; }

 private:
  friend class shared_memory;

  struct alignas(64) slot {
    detail::descriptor posted[2];       // by parity of the collective count: see `collective`
    std::atomic<std::uint64_t> seq{0};  // collectives this rank has entered in this step
    std::atomic<bool> departed{false};
    std::vector<void*> scratch;  // one pointer per rank, used only by the owning rank
    std::uint64_t splits = 0;    // `split` calls of this rank, over the group's life
  };

  // A sub-group made by `split`: the `index`-th split of the parent, for one color.
  struct child {
    std::uint64_t index;
    int color;
    std::unique_ptr<shared_memory_group> group;
  };

  shared_memory_group(int size, collective_options options, shared_memory_group* parent, std::vector<int> names)
      : size_{check_size(size)},
        options_{options},
        rendezvous_{size},
        slots_(static_cast<std::size_t>(size)),
        mailboxes_{std::make_unique<detail::mailbox[]>(static_cast<std::size_t>(size))},
        parent_{parent},
        names_{std::move(names)} {
    for (auto& s : slots_) s.scratch.resize(static_cast<std::size_t>(size));
  }

  static int check_size(int n) {
    if (n < 1) throw std::invalid_argument("distribute: a shared-memory group needs at least one rank");
    return n;
  }

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

  // This group's rank of the replica named `id`, or -1.
  int rank_of(int id) const noexcept {
    for (int r = 0; r < size_; ++r)
      if (name(r) == id) return r;
    return -1;
  }

  template <class F>
  void for_each_child(F&& f) {
    std::lock_guard lk(children_mu_);
    for (auto& c : children_) f(*c.group);
  }

  void wake_mailboxes() {
    for (int q = 0; q < size_; ++q) mailboxes_[static_cast<std::size_t>(q)].wake();
  }

  // Fails the outermost group and every sub-group: whoever waits anywhere in the step stops.
  void abort_all(const std::exception_ptr& cause, const std::string& message) {
    shared_memory_group* g = this;
    while (g->parent_) g = g->parent_;
    g->abort_tree(cause, message);
  }
  void abort_tree(const std::exception_ptr& cause, const std::string& message) {
    rendezvous_.abort(cause, message);
    wake_mailboxes();
    for_each_child([&](shared_memory_group& c) { c.abort_tree(cause, message); });
  }

  // The sub-group of the `index`-th split for `color`, made by the first of its members to ask.
  shared_memory_group& sub_group(std::uint64_t index, int color, const std::vector<int>& members) {
    std::lock_guard lk(children_mu_);
    for (auto& c : children_)
      if (c.index == index && c.color == color) return *c.group;
    std::vector<int> names;
    for (int m : members) names.push_back(name(m));
    children_.push_back({index, color,
                         std::unique_ptr<shared_memory_group>(new shared_memory_group(
                             static_cast<int>(members.size()), options_, this, std::move(names)))});
    return *children_.back().group;
  }

  int size_;
  collective_options options_;
  detail::rendezvous rendezvous_;
  std::vector<slot> slots_;
  std::unique_ptr<detail::mailbox[]> mailboxes_;  // one per receiving rank
  shared_memory_group* parent_ = nullptr;
  std::vector<int> names_;  // empty in the outermost group
  std::mutex children_mu_;
  std::vector<child> children_;
};

// One rank's endpoint of a `shared_memory_group`. Cheap to copy; the group must outlive it.
class shared_memory {
 public:
  shared_memory(shared_memory_group& group, int rank) : g_{&group}, rank_{rank} {
    if (rank < 0 || rank >= group.size())
      throw std::invalid_argument("distribute: rank " + std::to_string(rank) + " is not in a group of " +
                                  std::to_string(group.size()));
  }

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return g_->size_; }

  template <element T>
  void all_reduce(reduce_op op, std::span<T> buf) {
    detail::segment seg{buf.data(), buf.size()};
    all_reduce_segments<T>(op, &seg, 1, buf.size());
  }

  // Several buffers reduced as one collective (one meeting, not one per buffer).
  template <element T>
  void all_reduce(reduce_op op, std::span<const std::span<T>> bufs) {
    std::size_t total = 0;
    const auto segs = detail::segments_of(bufs, total);
    all_reduce_segments<T>(op, segs.data(), segs.size(), total);
  }

  template <element T>
  void reduce_scatter(reduce_op op, std::span<const T> in, std::span<T> out) {
    comm::check_block_sizes("reduce_scatter", in.size(), out.size(), size());
    detail::descriptor d{.kind = detail::collective_kind::reduce_scatter,
                         .type = dtype_of<T>,
                         .op = op,
                         .count = in.size(),
                         .out_count = out.size(),
                         .in = in.data(),
                         .out = out.data()};
    collective(d, [&](const slot_view& v) {
      const std::size_t m = out.size();
      void** srcs = v.mine.scratch.data();
      for (int q = 0; q < size(); ++q)
        srcs[q] = const_cast<T*>(static_cast<const T*>(v.posted(q).in)) + static_cast<std::size_t>(rank_) * m;
      void* dst = out.data();
      detail::reduce_range<T>(op, srcs, size(), 0, m, &dst, 1);
    });
  }

  template <element T>
  void all_gather(std::span<const T> in, std::span<T> out) {
    comm::check_block_sizes("all_gather", out.size(), in.size(), size());
    detail::descriptor d{.kind = detail::collective_kind::all_gather,
                         .type = dtype_of<T>,
                         .count = in.size(),
                         .out_count = out.size(),
                         .in = in.data(),
                         .out = out.data()};
    collective(d, [&](const slot_view& v) {
      const std::size_t m = in.size();
      for (int q = 0; q < size(); ++q) {
        const T* src = static_cast<const T*>(v.posted(q).in);
        T* dst = out.data() + static_cast<std::size_t>(q) * m;
        if (m != 0 && src != dst) std::memmove(dst, src, m * sizeof(T));
      }
    });
  }

  template <element T>
  void broadcast(std::span<T> buf, int root) {
    comm::check_root(root, size());
    detail::segment seg{buf.data(), buf.size()};
    detail::descriptor d{.kind = detail::collective_kind::broadcast,
                         .type = dtype_of<T>,
                         .root = root,
                         .count = buf.size(),
                         .segs = &seg,
                         .n_segs = 1};
    collective(d, [&](const slot_view& v) {
      if (rank_ == root || buf.empty()) return;
      detail::copy_bytes(buf.data(), v.posted(root).segs[0].data, buf.size() * sizeof(T));
    });
  }

  void barrier() { collective(detail::descriptor{.kind = detail::collective_kind::barrier}, nullptr); }

  // Sends `buf` to rank `dst` of this group, matched by `tag` (>= 0). Returns at once: the receiver
  // gets the values even if `buf` changes afterwards.
  template <element T>
  void send(std::span<const T> buf, int dst, int tag) {
    check_peer("send", dst, tag);
    auto& g = *g_;
    const detail::p2p_call call = detail::p2p_call_of<T>(dst, tag, buf.size());
    if (g.rendezvous_.aborted())
      throw collective_aborted("distribute: " + describe_send(rank_, call) + " was abandoned because " +
                               g.rendezvous_.cause_message());
    if (g.slots_[static_cast<std::size_t>(dst)].departed.load(std::memory_order_acquire))
      p2p_failure<collective_timeout>(describe_send(rank_, call) + " can never be received: replica " +
                                      std::to_string(g.name(dst)) + " finished the step");
    auto& box = g.mailboxes_[static_cast<std::size_t>(dst)];
    {
      std::lock_guard lk(box.mu);
      auto& w = box.wait;
      if (w.src == rank_ && w.call.tag == tag && !w.filled && box.find(rank_, tag) == box.queue.end() &&
          detail::same_payload(w.call, call)) {
        if (!buf.empty()) std::memcpy(w.data, buf.data(), buf.size_bytes());
        w.filled = true;
      } else {
        detail::p2p_message m{rank_, call, std::vector<std::byte>(buf.size_bytes())};
        if (!buf.empty()) std::memcpy(m.bytes.data(), buf.data(), buf.size_bytes());
        box.queue.push_back(std::move(m));
      }
    }
    box.cv.notify_all();
  }
  template <element T>
  void send(std::span<T> buf, int dst, int tag) {
    send(std::span<const T>(buf), dst, tag);
  }

  // Receives into `buf` the message that rank `src` sent with `tag`, waiting within the group's
  // timeout. Its element type and length must be `buf`'s.
  template <element T>
  void recv(std::span<T> buf, int src, int tag) {
    check_peer("recv", src, tag);
    auto& g = *g_;
    const detail::p2p_call call = detail::p2p_call_of<T>(src, tag, buf.size());
    auto& box = g.mailboxes_[static_cast<std::size_t>(rank_)];
    const auto started = std::chrono::steady_clock::now();
    const auto deadline = started + g.options_.timeout;
    std::unique_lock lk(box.mu);
    box.wait = {src, tag, call, buf.data(), false};
    struct clear_wait {
      detail::mailbox& b;
      ~clear_wait() { b.wait = {}; }
    } const clear{box};
    enum class why { none, delivered, queued, aborted, departed, timed_out };
    why w = why::none;
    auto it = box.queue.end();
    const auto ready = [&] {
      if (box.wait.filled) w = why::delivered;
      else if ((it = box.find(src, tag)) != box.queue.end()) w = why::queued;
      else if (g.rendezvous_.aborted()) w = why::aborted;
      else if (g.slots_[static_cast<std::size_t>(src)].departed.load(std::memory_order_acquire)) w = why::departed;
      return w != why::none;
    };
    if (!box.cv.wait_until(lk, deadline, ready)) w = why::timed_out;
    switch (w) {
      case why::delivered: return;
      case why::queued: {
        if (!detail::same_payload(it->call, call)) {
          const std::string msg = describe_recv(rank_, call) + " met " + describe_send(src, it->call);
          box.queue.erase(it);
          lk.unlock();
          p2p_failure<collective_mismatch>(msg);
        }
        if (!buf.empty()) std::memcpy(buf.data(), it->bytes.data(), buf.size_bytes());
        box.queue.erase(it);
        return;
      }
      case why::aborted:
        lk.unlock();
        throw collective_aborted("distribute: " + describe_recv(rank_, call) + " was abandoned because " +
                                 g.rendezvous_.cause_message());
      case why::departed:
        lk.unlock();
        p2p_failure<collective_timeout>(describe_recv(rank_, call) + " can never complete: replica " +
                                        std::to_string(g.name(src)) + " finished the step without sending it");
      case why::none:
      case why::timed_out: break;
    }
    lk.unlock();
    p2p_failure<collective_timeout>("replica " + std::to_string(g.name(rank_)) + " " +
                                    distribute::detail::timed_out_after(g.options_.timeout, started) +
                                    " waiting for a message from replica " + std::to_string(g.name(src)) + " (" +
                                    describe_recv(rank_, call, false) + ") that replica " +
                                    std::to_string(g.name(src)) + " never sent");
  }

  // A collective: this replica's endpoint of the group of the replicas that passed the same `color`
  // (>= 0), ranked by `key`, then by rank. Every rank of this group calls it. The sub-group lives as
  // long as this group.
  shared_memory split(int color, int key) {
    if (color < 0) throw std::invalid_argument("distribute: split needs a color >= 0, got " + std::to_string(color));
    const collective_label label("split");
    const int mine[2] = {color, key};
    std::vector<int> all(2 * static_cast<std::size_t>(size()));
    all_gather(std::span<const int>(mine, 2), std::span<int>(all));
    std::vector<int> members;
    for (int q = 0; q < size(); ++q)
      if (all[2 * static_cast<std::size_t>(q)] == color) members.push_back(q);
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
      return all[2 * static_cast<std::size_t>(a) + 1] < all[2 * static_cast<std::size_t>(b) + 1];
    });
    const std::uint64_t index = g_->slots_[static_cast<std::size_t>(rank_)].splits++;
    shared_memory_group& sub = g_->sub_group(index, color, members);
    const auto me = std::find(members.begin(), members.end(), rank_) - members.begin();
    return shared_memory(sub, static_cast<int>(me));
  }

  // An all-reduce that rank 0 carries out for the group with another communicator: every rank posts its
  // buffers and meets the others (a mismatch between ranks is found as in all_reduce); rank 0 calls
  // `work` with every rank's buffers, in rank order, while the others wait at a barrier. When `work`
  // throws on rank 0, the others' wait ends as any failed meeting does (the caller aborts the group).
  template <element T, class Work>
  void all_reduce_by_first(reduce_op op, std::span<const std::span<T>> bufs, Work&& work) {
    std::size_t total = 0;
    const auto segs = detail::segments_of(bufs, total);
    const detail::descriptor d{.kind = detail::collective_kind::all_reduce,
                               .type = dtype_of<T>,
                               .op = op,
                               .count = total,
                               .segs = segs.data(),
                               .n_segs = segs.size()};
    const slot_view v = post_and_meet(d);
    if (rank_ == 0) {
      std::vector<std::vector<std::span<T>>> lists(static_cast<std::size_t>(size()));
      std::vector<std::span<const std::span<T>>> views;
      for (int q = 0; q < size(); ++q) {
        const auto& posted = v.posted(q);
        for (std::size_t i = 0; i < posted.n_segs; ++i)
          lists[static_cast<std::size_t>(q)].emplace_back(static_cast<T*>(posted.segs[i].data), posted.segs[i].size);
        views.emplace_back(lists[static_cast<std::size_t>(q)]);
      }
      work(std::span<const std::span<const std::span<T>>>(views));
    }
    barrier();
  }

 private:
  using slot = shared_memory_group::slot;

  struct slot_view {
    shared_memory_group* g;
    std::size_t parity;
    slot& mine;
    const detail::descriptor& posted(int q) const { return g->slots_[static_cast<std::size_t>(q)].posted[parity]; }
  };

  void check_peer(const char* what, int peer, int tag) const {
    if (peer < 0 || peer >= size() || peer == rank_)
      throw std::invalid_argument(std::string("distribute: ") + what + " on replica " +
                                  std::to_string(g_->name(rank_)) + " names rank " + std::to_string(peer) +
                                  "; it must be another rank of this group of " + std::to_string(size()));
    if (tag < 0)
      throw std::invalid_argument(std::string("distribute: ") + what + " needs a tag >= 0, got " + std::to_string(tag));
  }

  // "replica 0's send of 64 float32, tag 3, to replica 1 from X in step 2"
  std::string describe_send(int from, const detail::p2p_call& c) const {
    return "replica " + std::to_string(g_->name(from)) + "'s send of " + detail::payload(c) + ", to replica " +
           std::to_string(g_->name(c.peer)) + distribute::detail::describe_origin(c.api, c.step, c.in_step);
  }
  std::string describe_recv(int at, const detail::p2p_call& c, bool with_owner = true) const {
    return (with_owner ? "replica " + std::to_string(g_->name(at)) + "'s " : std::string{}) + "recv of " +
           detail::payload(c) + " from replica " + std::to_string(g_->name(c.peer)) +
           distribute::detail::describe_origin(c.api, c.step, c.in_step);
  }

  // A point-to-point failure fails the whole group (as a collective's does), then this replica.
  template <class Error>
  [[noreturn]] void p2p_failure(const std::string& what) {
    const std::string msg = "distribute: " + what;
    const Error error(msg);
    g_->abort_all(std::make_exception_ptr(error), msg);
    throw error;
  }

  template <class T>
  void all_reduce_segments(reduce_op op, const detail::segment* segs, std::size_t n_segs, std::size_t total) {
    detail::descriptor d{.kind = detail::collective_kind::all_reduce,
                         .type = dtype_of<T>,
                         .op = op,
                         .count = total,
                         .segs = segs,
                         .n_segs = n_segs};
    collective(d, [&](const slot_view& v) {
      // This rank's slice of the flattened buffers, in whole cache lines so that no two ranks write
      // the same line.
      const int n = size();
      const std::size_t unit = std::max<std::size_t>(1, 64 / sizeof(T));
      const std::size_t units = (total + unit - 1) / unit;
      const std::size_t lo =
          std::min(total, units * static_cast<std::size_t>(rank_) / static_cast<std::size_t>(n) * unit);
      const std::size_t hi =
          std::min(total, units * static_cast<std::size_t>(rank_ + 1) / static_cast<std::size_t>(n) * unit);
      void** ptrs = v.mine.scratch.data();
      std::size_t offset = 0;
      for (std::size_t i = 0; i < n_segs && offset < hi; offset += segs[i].size, ++i) {
        const std::size_t b = std::max(lo, offset), e = std::min(hi, offset + segs[i].size);
        if (b >= e) continue;
        for (int q = 0; q < n; ++q) ptrs[q] = v.posted(q).segs[i].data;
        // Sources and destinations are the same buffers: each chunk is read completely before it is
        // written, and no other rank touches this slice.
        detail::reduce_range<T>(op, ptrs, n, b - offset, e - offset, ptrs, n);
      }
    });
  }

  // The protocol every collective follows: post, meet (may fail), compare, work, meet again.
  //
  // Descriptions are posted in one of two places by the parity of the collective's number: a rank can
  // only post collective k+2 after every rank reached collective k+1, that is after every rank
  // finished reading the descriptions of collective k.
  template <class Work>
  void collective(const detail::descriptor& d, const Work& work) {
    const slot_view view = post_and_meet(d);
    if constexpr (!std::is_same_v<Work, std::nullptr_t>) {
      work(view);
      g_->rendezvous_.arrive_and_wait({}, /*may_fail=*/false);
    }
  }

  // Post, meet (may fail), compare: every rank's description is then readable until the next meeting.
  slot_view post_and_meet(const detail::descriptor& d) {
    auto& g = *g_;
    slot& mine = g.slots_[static_cast<std::size_t>(rank_)];
    const std::uint64_t seq = mine.seq.load(std::memory_order_relaxed);
    const std::size_t parity = seq & 1;
    mine.posted[parity] = d;
    const collective_origin& origin = distribute::detail::current_origin;
    mine.posted[parity].api = origin.api;
    mine.posted[parity].step = origin.step;
    mine.posted[parity].in_step = origin.in_step;
    mine.seq.store(seq + 1, std::memory_order_relaxed);

    const auto started = std::chrono::steady_clock::now();
    const auto outcome = g.rendezvous_.arrive_and_wait(started + g.options_.timeout, /*may_fail=*/true);
    if (outcome != detail::rendezvous::outcome::completed) fail(outcome, mine.posted[parity], seq, started);

    const slot_view view{&g, parity, mine};
    if (auto message = mismatch(view, seq)) {
      // Every rank reaches the same verdict; meet once more so that no rank unwinds while another is
      // still reading its description.
      g.rendezvous_.arrive_and_wait({}, /*may_fail=*/false);
      throw collective_mismatch(*message);
    }
    return view;
  }

  std::optional<std::string> mismatch(const slot_view& v, std::uint64_t seq) const {
    bool all_same = true;
    for (int q = 1; q < size() && all_same; ++q) all_same = detail::same_call(v.posted(0), v.posted(q));
    if (all_same) return std::nullopt;
    // Group the replicas by what they called.
    std::vector<std::pair<const detail::descriptor*, std::vector<int>>> groups;
    for (int q = 0; q < size(); ++q) {
      auto it = std::find_if(groups.begin(), groups.end(),
                             [&](const auto& gr) { return detail::same_call(*gr.first, v.posted(q)); });
      if (it == groups.end()) groups.push_back({&v.posted(q), {q}});
      else it->second.push_back(q);
    }
    std::string msg = "distribute: replicas disagree on collective #" + std::to_string(seq + 1) + " of this step: ";
    for (std::size_t i = 0; i < groups.size(); ++i)
      msg += (i ? "; " : "") + detail::list_replicas(named(groups[i].second)) + " called " +
             detail::describe(*groups[i].first);
    return msg;
  }

  [[noreturn]] void fail(detail::rendezvous::outcome outcome, const detail::descriptor& d, std::uint64_t seq,
                         std::chrono::steady_clock::time_point started) {
    auto& g = *g_;
    const std::string where = detail::describe(d) + " (collective #" + std::to_string(seq + 1) +
                              " of this step) on replica " + std::to_string(g.name(rank_));
    if (outcome == detail::rendezvous::outcome::aborted)
      throw collective_aborted("distribute: " + where + " was abandoned because " + g.rendezvous_.cause_message());

    std::vector<int> departed, behind;
    for (int q = 0; q < size(); ++q) {
      const auto& s = g.slots_[static_cast<std::size_t>(q)];
      if (s.departed.load(std::memory_order_acquire)) departed.push_back(q);
      else if (s.seq.load(std::memory_order_relaxed) <= seq) behind.push_back(q);
    }
    std::string msg = "distribute: " + where;
    if (outcome == detail::rendezvous::outcome::departed) {
      msg += " can never complete: " + detail::list_replicas(named(departed)) +
             " finished the step without joining it (every replica must call the same collectives in the same order)";
    } else {
      msg += " " + distribute::detail::timed_out_after(g.options_.timeout, started);
      if (!behind.empty()) msg += ": " + detail::list_replicas(named(behind)) + " never joined it";
    }
    // Fail the whole group now, so that the other replicas stop waiting too.
    const collective_timeout error(msg);
    g.abort_all(std::make_exception_ptr(error), msg);
    throw error;
  }

  std::vector<int> named(std::vector<int> ranks) const {
    for (int& r : ranks) r = g_->name(r);
    return ranks;
  }

  shared_memory_group* g_;
  int rank_;
};

inline shared_memory shared_memory_group::endpoint(int rank) { return shared_memory(*this, rank); }

static_assert(distribute::point_to_point_communicator<shared_memory>);

}  // namespace comm
}  // namespace distribute
