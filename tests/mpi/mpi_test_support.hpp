#pragma once
// Helpers of the MPI tests. The suites run under mpiexec with 2 and 3 processes: every process runs
// every test case, and the collectives inside line up because every process runs the same cases in
// the same order. Timeouts are short, so that a broken test stops the job instead of hanging it.

#include <distribute/distribute.hpp>

#include <boost/mpl/list.hpp>

#include <chrono>
#include <cstdint>
#include <string>

namespace distribute::test {

using element_types = boost::mpl::list<float, double, std::int32_t, std::int64_t>;

inline constexpr reduce_op all_ops[] = {reduce_op::sum, reduce_op::mean, reduce_op::min, reduce_op::max,
                                        reduce_op::prod};

inline comm::mpi_options test_mpi_options(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  comm::mpi_options o;
  o.collectives.timeout = timeout;
  o.check_fingerprints = true;
  o.abort_grace = std::chrono::seconds(2);
  return o;
}

// The process's index in MPI_COMM_WORLD, before any strategy exists (to choose its options).
inline int world_rank() {
  static const int rank = comm::mpi{test_mpi_options()}.rank();
  return rank;
}

// Small integers (exact in every element type, whatever the order of a sum), for replica or worker
// `who`; products stay within {-2..2}^k.
template <class T>
T value_for(int who, std::size_t i, reduce_op op) {
  const std::size_t k = static_cast<std::size_t>(who);
  if (op == reduce_op::prod) {
    constexpr int factors[4] = {1, -1, 2, 1};
    return static_cast<T>(factors[(i + k) % 4]);
  }
  return static_cast<T>(static_cast<int>((k * 7 + i * 3) % 23) - 11);
}

// What element i must be after an all-reduce over contributors 0..n-1.
template <class T>
T expected_for(int n, std::size_t i, reduce_op op) {
  T acc = value_for<T>(0, i, op);
  for (int w = 1; w < n; ++w) acc = distribute::detail::combine(op, acc, value_for<T>(w, i, op));
  return distribute::detail::finish(op, acc, n);
}

}  // namespace distribute::test
