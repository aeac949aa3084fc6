// Point-to-point messages and sub-groups of comm::shared_memory, through the replica contexts of
// mirrored_strategy (2 to 6 replicas): the cases every communicator with messages shares
// (tests/comm/p2p_cases.hpp; comm::local, one_device_strategy's, has none), and here what the
// strategy adds: a receiver waiting first getting the message in place, timeouts, replicas that
// finished the step or threw, and the messages of a failed step dropped.

#include "test_support.hpp"
#include "../comm/replica_groups.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace distribute::test {

using p2p_groups = communicator_cases::type_list<local_groups, shared_memory_groups<2, 3, 4, 6>>;

}  // namespace distribute::test

#include "../comm/p2p_cases.hpp"

namespace dist = distribute;
using namespace std::chrono_literals;
using distribute::test::communicator_cases::contains;

namespace {

dist::mirrored_strategy<> strategy_of(int n, std::chrono::milliseconds timeout = std::chrono::minutes(1)) {
  return dist::mirrored_strategy<>(dist::cpu_replicas(n), dist::collective_options{.timeout = timeout});
}

// Runs `step` expecting `Error`; returns its message.
template <class Error, class S, class F>
std::string failure_of(S& s, F&& step) {
  try {
    s.run(step);
  } catch (const Error& e) {
    return e.what();
  }
  BOOST_FAIL("the step did not fail with the expected error");
  return {};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(p2p)

BOOST_AUTO_TEST_CASE(a_receiver_waiting_first_gets_the_message_in_place) {
  auto s = strategy_of(2);
  auto got = s.run([&](auto& r) {
    std::vector<double> v(5000, -1.0);
    if (r.replica_id() == 0) {
      std::this_thread::sleep_for(20ms);  // replica 1 is waiting by now
      std::iota(v.begin(), v.end(), 0.0);
      r.send(v, 1, 0);
      std::fill(v.begin(), v.end(), 9.0);  // the receiver already has its copy
      return true;
    }
    r.recv(v, 0, 0);
    std::vector<double> expected(5000);
    std::iota(expected.begin(), expected.end(), 0.0);
    return v == expected;
  });
  BOOST_TEST(got[1]);
}

BOOST_AUTO_TEST_CASE(a_sender_that_never_sends_times_out_naming_both_replicas) {
  auto s = strategy_of(3, 300ms);
  const auto started = std::chrono::steady_clock::now();
  const auto msg = failure_of<dist::collective_timeout>(s, [](auto& r) {
    if (r.replica_id() == 2) {
      std::vector<float> v(8);
      dist::collective_label label("pipeline test");
      r.recv(v, 1, 5);
    } else {
      std::this_thread::sleep_for(600ms);  // busy elsewhere: replica 1 never sends
    }
  });
  BOOST_TEST((std::chrono::steady_clock::now() - started < 10s));
  BOOST_TEST(contains(msg, "replica 2 timed out after 300 ms"), msg);
  BOOST_TEST(contains(msg,
                      "waiting for a message from replica 1 (recv of 8 float32, tag 5 from replica 1 from pipeline "
                      "test in step 0)"),
             msg);
  BOOST_TEST(contains(msg, "that replica 1 never sent"), msg);
}

BOOST_AUTO_TEST_CASE(a_sender_that_finished_the_step_fails_the_receiver_at_once) {
  auto s = strategy_of(2, 60s);
  const auto started = std::chrono::steady_clock::now();
  const auto msg = failure_of<dist::collective_timeout>(s, [](auto& r) {
    if (r.replica_id() == 1) {
      std::vector<float> v(1);
      r.recv(v, 0, 0);
    }
  });
  BOOST_TEST((std::chrono::steady_clock::now() - started < 10s));
  BOOST_TEST(contains(msg, "replica 1's recv of 1 float32, tag 0 from replica 0"), msg);
  BOOST_TEST(contains(msg, "replica 0 finished the step without sending it"), msg);
}

BOOST_AUTO_TEST_CASE(a_send_to_a_replica_that_finished_the_step_fails) {
  auto s = strategy_of(2, 60s);
  const auto msg = failure_of<dist::collective_timeout>(s, [](auto& r) {
    if (r.replica_id() == 0) {
      std::this_thread::sleep_for(50ms);
      r.send(std::vector<float>(3), 1, 4);
    }
  });
  BOOST_TEST(contains(msg, "replica 0's send of 3 float32, tag 4, to replica 1"), msg);
  BOOST_TEST(contains(msg, "replica 1 finished the step"), msg);
}

BOOST_AUTO_TEST_CASE(a_replica_that_throws_releases_a_waiting_receiver_with_its_cause) {
  auto s = strategy_of(2, 60s);
  const auto started = std::chrono::steady_clock::now();
  const auto msg = failure_of<std::runtime_error>(s, [](auto& r) {
    if (r.replica_id() == 0) {
      std::this_thread::sleep_for(20ms);
      throw std::runtime_error("stage 0 broke");
    }
    std::vector<float> v(1);
    r.recv(v, 0, 0);
  });
  BOOST_TEST((std::chrono::steady_clock::now() - started < 10s));
  BOOST_TEST(msg == "stage 0 broke");
}

BOOST_AUTO_TEST_CASE(messages_left_over_from_a_failed_step_are_dropped) {
  auto s = strategy_of(2, 60s);
  failure_of<std::runtime_error>(s, [](auto& r) {
    if (r.replica_id() == 0) {
      r.send(std::vector<int>{1}, 1, 0);
      throw std::runtime_error("after sending");
    }
  });
  auto got = s.run([](auto& r) {
    std::vector<int> v{0};
    if (r.replica_id() == 0) r.send(std::vector<int>{2}, 1, 0);
    else r.recv(v, 0, 0);
    return v[0];
  });
  BOOST_TEST(got[1] == 2);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(split)

BOOST_AUTO_TEST_CASE(failures_in_a_sub_group_name_replicas_by_their_outer_ids) {
  auto s = strategy_of(4, 300ms);
  // {0, 2} and {1, 3}: replica 1 all-reduces in its pair; replica 3 never joins.
  auto step = [](bool late) {
    return [late](auto& r) {
      const int id = r.replica_id();
      auto pair = r.communicator().split(id % 2, id);
      if (id == 3 && late) std::this_thread::sleep_for(900ms);
      if (id != 1) return;
      float v = 1;
      pair.all_reduce(dist::reduce_op::sum, std::span<float>(&v, 1));
    };
  };
  const auto started = std::chrono::steady_clock::now();
  const auto departed = failure_of<dist::collective_timeout>(s, step(false));
  BOOST_TEST((std::chrono::steady_clock::now() - started < 5s));
  BOOST_TEST(contains(departed, "on replica 1 can never complete: replica 3 finished the step"), departed);
  const auto timed_out = failure_of<dist::collective_timeout>(s, step(true));
  BOOST_TEST(contains(timed_out, "on replica 1 timed out after 300 ms"), timed_out);
  BOOST_TEST(contains(timed_out, "replica 3 never joined it"), timed_out);
}

BOOST_AUTO_TEST_CASE(a_replica_that_splits_alone_is_a_mismatch) {
  auto s = strategy_of(2, 60s);
  const auto msg = failure_of<dist::collective_mismatch>(s, [](auto& r) {
    if (r.replica_id() == 0) r.communicator().split(0, 0);
    else r.barrier();
  });
  BOOST_TEST(contains(msg, "from split"), msg);
}

BOOST_AUTO_TEST_SUITE_END()
