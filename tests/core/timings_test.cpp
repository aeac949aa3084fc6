// Where a step's time goes (step_timings.hpp): the strategies measure compute and collective time,
// the datasets input wait and the checkpoints their own time, with no timer in the test's code.
// Every check is a lower bound set by a sleep (a loaded machine only makes the times longer) or an
// identity between the parts, so none of them depends on the machine's speed.

#include "test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <filesystem>
#include <span>
#include <thread>

#include <unistd.h>
#include <vector>

namespace dist = distribute;
namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

void sleep_for(std::chrono::milliseconds d) { std::this_thread::sleep_for(d); }

// The parts never exceed the wall time, and `other` is what they leave.
void check_parts(const dist::step_timings& t) {
  BOOST_TEST(t.compute >= 0.0);
  BOOST_TEST(t.collective >= 0.0);
  BOOST_TEST(t.input_wait >= 0.0);
  BOOST_TEST(t.checkpoint >= 0.0);
  BOOST_TEST(t.compute + t.collective + t.input_wait + t.checkpoint <= t.wall + 1e-3);
  BOOST_TEST(t.other() == t.wall - t.compute - t.collective - t.input_wait - t.checkpoint,
             boost::test_tools::tolerance(1e-9));
}

}  // namespace

BOOST_AUTO_TEST_SUITE(timings)

BOOST_AUTO_TEST_CASE(one_device_counts_compute_and_no_collective) {
  dist::one_device_strategy<dist::cpu> s;
  const auto before = s.timings();
  s.run([](auto& r) {
    sleep_for(30ms);
    float x = 1.0f;
    r.all_reduce(dist::reduce_op::sum, std::span<float>(&x, 1));  // the identity under one device
  });
  s.run_on_primary([](auto&) { sleep_for(10ms); });
  sleep_for(20ms);  // between steps: neither compute nor collective
  const auto t = s.timings() - before;
  BOOST_TEST(t.runs == 2);
  BOOST_TEST(t.compute >= 0.040);
  BOOST_TEST(t.collective == 0.0);
  BOOST_TEST(t.wall >= 0.060);
  BOOST_TEST(t.other() >= 0.020);
  check_parts(t);
}

// Replica 1 arrives 60 ms late at the all-reduce: replica 0 waits for it there (almost all of the
// 60 ms), so the mean collective time over the two replicas is well above 20 ms.
BOOST_AUTO_TEST_CASE(mirrored_counts_the_wait_in_collectives) {
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(2)};
  const auto before = s.timings();
  s.run([](auto& r) {
    if (r.replica_id() == 1) sleep_for(60ms);
    std::vector<float> g(1000, 1.0f);
    r.all_reduce(dist::reduce_op::sum, g);
    r.barrier();
  });
  const auto t = s.timings() - before;
  BOOST_TEST(t.runs == 1);
  BOOST_TEST(t.collective >= 0.020);
  BOOST_TEST(t.compute >= 0.0);
  BOOST_TEST(t.compute + t.collective >= 0.060);  // the step lasted at least the late replica's sleep
  check_parts(t);
}

// Every collective of the replica is measured, also point-to-point and when the step throws.
BOOST_AUTO_TEST_CASE(mirrored_counts_point_to_point_and_failed_steps) {
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(2)};
  auto before = s.timings();
  s.run([](auto& r) {
    std::vector<float> v(16, 1.0f);
    if (r.replica_id() == 0) {
      sleep_for(60ms);
      r.send(v, 1, 7);
    } else {
      r.recv(v, 0, 7);  // waits for replica 0's sleep
    }
  });
  auto t = s.timings() - before;
  BOOST_TEST(t.collective >= 0.020);
  check_parts(t);

  before = s.timings();
  BOOST_CHECK_THROW(s.run([](auto& r) {
    if (r.replica_id() == 0) {
      sleep_for(30ms);
      throw std::runtime_error("replica 0 fails");
    }
    r.barrier();  // aborted when replica 0 fails
  }),
                    std::runtime_error);
  t = s.timings() - before;
  BOOST_TEST(t.runs == 1);
  BOOST_TEST(t.compute + t.collective >= 0.030);
  check_parts(t);
}

// Range-for over a dataset: the time spent getting each element is input wait, once (not again for
// the datasets it is made of), and the loop body's time is not.
BOOST_AUTO_TEST_CASE(dataset_passes_count_input_wait) {
  dist::one_device_strategy<dist::cpu> s;
  const auto ds = dist::data::from_vector(std::vector<int>{1, 2, 3, 4}).map([](int x) {
    sleep_for(10ms);
    return x;
  });
  const auto before = s.timings();
  int sum = 0;
  for (int x : ds.epoch(0)) {
    sum += x;
    s.run([](auto&) { sleep_for(5ms); });
  }
  const auto t = s.timings() - before;
  BOOST_TEST(sum == 10);
  BOOST_TEST(t.input_wait >= 0.040);
  BOOST_TEST(t.compute >= 0.020);
  BOOST_TEST(t.runs == 4);
  check_parts(t);
}

// Prefetching hides the pipeline's work behind the steps: the wait is then what it did not hide.
BOOST_AUTO_TEST_CASE(prefetch_hides_input_wait_behind_steps) {
  dist::one_device_strategy<dist::cpu> s;
  const auto slow = dist::data::from_vector(std::vector<int>(8, 1)).map([](int x) {
    sleep_for(10ms);
    return x;
  });
  const auto ahead = slow.prefetch(4);
  const auto measure = [&](const auto& ds) {
    const auto before = s.timings();
    for (int x : ds.epoch(0)) s.run([](auto&, int) { sleep_for(30ms); }, x);
    return s.timings() - before;
  };
  const auto plain = measure(slow), prefetched = measure(ahead);
  BOOST_TEST(plain.input_wait >= 0.080);
  BOOST_TEST(prefetched.input_wait < plain.input_wait);
  check_parts(plain);
  check_parts(prefetched);
}

// Saving and loading checkpoints is checkpoint time; a directory's save (which saves a file) once.
BOOST_AUTO_TEST_CASE(checkpoints_count_once) {
  dist::one_device_strategy<dist::cpu> s;
  const fs::path dir = fs::temp_directory_path() / ("distribute_timings_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  dist::checkpoint::archive a;
  a.put_vector("w", std::vector<float>(1 << 20, 0.5f));
  auto before = s.timings();
  dist::checkpoint::directory d(dir);
  d.save(1, a);
  const auto loaded = d.load_latest();
  BOOST_TEST(loaded.has_value());
  dist::checkpoint::save(dir / "plain.dck", a);
  (void)dist::checkpoint::load(dir / "plain.dck");
  const auto t = s.timings() - before;
  BOOST_TEST(t.checkpoint > 0.0);
  BOOST_TEST(t.runs == 0);
  BOOST_TEST(t.compute == 0.0);
  check_parts(t);  // nested scopes counted twice would exceed the wall time
  fs::remove_all(dir);
}

// Copies of a strategy's clock keep their totals; intervals subtract and add.
BOOST_AUTO_TEST_CASE(intervals_subtract_and_add) {
  dist::one_device_strategy<dist::cpu> s;
  const auto t0 = s.timings();
  s.run([](auto&) { sleep_for(10ms); });
  const auto t1 = s.timings();
  s.run([](auto&) { sleep_for(10ms); });
  const auto t2 = s.timings();
  const auto whole = t2 - t0, sum = (t1 - t0) + (t2 - t1);
  BOOST_TEST(whole.runs == 2);
  BOOST_TEST(sum.runs == 2);
  BOOST_TEST(whole.compute == sum.compute, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(whole.wall == sum.wall, boost::test_tools::tolerance(1e-9));
  BOOST_TEST(whole.share(whole.compute) > 0.0);
  BOOST_TEST(whole.share(whole.compute) <= 1.0);
  const dist::step_timings none{};
  BOOST_TEST(none.share(1.0) == 0.0);
  auto copy = s;  // a one-device strategy copies: its clock too
  BOOST_TEST(copy.timings().runs == 2);
}

BOOST_AUTO_TEST_SUITE_END()
