// The MPI communicator between the processes of the job. Every collective, op and element type, on
// both of all-reduce's paths (the shared-memory window, as the tests' workers share a machine, with
// its default chunk and with chunks of 4 KiB so that every size crosses chunk boundaries; and the
// ring of messages), through the cases every communicator shares (tests/comm/collective_cases.hpp).
// Here besides what is MPI's own: which path is taken and how workers that differ agree on one,
// all-gather with a count per worker, other arithmetic types and bfloat16, bits that do not depend
// on the chunk, when fingerprints are checked, and a mismatch named through shared memory without
// them.

#include "mpi_test_support.hpp"
#include "../comm/mpi_groups.hpp"

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace dist = distribute;
using dist::reduce_op;
using dist::test::path_name;

namespace {

dist::comm::mpi& world() {
  static dist::comm::mpi c{dist::test::test_mpi_options()};
  return c;
}

dist::comm::mpi& ring() {
  static dist::comm::mpi c{[] {
    auto o = dist::test::test_mpi_options();
    o.shared_memory = false;
    return o;
  }()};
  return c;
}

dist::comm::mpi& small_chunks() {
  static dist::comm::mpi c{[] {
    auto o = dist::test::test_mpi_options();
    o.shared_memory_chunk = 4096;
    return o;
  }()};
  return c;
}

// Made in the same order on every worker (making one is a collective).
std::vector<dist::comm::mpi*> all_reduce_paths() { return {&world(), &ring(), &small_chunks()}; }

// Whether every process of the job runs on this machine.
bool one_machine() {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_size = 0, size = 0;
  MPI_Comm_size(node, &node_size);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_free(&node);
  return node_size == size;
}

bool message_has(const std::exception& e, const std::string& part) {
  return std::string(e.what()).find(part) != std::string::npos;
}

}  // namespace

namespace distribute::test {

// Each of all-reduce's paths.
struct mpi_paths : mpi_groups {
  template <class F>
  static void for_each(F&& f) {
    for (auto* c : all_reduce_paths()) {
      mpi_group g{*c};
      f(g);
    }
  }
};

using collective_groups = communicator_cases::type_list<mpi_paths>;

}  // namespace distribute::test

BOOST_AUTO_TEST_SUITE(collectives)

static_assert(dist::communicator<dist::comm::mpi>);
static_assert(std::is_same_v<dist::mpi, dist::comm::mpi>);

BOOST_AUTO_TEST_CASE(the_job_has_every_process) {
  auto& c = world();
  int size = 0, rank = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  BOOST_TEST(c.size() == size);
  BOOST_TEST(c.rank() == rank);
  BOOST_TEST(c.size() >= 2, "run these tests under mpiexec -np 2 or more");
}

BOOST_AUTO_TEST_CASE(workers_on_one_machine_all_reduce_through_shared_memory) {
  const bool local = one_machine();
  BOOST_TEST(world().uses_shared_memory() == local);
  BOOST_TEST(small_chunks().uses_shared_memory() == local);
  BOOST_TEST(!ring().uses_shared_memory(), "shared_memory = false keeps the ring");
}

// Blocks of different sizes: worker w gives w + 1 elements. A buffer that cannot hold them all is
// refused.
BOOST_AUTO_TEST_CASE_TEMPLATE(all_gather_with_a_count_per_worker, T, dist::test::element_types) {
  auto& c = world();
  const auto k = static_cast<std::size_t>(c.size()), me = static_cast<std::size_t>(c.rank());
  std::vector<std::size_t> counts(k);
  std::iota(counts.begin(), counts.end(), std::size_t{1});
  std::vector<T> mine(me + 1, static_cast<T>(me)), all(k * (k + 1) / 2);
  c.all_gather(std::span<const T>(mine), std::span<T>(all), std::span<const std::size_t>(counts));
  std::vector<T> want;
  for (std::size_t w = 0; w < k; ++w) want.insert(want.end(), w + 1, static_cast<T>(w));
  BOOST_TEST(all == want, boost::test_tools::per_element());
  BOOST_CHECK_THROW(c.all_gather(std::span<const T>(mine), std::span<T>(all.data(), all.size() - 1),
                                 std::span<const std::size_t>(counts)),
                    std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(barriers_and_other_arithmetic_types) {
  auto& c = world();
  for (int i = 0; i < 5; ++i) c.barrier();
  // The strategy's reductions accept any arithmetic type; the engine reduces them itself.
  std::vector<std::uint16_t> u(10, static_cast<std::uint16_t>(c.rank() + 1));
  c.all_reduce(reduce_op::sum, std::span<std::uint16_t>(u));
  BOOST_TEST(u[9] == c.size() * (c.size() + 1) / 2);
}

BOOST_AUTO_TEST_CASE(bfloat16_is_reduced_with_a_rounding_per_addition_on_every_path) {
  // What gradients travel as under gradient_compression::bfloat16: every worker gets the same bits,
  // each addition rounded to bfloat16 (with two workers: exactly bfloat16(a + b)).
  for (auto* path : all_reduce_paths()) {
    auto& c = *path;
    const std::size_t n = 70001;
    auto value = [](int rank, std::size_t i) {
      return std::ldexp(std::sin(0.37 * static_cast<double>(i) + rank), static_cast<int>(i % 23) - 15);
    };
    std::vector<dist::bfloat16> buf(n);
    for (std::size_t i = 0; i < n; ++i) buf[i] = dist::bfloat16(value(c.rank(), i));
    c.all_reduce(reduce_op::sum, std::span<dist::bfloat16>(buf));
    std::size_t wrong = 0, far = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double exact = 0, magnitude = 0;
      for (int w = 0; w < c.size(); ++w) {
        exact += static_cast<double>(dist::bfloat16(value(w, i)));
        magnitude += std::abs(value(w, i));
      }
      if (c.size() == 2) wrong += buf[i].bits() != (dist::bfloat16(value(0, i)) + dist::bfloat16(value(1, i))).bits();
      far += std::abs(static_cast<double>(buf[i]) - exact) > c.size() * 0x1p-8 * magnitude;
    }
    BOOST_TEST(wrong == 0u, path_name(c));
    BOOST_TEST(far == 0u, path_name(c));
    const std::uint64_t digest = dist::detail::fnv1a(buf.data(), buf.size() * sizeof(dist::bfloat16));
    std::vector<std::uint64_t> digests(static_cast<std::size_t>(c.size()));
    c.all_gather(std::span<const std::uint64_t>(&digest, 1), std::span<std::uint64_t>(digests));
    for (auto x : digests) BOOST_TEST(x == digests[0], "every worker holds the same bits, " << path_name(c));
  }
}

BOOST_AUTO_TEST_CASE(through_shared_memory_the_bits_do_not_depend_on_the_chunk) {
  // Every element is combined in worker order, however the buffer is cut, and whether a small buffer
  // is reduced whole by every worker (one meeting: 2000 floats with the default chunk) or in
  // segments (4 KiB chunks).
  std::mt19937 gen(static_cast<unsigned>(world().rank()) * 104729u + 3u);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (const std::size_t n : {std::size_t{2000}, std::size_t{300007}}) {
    std::vector<float> a(n);
    for (auto& x : a) x = d(gen);
    std::vector<float> b = a;
    world().all_reduce(reduce_op::sum, std::span<float>(a));
    small_chunks().all_reduce(reduce_op::sum, std::span<float>(b));
    BOOST_TEST((a == b), n << " floats");
  }
}

BOOST_AUTO_TEST_CASE(fingerprints_are_checked_by_default_in_debug_builds) {
#ifdef NDEBUG
  BOOST_TEST(!dist::comm::mpi_options{}.check_fingerprints);
#else
  BOOST_TEST(dist::comm::mpi_options{}.check_fingerprints);
#endif
  // The tests' communicators check them in every build: the cases of disagreeing calls need it.
  for (auto* c : all_reduce_paths()) BOOST_TEST(c->options().check_fingerprints, path_name(*c));
}

BOOST_AUTO_TEST_CASE(through_shared_memory_a_mismatch_is_named_even_without_fingerprints) {
  static dist::comm::mpi c{[] {
    auto o = dist::test::test_mpi_options();
    o.check_fingerprints = false;
    return o;
  }()};
  if (!c.uses_shared_memory()) return;  // the workers are on several machines
  std::vector<float> buf(c.rank() == 1 ? 11 : 10, 1.0f);
  BOOST_CHECK_EXCEPTION(c.all_reduce(reduce_op::sum, std::span<float>(buf)), dist::collective_mismatch,
                        [&](const dist::collective_mismatch& e) {
                          BOOST_TEST_MESSAGE(e.what());
                          return message_has(e, "worker 1 called all_reduce(sum) of 11 float32") &&
                                 message_has(e, "called all_reduce(sum) of 10 float32");
                        });
  std::vector<std::int64_t> same(3, 2);
  BOOST_CHECK_EXCEPTION(c.all_reduce(c.rank() == 0 ? reduce_op::prod : reduce_op::sum, std::span<std::int64_t>(same)),
                        dist::collective_mismatch, [](const dist::collective_mismatch& e) {
                          return message_has(e, "worker 0 called all_reduce(prod) of 3 int64");
                        });
  // Nothing moved, and the workers are still in step.
  BOOST_TEST(!c.failed());
  std::vector<float> ok(20000, 1.0f);
  c.all_reduce(reduce_op::sum, std::span<float>(ok));
  BOOST_TEST(ok[19999] == static_cast<float>(c.size()));
}

BOOST_AUTO_TEST_CASE(workers_that_differ_on_shared_memory_agree_on_one_way) {
  const int rank = world().rank();
  // Worker 1 turns the window off: nobody uses it. Chunks differ: all use the smallest.
  auto off = dist::test::test_mpi_options();
  off.shared_memory = rank != 1;
  auto chunks = dist::test::test_mpi_options();
  chunks.shared_memory_chunk = std::size_t{4096} << rank;
  dist::comm::mpi a{off}, b{chunks};
  BOOST_TEST(!a.uses_shared_memory());
  BOOST_TEST(b.uses_shared_memory() == one_machine());
  for (auto* c : {&a, &b}) {
    std::vector<float> buf(30001);
    for (std::size_t i = 0; i < buf.size(); ++i) buf[i] = dist::test::value_for<float>(rank, i, reduce_op::sum);
    c->all_reduce(reduce_op::sum, std::span<float>(buf));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < buf.size(); ++i)
      wrong += buf[i] != dist::test::expected_for<float>(c->size(), i, reduce_op::sum);
    BOOST_TEST(wrong == 0u, path_name(*c));
  }
}

BOOST_AUTO_TEST_SUITE_END()

// The cases every communicator shares, after the job's own checks above.
#include "../comm/collective_cases.hpp"
