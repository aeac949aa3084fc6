#pragma once
// What a worker calls, as the MPI communicator describes it in errors and compares across workers.
//
// The fingerprint (kind, element type, op, count, root, sequence number, and the API that issued it:
// collective_origin.hpp) is cheap to exchange: one ring all-gather of about a hundred bytes before the
// collective. Workers that disagree all reach the same
// verdict from the same gathered fingerprints, so they all throw the same `collective_mismatch`
// before any data moves, and the communicator stays usable.

#include <distribute/collective_origin.hpp>
#include <distribute/comm/detail/collective_descriptor.hpp>
#include <distribute/dtype.hpp>
#include <distribute/reduce_op.hpp>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::comm::detail {

// Element types the MPI communicator moves: collective elements, and for the strategy's cross-worker
// reductions any other arithmetic type (the communicator reduces itself and sends bytes).
template <class T>
concept mpi_value = element<T> || std::is_arithmetic_v<T>;

template <mpi_value T>
constexpr std::int64_t type_code() noexcept {
  if constexpr (element<T>) {
    return static_cast<std::int64_t>(dtype_of<T>);
  } else {
    return 64 + (std::is_floating_point_v<T> ? 32 : 0) + (std::is_signed_v<T> ? 16 : 0) +
           static_cast<std::int64_t>(sizeof(T));
  }
}

inline std::string type_name(std::int64_t code) {
  if (code < 64) return std::string(distribute::to_string(static_cast<dtype>(code)));
  const std::int64_t bits = (code & 15) * 8;
  if (code & 32) return "float" + std::to_string(bits) + " (arithmetic)";
  return std::string(code & 16 ? "int" : "uint") + std::to_string(bits) + " (arithmetic)";
}

struct mpi_call {
  std::int64_t kind = 0;   // collective_kind
  std::int64_t type = 0;   // type_code
  std::int64_t op = 0;     // reduce_op, for reductions
  std::int64_t count = 0;  // elements: the buffer (all_reduce, broadcast) or the input (all_gather, reduce_scatter)
  std::int64_t root = 0;   // broadcast
  std::int64_t seq = 0;    // collectives this communicator has run before this one
  // Where it was issued: the API's label (cut to fit), and the step, which is reported, not compared.
  char api[48]{};
  std::int64_t step = -1;
  std::int64_t in_step = 0;

  // Stamps the calling thread's origin (collective_origin.hpp) on the call.
  void set_origin(const collective_origin& o) noexcept {
    std::memset(api, 0, sizeof api);
    if (o.api) std::strncpy(api, o.api, sizeof api - 1);
    step = o.step;
    in_step = o.in_step ? 1 : 0;
  }

  friend bool operator==(const mpi_call& a, const mpi_call& b) noexcept {
    return a.kind == b.kind && a.type == b.type && a.op == b.op && a.count == b.count && a.root == b.root &&
           a.seq == b.seq && std::strncmp(a.api, b.api, sizeof a.api) == 0;
  }
};

inline std::string describe(const mpi_call& c) {
  const auto kind = static_cast<collective_kind>(c.kind);
  const std::string api(c.api, strnlen(c.api, sizeof c.api));
  const std::string origin = distribute::detail::describe_origin(api.c_str(), c.step, c.in_step != 0);
  std::string s = to_string(kind);
  if (kind == collective_kind::barrier) return s + origin;
  if (kind == collective_kind::all_reduce || kind == collective_kind::reduce_scatter)
    s += "(" + std::string(distribute::to_string(static_cast<reduce_op>(c.op))) + ")";
  if (kind == collective_kind::broadcast) s += " from worker " + std::to_string(c.root);
  return s + " of " + std::to_string(c.count) + " " + type_name(c.type) + origin;
}

inline std::string describe_at(const mpi_call& c) {
  return describe(c) + " (collective #" + std::to_string(c.seq + 1) + " across workers)";
}

// The workers grouped by what they called, or an empty string when all agree. `names[w]` is how
// worker w is named in the message (its rank in the communicator a sub-communicator was split from);
// empty: by its index.
inline std::string compare_calls(const std::vector<mpi_call>& calls, const std::vector<int>& names = {}) {
  if (std::all_of(calls.begin(), calls.end(), [&](const mpi_call& c) { return c == calls.front(); })) return {};
  std::vector<std::pair<mpi_call, std::vector<int>>> groups;
  for (std::size_t w = 0; w < calls.size(); ++w) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == calls[w]; });
    if (it == groups.end()) groups.push_back({calls[w], {static_cast<int>(w)}});
    else it->second.push_back(static_cast<int>(w));
  }
  std::string msg = "distribute: workers disagree on a collective: ";
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto& ws = groups[i].second;
    msg += i ? "; " : "";
    msg += ws.size() == 1 ? "worker " : "workers ";
    for (std::size_t j = 0; j < ws.size(); ++j)
      msg += (j ? ", " : "") + std::to_string(names.empty() ? ws[j] : names[static_cast<std::size_t>(ws[j])]);
    msg += " called " + describe_at(groups[i].first);
  }
  return msg + " (every worker must call the same collectives in the same order, with the same sizes and ops)";
}

}  // namespace distribute::comm::detail
