#pragma once
// The suite `host` of the GPU tests (main.cu), which needs no GPU: the GPU replicas' meeting on the
// host (matching, numbering, mismatches, timeouts, departures and failures), and the errors of the
// strategies on a machine without a device.

#include "gpu_test_support.cuh"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

namespace dist = distribute;
namespace dt = distribute::test;

BOOST_AUTO_TEST_SUITE(host)

namespace {
using dist::comm::detail::collective_kind;
using dist::comm::detail::descriptor;

// Runs `body(rank)` on `n` threads and returns what each threw ("" for nothing).
template <class F>
std::vector<std::string> on_threads(int n, F body) {
  std::vector<std::string> what(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (const std::exception& e) {
        what[static_cast<std::size_t>(r)] = std::string(typeid(e).name()) + ": " + e.what();
      }
    });
  for (auto& t : threads) t.join();
  return what;
}

descriptor all_reduce_of(std::size_t count, dist::reduce_op op = dist::reduce_op::sum) {
  return descriptor{.kind = collective_kind::all_reduce, .type = dist::dtype::float32, .op = op, .count = count};
}
}  // namespace

BOOST_AUTO_TEST_CASE(matching_replicas_meet_and_number_their_collectives) {
  dist::comm::detail::gpu_meeting m(3, {});
  std::vector<std::uint64_t> seqs(6);
  const auto errors = on_threads(3, [&](int r) {
    for (int k = 0; k < 2; ++k) {
      seqs[static_cast<std::size_t>(r * 2 + k)] = m.meet(r, all_reduce_of(10));
      m.meet_again();
    }
    m.depart(r);
  });
  for (const auto& e : errors) BOOST_TEST(e.empty(), e);
  BOOST_TEST(seqs == (std::vector<std::uint64_t>{0, 1, 0, 1, 0, 1}), boost::test_tools::per_element());
  BOOST_TEST(!m.first_failure());
}

BOOST_AUTO_TEST_CASE(a_mismatch_names_every_replica_and_call) {
  dist::comm::detail::gpu_meeting m(3, {}, /*first_replica=*/4);
  const auto errors = on_threads(3, [&](int r) { m.meet(r, all_reduce_of(r == 1 ? 1000 : 1024)); });
  for (const auto& e : errors) {
    BOOST_TEST(dt::contains(e, "collective_mismatch"), e);
    BOOST_TEST(dt::contains(e, "replicas 4, 6 called all_reduce(sum) of 1024 float32"), e);
    BOOST_TEST(dt::contains(e, "replica 5 called all_reduce(sum) of 1000 float32"), e);
  }
}

BOOST_AUTO_TEST_CASE(a_replica_that_never_joins_times_out) {
  using namespace std::chrono_literals;
  dist::comm::detail::gpu_meeting m(2, {.timeout = 150ms});
  const auto start = std::chrono::steady_clock::now();
  const auto errors = on_threads(2, [&](int r) {
    if (r == 0) m.meet(r, all_reduce_of(8));
    else std::this_thread::sleep_for(400ms);
  });
  BOOST_TEST((std::chrono::steady_clock::now() - start >= 150ms));
  BOOST_TEST(dt::contains(errors[0], "collective_timeout"), errors[0]);
  BOOST_TEST(dt::contains(errors[0], "timed out after 150 ms (waited "), errors[0]);
  BOOST_TEST(dt::contains(errors[0], " ms): replica 1 never joined it"), errors[0]);
  BOOST_TEST(m.aborted());
  // Joining late: the group has failed, so this fails at once instead of waiting.
  BOOST_CHECK_THROW(m.meet(1, all_reduce_of(8)), dist::collective_aborted);
  m.reset();
  BOOST_TEST(!m.aborted());
}

BOOST_AUTO_TEST_CASE(a_replica_that_left_the_step_is_reported_at_once) {
  using namespace std::chrono_literals;
  dist::comm::detail::gpu_meeting m(2, {.timeout = 60s});
  const auto start = std::chrono::steady_clock::now();
  const auto errors = on_threads(2, [&](int r) {
    if (r == 0) m.meet(r, all_reduce_of(8));
    else m.depart(r);
  });
  BOOST_TEST((std::chrono::steady_clock::now() - start < 10s));
  BOOST_TEST(dt::contains(errors[0], "replica 1 finished the step without joining it"), errors[0]);
}

BOOST_AUTO_TEST_CASE(a_failing_replica_releases_the_waiting_ones_with_its_reason) {
  using namespace std::chrono_literals;
  dist::comm::detail::gpu_meeting m(3, {.timeout = 60s});
  const auto errors = on_threads(3, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(50ms);
      m.fail(r, std::make_exception_ptr(std::runtime_error("out of memory on purpose")));
      return;
    }
    m.meet(r, descriptor{.kind = collective_kind::barrier});
  });
  for (int r = 0; r < 2; ++r) {
    BOOST_TEST(dt::contains(errors[static_cast<std::size_t>(r)], "collective_aborted"),
               errors[static_cast<std::size_t>(r)]);
    BOOST_TEST(dt::contains(errors[static_cast<std::size_t>(r)], "replica 2 failed: out of memory on purpose"),
               errors[static_cast<std::size_t>(r)]);
  }
  BOOST_TEST(static_cast<bool>(m.first_failure()));
}

BOOST_AUTO_TEST_CASE(without_a_gpu_the_strategies_say_so) {
  if (dist::cuda_device_count() != 0) return;  // only meaningful on a machine without a device
  BOOST_CHECK_THROW(dist::all_cuda_devices(), std::runtime_error);
  try {
    dist::one_device_strategy<dist::cuda> s;
    BOOST_FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    BOOST_TEST(dt::contains(e.what(), "cuda:0, but 0 CUDA device(s) are visible"), e.what());
  }
  BOOST_CHECK_THROW(dist::mirrored_strategy<dist::cuda>{}, std::runtime_error);
  BOOST_CHECK_THROW(dist::mirrored_strategy<dist::cuda>{dist::cuda_replicas(2)}, std::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
