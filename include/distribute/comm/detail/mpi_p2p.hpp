#pragma once
// The point-to-point messages of the MPI communicator (comm/mpi.hpp): what travels ahead of the data,
// the sends still in flight, and how both ends of a message are named in errors.
//
// A message is two or more MPI messages with one MPI tag: a header (what the sender called: element
// type, count, and where it was issued), then the data in pieces of at most 1 GiB (none when it is
// empty). MPI delivers the messages of one sender with one tag in the order they were sent, so the
// receiver reads the header first and then receives exactly what the header announces: into the
// caller's buffer when it is what the caller asked for, else into scratch memory, so that a mismatch
// is reported with both calls named and the sender's message is still taken off the wire.

#include <distribute/collective_origin.hpp>
#include <distribute/comm/mpi_runtime.hpp>
#include <distribute/dtype.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace distribute::comm::detail {

// Point-to-point tags are 0 .. p2p_tag_limit - 1 (fewer where the MPI library's MPI_TAG_UB is lower).
inline constexpr int p2p_tag_limit = 1 << 16;
// The MPI tag of user tag t is p2p_tag_base + t: above the collectives' own tags (1 .. 5), so that the
// two never match, on the one MPI communicator they share.
inline constexpr int p2p_tag_base = 16;

// What the sender called, sent ahead of its data.
struct p2p_header {
  std::int64_t type = 0;   // dtype
  std::int64_t count = 0;  // elements
  std::int64_t bytes = 0;  // of the data that follows
  std::int64_t step = -1;  // where it was issued (collective_origin.hpp)
  std::int64_t in_step = 0;
  char api[48]{};

  template <element T>
  static p2p_header of(std::size_t count, const collective_origin& o) noexcept {
    p2p_header h;
    h.type = static_cast<std::int64_t>(dtype_of<T>);
    h.count = static_cast<std::int64_t>(count);
    h.bytes = static_cast<std::int64_t>(count * sizeof(T));
    h.step = o.step;
    h.in_step = o.in_step ? 1 : 0;
    if (o.api) std::strncpy(h.api, o.api, sizeof h.api - 1);
    return h;
  }

  bool same_payload(const p2p_header& other) const noexcept { return type == other.type && count == other.count; }

  // "64 float32"
  std::string payload() const {
    const bool known = type >= 0 && type <= static_cast<std::int64_t>(dtype::bfloat16);
    return std::to_string(count) + " " +
           (known ? std::string(distribute::to_string(static_cast<dtype>(type)))
                  : "elements of type #" + std::to_string(type));
  }
  // " from pipeline forward in step 2", or ""
  std::string origin() const {
    const std::string label(api, strnlen(api, sizeof api));
    return distribute::detail::describe_origin(label.c_str(), step, in_step != 0);
  }
};

// A send in flight: this worker's copy of the data (the caller may reuse its buffer at once) and the
// MPI requests reading it.
struct p2p_send {
  p2p_header header;
  std::vector<std::byte> data;
  std::vector<MPI_Request> requests;
  int dst = 0;
  int tag = 0;
};

// "worker 0's send of 80 float32, tag 3, to worker 1 from X in step 2"
inline std::string describe_send(int from, int to, int tag, const p2p_header& h) {
  return "worker " + std::to_string(from) + "'s send of " + h.payload() + ", tag " + std::to_string(tag) +
         ", to worker " + std::to_string(to) + h.origin();
}

}  // namespace distribute::comm::detail
