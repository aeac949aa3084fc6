#pragma once
// The failure semantics every multi-replica strategy shares, written once and instantiated per
// device: a replica that throws, a collective that a replica never joins, and replicas that disagree
// on a collective all end in a clear error for the caller, never a hang, and the strategy works
// again for the next step. Buffers are host memory, which every engine accepts (a GPU engine stages
// it).
//
// The including file defines `distribute::test::failure_makers`, a boost::mpl::list of makers, each
// with
//   static auto make(int replicas, collective_options = {});   a strategy of that many replicas
//   static int max_replicas();                                  the most it can make here
//   static auto one_device();                                   the device's one_device_strategy
// and includes this file, which adds the cases to the suite `failure`.

#include "test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace distribute::test::failure_cases {

namespace dist = distribute;

struct replica_failure : std::runtime_error {
  explicit replica_failure(int id) : std::runtime_error("replica " + std::to_string(id) + " gave up"), replica{id} {}
  int replica;
};

// After any failure, the next step must run normally.
template <class S>
void check_usable(S& s) {
  auto sums = s.run([](auto& r) {
    std::vector<float> v(1000, 1.0f);
    r.all_reduce(dist::reduce_op::sum, v);
    r.barrier();
    return v[999];
  });
  for (float v : sums) BOOST_TEST(v == static_cast<float>(s.num_replicas_in_sync()));
}

// Runs `step` and returns the message of the exception of type E that it must throw.
template <class E, class S, class F>
std::string expect_throw(S& s, F&& step) {
  try {
    s.run(step);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    BOOST_FAIL("expected another exception type, got: " << e.what());
  }
  BOOST_FAIL("no exception thrown");
  return {};
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Whether the maker can make `n` replicas here (NCCL needs a GPU per replica); says so when not.
template <class M>
bool enough_replicas(int n) {
  if (n <= M::max_replicas()) return true;
  BOOST_TEST_MESSAGE("skipped: needs " << n << " replicas, this machine allows " << M::max_replicas());
  BOOST_TEST(true);
  return false;
}

// Where, relative to two collectives, the failing replica throws.
enum class when { before, between, after };

}  // namespace distribute::test::failure_cases

BOOST_AUTO_TEST_SUITE(failure)

namespace dist = distribute;
using namespace std::chrono_literals;
using namespace distribute::test::failure_cases;
using distribute::test::failure_makers;

BOOST_AUTO_TEST_CASE_TEMPLATE(a_throwing_replica_reaches_the_caller, M, failure_makers) {
  for (int replicas : {2, 3, 4, 8}) {
    if (replicas > M::max_replicas()) break;
    auto s = M::make(replicas, {.timeout = 60s});
    for (when w : {when::before, when::between, when::after}) {
      for (int culprit : {0, replicas - 1}) {
        const auto start = std::chrono::steady_clock::now();
        try {
          s.run([&](auto& r) {
            std::vector<double> v(4096, 1.0);
            if (r.replica_id() == culprit && w == when::before) throw replica_failure(culprit);
            r.all_reduce(dist::reduce_op::sum, v);
            if (r.replica_id() == culprit && w == when::between) throw replica_failure(culprit);
            r.all_reduce(dist::reduce_op::sum, v);
            if (r.replica_id() == culprit && w == when::after) throw replica_failure(culprit);
          });
          BOOST_FAIL("no exception");
        } catch (const replica_failure& e) {
          BOOST_TEST(e.replica == culprit);
        }
        // Far below the timeout: the others were released at once, not timed out.
        BOOST_TEST((std::chrono::steady_clock::now() - start < 10s));
        check_usable(s);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(waiting_replicas_see_why_they_were_released, M, failure_makers) {
  if (!enough_replicas<M>(3)) return;
  auto s = M::make(3);
  std::vector<std::string> messages(3);
  BOOST_CHECK_THROW(s.run([&](auto& r) {
    try {
      if (r.replica_id() == 1) throw replica_failure(1);
      r.barrier();
    } catch (const dist::collective_aborted& e) {
      messages[static_cast<std::size_t>(r.replica_id())] = e.what();
      throw;
    }
  }),
                    replica_failure);
  for (int id : {0, 2}) {
    const auto& m = messages[static_cast<std::size_t>(id)];
    BOOST_TEST(contains(m, "replica 1 failed: replica 1 gave up"), m);
    BOOST_TEST(contains(m, "barrier"), m);
  }
  check_usable(s);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(every_replica_throwing_gives_one_of_their_exceptions, M, failure_makers) {
  if (!enough_replicas<M>(4)) return;
  auto s = M::make(4);
  BOOST_CHECK_THROW(s.run([](auto& r) { throw replica_failure(r.replica_id()); }), replica_failure);
  check_usable(s);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_replica_that_skips_a_collective_is_reported_at_once, M, failure_makers) {
  // The skipping replica finishes its step: the others cannot complete and are told so without
  // waiting for the timeout.
  if (!enough_replicas<M>(3)) return;
  auto s = M::make(3, {.timeout = 60s});
  const auto start = std::chrono::steady_clock::now();
  const auto message = expect_throw<dist::collective_timeout>(s, [](auto& r) {
    std::vector<float> v(16, 1.0f);
    r.all_reduce(dist::reduce_op::sum, v);
    if (r.replica_id() != 2) r.all_reduce(dist::reduce_op::sum, v);
  });
  BOOST_TEST((std::chrono::steady_clock::now() - start < 10s));
  BOOST_TEST(contains(message, "replica 2 finished the step without joining it"), message);
  BOOST_TEST(contains(message, "collective #2"), message);
  check_usable(s);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_collective_never_joined_times_out, M, failure_makers) {
  // The late replica is still busy (not finished) when the timeout expires.
  const auto timeout = 300ms;
  if (!enough_replicas<M>(2)) return;
  auto s = M::make(2, {.timeout = timeout});
  const auto start = std::chrono::steady_clock::now();
  const auto message = expect_throw<dist::collective_timeout>(s, [&](auto& r) {
    if (r.replica_id() == 1) {
      std::this_thread::sleep_for(3 * timeout);
      return;
    }
    r.all_reduce(dist::reduce_op::sum, 1.0f);
  });
  const auto elapsed = std::chrono::steady_clock::now() - start;
  BOOST_TEST((elapsed >= timeout));
  BOOST_TEST((elapsed < timeout * 3 + 5s));
  BOOST_TEST(contains(message, "timed out after 300 ms"), message);
  BOOST_TEST(contains(message, "replica 1 never joined it"), message);
  check_usable(s);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_late_replica_entering_after_a_timeout_fails_at_once, M, failure_makers) {
  // Replica 1 arrives after replica 0 gave up: it must not wait for a partner who has left.
  if (!enough_replicas<M>(2)) return;
  auto s = M::make(2, {.timeout = 200ms});
  std::string late_message;
  BOOST_CHECK_THROW(s.run([&](auto& r) {
    if (r.replica_id() == 1) {
      std::this_thread::sleep_for(600ms);
      try {
        r.barrier();
      } catch (const dist::collective_aborted& e) {
        late_message = e.what();
        throw;
      }
      return;
    }
    r.barrier();
  }),
                    dist::collective_timeout);
  BOOST_TEST(contains(late_message, "timed out"), late_message);
  check_usable(s);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(the_timeout_can_be_changed_between_steps, M, failure_makers) {
  if (!enough_replicas<M>(2)) return;
  auto s = M::make(2);
  BOOST_TEST((s.options().timeout == std::chrono::milliseconds(std::chrono::minutes(5))));
  s.set_options({.timeout = 100ms});
  BOOST_TEST((s.options().timeout == 100ms));
  const auto message = expect_throw<dist::collective_timeout>(s, [](auto& r) {
    if (r.replica_id() == 0) std::this_thread::sleep_for(500ms);
    else r.barrier();
  });
  BOOST_TEST(contains(message, "timed out after 100 ms"), message);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(mismatched_sizes_name_both_sizes_and_replicas, M, failure_makers) {
  if (!enough_replicas<M>(3)) return;
  auto s = M::make(3);
  const auto message = expect_throw<dist::collective_mismatch>(s, [](auto& r) {
    std::vector<float> v(r.replica_id() == 1 ? 1000 : 1024);
    r.all_reduce(dist::reduce_op::sum, v);
  });
  BOOST_TEST(contains(message, "replicas 0, 2 called all_reduce(sum) of 1024 float32"), message);
  BOOST_TEST(contains(message, "replica 1 called all_reduce(sum) of 1000 float32"), message);
  check_usable(s);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(mismatched_ops_collectives_dtypes_and_roots, M, failure_makers) {
  if (!enough_replicas<M>(2)) return;
  auto s = M::make(2);
  auto msg = expect_throw<dist::collective_mismatch>(s, [](auto& r) {
    std::vector<float> v(8);
    r.all_reduce(r.replica_id() == 0 ? dist::reduce_op::sum : dist::reduce_op::max, v);
  });
  BOOST_TEST(contains(msg, "all_reduce(sum)"), msg);
  BOOST_TEST(contains(msg, "all_reduce(max)"), msg);

  msg = expect_throw<dist::collective_mismatch>(s, [](auto& r) {
    if (r.replica_id() == 0) r.barrier();
    else r.all_reduce(dist::reduce_op::sum, 1.0f);
  });
  BOOST_TEST(contains(msg, "replica 0 called barrier"), msg);
  BOOST_TEST(contains(msg, "replica 1 called all_reduce(sum) of 1 float32"), msg);

  msg = expect_throw<dist::collective_mismatch>(s, [](auto& r) {
    if (r.replica_id() == 0) r.all_reduce(dist::reduce_op::sum, 1.0f);
    else r.all_reduce(dist::reduce_op::sum, 1.0);
  });
  BOOST_TEST(contains(msg, "float32"), msg);
  BOOST_TEST(contains(msg, "float64"), msg);

  msg = expect_throw<dist::collective_mismatch>(s, [](auto& r) { r.broadcast(std::int64_t{5}, r.replica_id()); });
  BOOST_TEST(contains(msg, "broadcast from replica 0"), msg);
  BOOST_TEST(contains(msg, "broadcast from replica 1"), msg);

  msg = expect_throw<dist::collective_mismatch>(s, [](auto& r) {
    std::vector<float> a(3), b(r.replica_id() == 0 ? 4 : 5);
    r.all_reduce(dist::reduce_op::sum, a, b);
  });
  BOOST_TEST(contains(msg, "in 2 buffers (3, 4)"), msg);
  BOOST_TEST(contains(msg, "in 2 buffers (3, 5)"), msg);
  check_usable(s);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(a_bad_argument_on_one_replica_releases_the_others, M, failure_makers) {
  if (!enough_replicas<M>(3)) return;
  auto s = M::make(3);
  BOOST_CHECK_THROW(s.run([](auto& r) {
    std::vector<float> in(2), out(r.replica_id() == 2 ? 5 : 6);
    r.all_gather(in, out);
  }),
                    std::invalid_argument);
  check_usable(s);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(nested_run_is_refused, M, failure_makers) {
  if (!enough_replicas<M>(2)) return;
  auto s = M::make(2);
  BOOST_CHECK_THROW(s.run([&](auto&) { s.run([](auto&) {}); }), std::logic_error);
  check_usable(s);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(one_device_rethrows_directly, M, failure_makers) {
  auto s = M::one_device();
  BOOST_CHECK_THROW(s.run([](auto& r) { throw replica_failure(r.replica_id()); }), replica_failure);
  auto v = s.run([](auto& r) { return r.replica_id(); });
  BOOST_TEST(v[0] == 0);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(repeated_failures_do_not_leak_state, M, failure_makers) {
  // Alternate failing and healthy steps many times; each healthy step must be correct.
  if (!enough_replicas<M>(4)) return;
  auto s = M::make(4, {.timeout = 30s});
  for (int i = 0; i < 100; ++i) {
    const int culprit = i % 4;
    BOOST_CHECK_THROW(s.run([&](auto& r) {
      for (int k = 0; k < 3; ++k) {
        if (r.replica_id() == culprit && k == i % 3) throw replica_failure(culprit);
        r.all_reduce(dist::reduce_op::sum, 1);
      }
    }),
                      replica_failure);
    auto sums = s.run([](auto& r) { return r.all_reduce(dist::reduce_op::sum, r.replica_id()); });
    for (int v : sums) BOOST_TEST_REQUIRE(v == 6);
  }
}

BOOST_AUTO_TEST_SUITE_END()
