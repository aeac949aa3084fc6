// compute_options::adapt_threads: the decision (detail::thread_governor) fed with made-up windows of
// (wall time, time the team waited for a CPU), and the reading of the kernel's run delay.
#include <distribute/engine/detail/thread_governor.hpp>

#include <boost/test/unit_test.hpp>

#include <cmath>
#include <vector>

namespace {

using distribute::detail::team_run_delay;
using distribute::detail::thread_governor;

constexpr double window = 0.1;

// The run delay a team of `threads` sees on `cores` cores shared with `busy` processes that never
// sleep: none while everything fits, else the threads that share a core wait about half the time.
double waited(int threads, int busy, int cores) {
  const int over = threads + busy - cores;
  return over <= 0 ? 0.0 : 0.5 * window * std::min(over, threads);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(thread_governor_decision)

BOOST_AUTO_TEST_CASE(a_quiet_machine_keeps_every_thread) {
  thread_governor g{4};
  for (int i = 0; i < 1000; ++i) BOOST_TEST(g.decide(window, 0.0) == 4);
  BOOST_TEST(!g.trying());
}

BOOST_AUTO_TEST_CASE(crowded_windows_drop_one_thread_each_down_to_one) {
  thread_governor g{4};
  BOOST_TEST(g.decide(window, 0.05) == 3);
  BOOST_TEST(g.decide(window, 0.05) == 2);
  BOOST_TEST(g.decide(window, 0.05) == 1);
  BOOST_TEST(g.decide(window, 0.05) == 1);
  BOOST_TEST(g.decide(window, 1.0) == 1);
}

BOOST_AUTO_TEST_CASE(the_busy_share_is_a_strict_bound) {
  thread_governor g{2};
  BOOST_TEST(g.decide(window, 0.1 * window) == 2);  // exactly the share: not crowded
  BOOST_TEST(g.decide(window, 0.1 * window + 1e-6) == 1);
  // One thread with nothing to step down to stays.
  thread_governor one{1};
  BOOST_TEST(one.decide(window, window) == 1);
  BOOST_TEST(one.most() == 1);
}

BOOST_AUTO_TEST_CASE(tries_one_more_thread_after_quiet_time_and_backs_off_while_crowded) {
  thread_governor g{2};
  const auto& s = g.config();
  BOOST_TEST(g.decide(window, 0.05) == 1);
  BOOST_TEST(g.next_try_after() == s.first_probe_s);
  // Quiet windows at one thread: a try once first_probe_s of them have passed.
  const int windows = static_cast<int>(std::ceil(s.first_probe_s / window - 1e-9));
  for (int i = 1; i < windows; ++i) BOOST_TEST(g.decide(window, 0.0) == 1);
  BOOST_TEST(g.decide(window, 0.0) == 2);
  BOOST_TEST(g.trying());
  // A crowded try goes back, and the next waits twice as long, up to longest_probe_s.
  BOOST_TEST(g.decide(window, 0.05) == 1);
  BOOST_TEST(!g.trying());
  BOOST_TEST(g.next_try_after() == 2 * s.first_probe_s);
  double expected = 2 * s.first_probe_s;
  for (int round = 0; round < 10; ++round) {
    int quiet = 0;
    while (g.decide(window, 0.0) == 1) ++quiet;
    BOOST_TEST(quiet + 1 == static_cast<int>(std::ceil(expected / window - 1e-9)), "round " << round);
    BOOST_TEST(g.decide(window, 0.05) == 1);
    expected = std::min(2 * expected, s.longest_probe_s);
    BOOST_TEST(g.next_try_after() == expected);
  }
  BOOST_TEST(g.next_try_after() == s.longest_probe_s);
}

BOOST_AUTO_TEST_CASE(a_quiet_try_keeps_the_thread_and_the_wait_starts_again) {
  thread_governor g{3};
  const auto& s = g.config();
  g.decide(window, 0.05);
  g.decide(window, 0.05);
  BOOST_TEST(g.threads() == 1);
  while (g.decide(window, 0.0) == 1) {}
  BOOST_TEST(g.threads() == 2);
  BOOST_TEST(g.decide(window, 0.0) == 2);  // the try was quiet: kept
  BOOST_TEST(!g.trying());
  BOOST_TEST(g.next_try_after() == s.first_probe_s);
  while (g.decide(window, 0.0) == 2) {}
  BOOST_TEST(g.threads() == 3);
  g.decide(window, 0.0);
  for (int i = 0; i < 100; ++i) BOOST_TEST(g.decide(window, 0.0) == 3);  // at the most: no more tries
}

BOOST_AUTO_TEST_CASE(a_crowded_window_outside_a_try_restarts_the_wait) {
  thread_governor g{2};
  g.decide(window, 0.05);  // 1
  while (g.decide(window, 0.0) == 1) {}
  g.decide(window, 0.05);  // the try failed: the next waits 2 s
  BOOST_TEST(g.next_try_after() == 2 * g.config().first_probe_s);
  // Crowding at one thread (more busy processes than cores) delays the next try.
  for (int i = 0; i < 15; ++i) g.decide(window, 0.0);
  BOOST_TEST(g.decide(window, 0.05) == 1);
  for (int i = 0; i < 15; ++i) BOOST_TEST(g.decide(window, 0.0) == 1);
}

// A 2-core machine: quiet for 5 s, one busy process for 60 s, quiet again. The engine leaves the
// busy core within a window, spends few windows on it while the process runs, and has both cores
// again within the longest wait between tries after it ends.
BOOST_AUTO_TEST_CASE(one_busy_process_on_two_cores) {
  constexpr int cores = 2;
  thread_governor g{cores};
  std::vector<int> trace;
  const int arrive = 50, leave = 650, end = 1000;  // windows of 0.1 s
  for (int w = 0; w < end; ++w) {
    const int busy = w >= arrive && w < leave ? 1 : 0;
    trace.push_back(g.threads());
    g.decide(window, waited(g.threads(), busy, cores));
  }
  for (int w = 0; w < arrive; ++w) BOOST_TEST(trace[w] == 2);
  BOOST_TEST(trace[arrive] == 2);      // the first busy window runs on both cores
  BOOST_TEST(trace[arrive + 1] == 1);  // and the next on one
  int crowded = 0;
  for (int w = arrive + 1; w < leave; ++w) crowded += trace[w] == 2;
  // Tries after 1, 2, 4, 8, 16 and 16 s of the 60: six crowded windows, 1%.
  BOOST_TEST(crowded == 6);
  int back = leave;
  while (back < end && trace[back] != 2) ++back;
  BOOST_TEST(back - leave <= static_cast<int>(g.config().longest_probe_s / window) + 1);
  for (int w = back; w < end; ++w) BOOST_TEST(trace[w] == 2);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(thread_governor_run_delay)

BOOST_AUTO_TEST_CASE(the_second_field_of_schedstat_is_the_run_delay) {
  BOOST_TEST(team_run_delay::parse_run_delay("123456 7890 12\n") == 7890);
  BOOST_TEST(team_run_delay::parse_run_delay("0 0 0") == 0);
  BOOST_TEST(team_run_delay::parse_run_delay("") == -1);
  BOOST_TEST(team_run_delay::parse_run_delay("17") == -1);
  BOOST_TEST(team_run_delay::parse_run_delay("x y z") == -1);
}

BOOST_AUTO_TEST_CASE(reads_this_threads_figure_and_refuses_a_thread_that_is_not_ours) {
  if (!team_run_delay::available()) {
    BOOST_TEST_MESSAGE("this kernel reports no run delay (CONFIG_SCHED_INFO): adapt_threads keeps the count");
    return;
  }
  team_run_delay team;
  team.set_team({team_run_delay::this_thread()});
  const auto first = team.total_ns();
  BOOST_TEST(first >= 0);
  BOOST_TEST(team.total_ns() >= first);  // a running total
  team.set_team({team_run_delay::this_thread(), 0});
  BOOST_TEST(team.total_ns() == -1);
}

BOOST_AUTO_TEST_SUITE_END()
