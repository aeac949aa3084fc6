// Point-to-point messages and sub-communicators of the MPI communicator, through the cases every
// communicator with messages shares (tests/comm/p2p_cases.hpp): rings of empty, small and
// several-MiB messages, workers that all send before they receive, the order of messages with one
// tag and tags received in another order than sent, messages in flight across a collective, bad tags
// and ranks, and split communicators whose collectives and messages stay apart from their parent's.
// Here besides: what a split communicator takes from its parent, and the replicas of a multi-worker
// strategy with one replica per worker. A receive that never gets its message, and one that meets a
// different message, end the job: they are failure_test.cpp's.

#include "mpi_test_support.hpp"
#include "../comm/mpi_groups.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace dist = distribute;

namespace {

dist::comm::mpi& world() {
  static dist::comm::mpi c{dist::test::test_mpi_options(std::chrono::seconds(10))};
  return c;
}

bool message_has(const std::exception& e, const std::string& part) {
  return std::string(e.what()).find(part) != std::string::npos;
}

}  // namespace

namespace distribute::test {

struct mpi_world : mpi_groups {
  template <class F>
  static void for_each(F&& f) {
    mpi_group g{world()};
    f(g);
  }
};

using p2p_groups = communicator_cases::type_list<mpi_world>;

}  // namespace distribute::test

#include "../comm/p2p_cases.hpp"

using dist::test::communicator_cases::is_message;
using dist::test::communicator_cases::message;

BOOST_AUTO_TEST_SUITE(p2p)

// A multi-worker strategy's replicas with one replica per worker: replica q is worker q.
BOOST_AUTO_TEST_CASE(replicas_of_a_multi_worker_strategy_with_one_replica_each) {
  using group_type = dist::comm::hierarchical_group<dist::comm::mpi>;
  group_type group(world(), 1);
  auto replica = group.endpoint(0);
  BOOST_TEST(replica.rank() == world().rank());
  const auto out = message<double>(replica.rank(), 1, 1000);
  replica.send(std::span<const double>(out), (replica.rank() + 1) % replica.size(), 1);
  std::vector<double> in(1000);
  const int from = (replica.rank() + replica.size() - 1) % replica.size();
  replica.recv(std::span<double>(in), from, 1);
  BOOST_TEST(is_message(in, from, 1));
  dist::comm::mpi part = replica.split(replica.rank() % 2, 0);
  BOOST_TEST(part.size() == (replica.size() + 1 - replica.rank() % 2) / 2);
}

BOOST_AUTO_TEST_CASE(replicas_of_a_multi_worker_strategy_with_several_replicas_refuse) {
  dist::comm::hierarchical_group<dist::comm::mpi> group(world(), 2);
  auto replica = group.endpoint(0);
  std::vector<float> buf(1);
  BOOST_CHECK_EXCEPTION(
      replica.send(std::span<const float>(buf), 0, 0), std::logic_error,
      [](const std::logic_error& e) { return message_has(e, "needs one replica per worker; this worker has 2"); });
  BOOST_CHECK_THROW(replica.recv(std::span<float>(buf), 0, 0), std::logic_error);
  BOOST_CHECK_THROW(replica.split(0, 0), std::logic_error);
  // Uneven: this worker has one, another has two.
  dist::comm::hierarchical_group<dist::comm::mpi> uneven(world(), world().rank() == 0 ? 2 : 1);
  if (world().rank() != 0) {
    auto r = uneven.endpoint(0);
    BOOST_CHECK_EXCEPTION(r.send(std::span<const float>(buf), 0, 0), std::logic_error,
                          [](const std::logic_error& e) { return message_has(e, "worker 0 has 2"); });
  }
  world().barrier();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(split)

// A part starts with its parent's options, and all-reduces through a shared-memory window of its own
// when its workers share a machine, as the world does.
BOOST_AUTO_TEST_CASE(a_part_keeps_its_parents_options_and_finds_its_own_shared_memory) {
  auto& c = world();
  auto part = c.split(c.rank() % 2, -c.rank());
  BOOST_TEST(part.options().collectives.timeout == c.options().collectives.timeout);
  BOOST_TEST(part.options().check_fingerprints == c.options().check_fingerprints);
  BOOST_TEST(part.uses_shared_memory() == (c.uses_shared_memory() && part.size() > 1));
  part.barrier();
}

BOOST_AUTO_TEST_SUITE_END()
