#pragma once
// The point-to-point messages waiting for one replica thread of a shared-memory group.
//
// A message is handed over in one copy when its receiver is already waiting: the sender writes
// straight into the receiver's buffer. Otherwise the sender copies it into the mailbox (so `send`
// never waits for the receiver) and the receiver copies it out. Messages are matched by (sender,
// tag); between one pair, messages with the same tag arrive in the order they were sent.

#include <distribute/collective_origin.hpp>
#include <distribute/dtype.hpp>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace distribute::comm::detail {

// What one end of a point-to-point message called, for matching and for error messages.
struct p2p_call {
  int peer = 0;  // the other end: the destination of a send, the source of a recv
  int tag = 0;
  dtype type = dtype::float32;
  std::size_t count = 0;
  // Where it was issued (collective_origin.hpp).
  const char* api = nullptr;
  std::int64_t step = -1;
  bool in_step = false;
};

inline bool same_payload(const p2p_call& a, const p2p_call& b) noexcept {
  return a.type == b.type && a.count == b.count;
}

// This thread's call of a send to, or a recv from, `peer` of `count` elements of T.
template <class T>
p2p_call p2p_call_of(int peer, int tag, std::size_t count) {
  const collective_origin& o = distribute::detail::current_origin;
  return {peer, tag, dtype_of<T>, count, o.api, o.step, o.in_step};
}

// "64 float32, tag 3": what a call carries, for error messages.
inline std::string payload(const p2p_call& c) {
  return std::to_string(c.count) + " " + std::string(distribute::to_string(c.type)) + ", tag " + std::to_string(c.tag);
}

struct p2p_message {
  int src = 0;
  p2p_call call;                 // the sender's call (`peer` is the destination)
  std::vector<std::byte> bytes;  // a copy of the payload
};

struct mailbox {
  // A receiver waiting with its own buffer.
  struct waiting {
    int src = -1;
    int tag = 0;
    p2p_call call;  // the receiver's call
    void* data = nullptr;
    bool filled = false;
  };

  std::mutex mu;
  std::condition_variable cv;
  std::vector<p2p_message> queue;
  waiting wait;  // `src` < 0: nobody waits

  // The first queued message from `src` with `tag`, or end().
  std::vector<p2p_message>::iterator find(int src, int tag) {
    for (auto it = queue.begin(); it != queue.end(); ++it)
      if (it->src == src && it->call.tag == tag) return it;
    return queue.end();
  }

  void wake() {
    { std::lock_guard lk(mu); }
    cv.notify_all();
  }
};

}  // namespace distribute::comm::detail
