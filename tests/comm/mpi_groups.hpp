#pragma once
// MPI communicators as groups of the communicator cases (communicator_cases.hpp): this process is one
// rank of each, and every process of the job runs the same cases in the same order, so that their
// collectives line up. The ring reduces each block in an order of its own, so reductions are checked
// on small integers, exact in any order, and irregular values only for every worker and every run
// agreeing.

#include "../mpi/mpi_test_support.hpp"
#include "communicator_cases.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute::test {

// mpi_test_support.hpp's value_for, from element `seed` on.
struct exact_reference {
  using element_types = communicator_cases::type_list_of<test::element_types>;
  using all_reduce_types = element_types;
  static constexpr const auto& ops = all_ops;

  template <class T>
  static std::vector<T> values(int rank, std::size_t n, reduce_op op, std::uint32_t seed) {
    std::vector<T> v(n);
    for (std::size_t i = 0; i < n; ++i) v[i] = value_for<T>(rank, seed + i, op);
    return v;
  }
  template <class T>
  static std::vector<T> reduced(reduce_op op, const std::vector<std::vector<T>>& inputs) {
    std::vector<T> acc = inputs.at(0);
    for (std::size_t w = 1; w < inputs.size(); ++w)
      for (std::size_t i = 0; i < acc.size(); ++i) acc[i] = distribute::detail::combine(op, acc[i], inputs[w][i]);
    for (auto& x : acc) x = distribute::detail::finish(op, x, static_cast<int>(inputs.size()));
    return acc;
  }
  template <class T>
  static bool same(reduce_op, const std::vector<T>& got, const std::vector<T>& want) {
    return got == want;
  }
  template <class T>
  static std::vector<T> irregular(int rank, std::size_t n, std::uint32_t seed) {
    std::mt19937 gen(static_cast<unsigned>(rank) * 7919u + seed);
    std::vector<T> v(n);
    for (auto& x : v) {
      if constexpr (std::is_floating_point_v<T>) x = std::uniform_real_distribution<T>(T(-100), T(100))(gen);
      else x = static_cast<T>(std::uniform_int_distribution<int>(-1000, 1000)(gen));
    }
    return v;
  }
  static constexpr bool reduces_irregular_values_exactly = false;
};

// How all-reduce goes on `c`: through the shared-memory window (with its chunk), or the ring.
inline std::string path_name(const comm::mpi& c) {
  return c.uses_shared_memory() ? "shared memory, chunk " + std::to_string(c.options().shared_memory_chunk) : "ring";
}

// This process's rank of `c`.
class mpi_group {
 public:
  using communicator = comm::mpi;

  explicit mpi_group(comm::mpi& c) : c_{&c} {}

  std::string name() const { return "mpi, " + path_name(*c_); }
  int ranks() const { return c_->size(); }
  std::vector<int> run(const std::function<void(int, comm::mpi&)>& f) {
    f(c_->rank(), *c_);
    return {c_->rank()};
  }
  static const char* memory_name(int memory) { return communicator_cases::host_memory::name(memory); }
  template <class T>
  communicator_cases::host_buffer<T> buffer(int, std::vector<T> values, int) const {
    return communicator_cases::host_buffer<T>(std::move(values));
  }

 private:
  comm::mpi* c_;
};

// The settings of every MPI Groups; a test file adds `for_each` over its communicators (made in the
// same order on every process: making one is a collective). Mismatched messages end the job
// (tests/mpi/failure_test.cpp's).
struct mpi_groups {
  using communicator = comm::mpi;
  using reference = exact_reference;
  static constexpr int memories = 1;
  static constexpr bool names_mismatches = true;  // test_mpi_options checks fingerprints
  static constexpr bool names_message_mismatches = false;
  static constexpr const char* rank_name = "worker";
};

}  // namespace distribute::test
