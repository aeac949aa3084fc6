// preemption_checkpoint in one process (one_device_strategy, mirrored_strategy with 2 replicas): a
// signal at a chosen point of a run (inside a step, while a replica waits in a collective for another,
// between steps, during a checkpoint write) and at a random moment from another thread stops the loop
// after one step with one checkpoint; the restarted run continues from it, and the final parameters
// are bit-identical to an uninterrupted run's, with no step lost or repeated. Also: a second signal
// during the save, the time from the signal to the stop, and what is refused. The MPI tests
// (tests/mpi, `failure`) do the same across processes, with a signal to one worker only.

#include "../mpi/training.hpp"

#include <distribute/distribute.hpp>
#include <distribute/preemption.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

namespace dist = distribute;
namespace ckpt = distribute::checkpoint;
using clock_type = std::chrono::steady_clock;

namespace {

constexpr std::int64_t total_steps = 10;

std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("distribute_preemption_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

// Where a run raises SIGTERM on itself: inside step `at` (on the last replica's thread, between two
// of its collectives), while the other replicas wait for it in a barrier, between step `at` and
// after_step, inside the checkpoint write of a periodic save, or from another thread after
// `delay` (a random moment).
enum class where { none, in_step, in_collective, between_steps, in_save, random_moment };

struct run_result {
  std::vector<float> parameters;
  std::int64_t first_step = 0, steps_run = 0, stopped_at = -1;
  bool preempted = false;
  double signal_to_stop_s = 0, longest_step_s = 0, longest_save_s = 0;
};

// One run of the training loop of tests/mpi/training.hpp under `S`, resumed from `dir` where it holds
// a checkpoint, until total_steps or a preemption.
template <class S>
run_result run(S& s, const std::filesystem::path& dir, where signal_at, std::int64_t at,
               std::chrono::microseconds delay = {}, std::int64_t save_every = 0) {
  auto nets = s.mirror([](auto&) { return dist::test::make_net(1234); });
  auto opts = s.mirror([](auto&) { return dist::optim::adam<float>{{.lr = 1e-2}}; });
  std::atomic<clock_type::rep> signalled{0};
  const auto raise_now = [&] {
    signalled.store(clock_type::now().time_since_epoch().count());
    std::raise(SIGTERM);
  };
  double longest_save = 0;
  std::int64_t saving_step = -1;
  dist::preemption_checkpoint handler{
      s,
      dir,
      [&](ckpt::archive& a) {
        const auto t0 = clock_type::now();
        if (signal_at == where::in_save && saving_step == at && signalled.load() == 0) raise_now();
        a.put_model("model", nets[0]);
        a.put_state("optimizer", opts[0]);
        longest_save = std::max(longest_save, std::chrono::duration<double>(clock_type::now() - t0).count());
      },
      [&](const ckpt::archive& a) {
        a.get_model("model", nets[0]);
        a.get_state("optimizer", opts[0]);
        s.broadcast(nets, 0);
        s.broadcast(opts, 0);
      },
      {.save_every = save_every}};
  run_result out;
  out.first_step = handler.first_step();
  std::jthread timer;
  if (signal_at == where::random_moment)
    timer = std::jthread([&, delay](std::stop_token stop) {
      const auto until = clock_type::now() + delay;
      while (!stop.stop_requested() && clock_type::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (!stop.stop_requested()) raise_now();
    });
  for (std::int64_t step = handler.first_step(); step < total_steps; ++step) {
    const auto t0 = clock_type::now();
    if (step == at && (signal_at == where::in_step || signal_at == where::in_collective))
      s.run([&](dist::replica auto& r) {
        r.barrier();
        // With several replicas the others are waiting in the barrier below by now (in_collective).
        if (r.replica_id() == r.num_replicas() - 1) raise_now();
        r.barrier();
      });
    dist::test::train_step(s, nets, opts, step);
    // (A step long enough for a random moment to fall inside the run.)
    if (signal_at == where::random_moment) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    if (step == at && signal_at == where::between_steps) raise_now();
    out.longest_step_s = std::max(out.longest_step_s, std::chrono::duration<double>(clock_type::now() - t0).count());
    ++out.steps_run;
    saving_step = step;
    if (handler.after_step(step)) {
      out.preempted = true;
      out.stopped_at = step;
      const auto since = clock_type::now().time_since_epoch().count() - signalled.load();
      out.signal_to_stop_s = std::chrono::duration<double>(clock_type::duration(since)).count();
      break;
    }
  }
  if (timer.joinable()) {
    timer.request_stop();
    timer.join();
  }
  if (!out.preempted) handler.save(total_steps - 1);
  BOOST_TEST(handler.preempted() == out.preempted);
  BOOST_TEST(handler.exit_code() == 0);
  if (out.preempted) BOOST_TEST_MESSAGE("stopped: " << handler.describe());
  out.longest_save_s = longest_save;
  s.verify_mirrored(nets);
  out.parameters = dist::test::parameters_of(nets[0]);
  return out;
}

template <class S>
void every_point_of_a_run(S& first_strategy, S& second_strategy, const char* name) {
  const auto reference_dir = fresh_dir(std::string(name) + "_reference");
  const auto reference = run(first_strategy, reference_dir, where::none, -1);
  BOOST_TEST_REQUIRE(!reference.preempted);
  BOOST_TEST_REQUIRE(reference.steps_run == total_steps);
  const double run_s = 0.003 * static_cast<double>(total_steps);  // at least, with the random trials' 3 ms a step

  std::mt19937 pick(2026);
  struct trial {
    where at;
    std::int64_t step;
    std::int64_t save_every;
  };
  const std::vector<trial> trials{
      {where::in_step, 3, 0}, {where::in_collective, 5, 0}, {where::between_steps, 0, 0}, {where::in_save, 5, 3},
      {where::in_step, 9, 0}, {where::random_moment, 0, 0}, {where::random_moment, 0, 4}};
  int n = 0;
  for (const auto& t : trials) {
    const auto dir = fresh_dir(std::string(name) + "_" + std::to_string(n++));
    const auto delay = std::chrono::microseconds(
        static_cast<std::int64_t>(1e6 * run_s * std::uniform_real_distribution<>(0.1, 0.7)(pick)));
    const auto first = run(first_strategy, dir, t.at, t.step, delay, t.save_every);
    const std::string what =
        std::string(name) + " trial " + std::to_string(n) + ", signal at step " + std::to_string(t.step);
    BOOST_TEST_REQUIRE(first.preempted, what);
    // (A signal during the save after step k is seen at the next boundary: after step k + 1.)
    if (t.at == where::in_save) BOOST_TEST(first.stopped_at == t.step + 1, what);
    else if (t.at != where::random_moment) BOOST_TEST(first.stopped_at == t.step, what);
    BOOST_TEST(first.first_step == 0);
    BOOST_TEST(first.steps_run == first.stopped_at + 1, what);
    // From the signal to the stop: the rest of the step it landed in, and one checkpoint write.
    const double bound = 1.5 * (reference.longest_step_s + first.longest_save_s) + 0.05;
    BOOST_TEST_MESSAGE(what << ": stopped after step " << first.stopped_at << ", " << 1e3 * first.signal_to_stop_s
                            << " ms after the signal (a step takes up to " << 1e3 * reference.longest_step_s
                            << " ms, a save " << 1e3 * first.longest_save_s << " ms)");
    BOOST_TEST(first.signal_to_stop_s <= bound,
               what << ": " << first.signal_to_stop_s << " s from the signal to the stop");
    // The restart: from the step after the one it stopped at, to the end, with the same bits.
    const auto second = run(second_strategy, dir, where::none, -1);
    BOOST_TEST(!second.preempted);
    BOOST_TEST(second.first_step == first.stopped_at + 1, what);
    BOOST_TEST(first.steps_run + second.steps_run == total_steps, what << ": no step lost or repeated");
    BOOST_TEST((second.parameters == reference.parameters),
               what << ": the resumed run's parameters are the uninterrupted run's");
    std::filesystem::remove_all(dir);
  }
  std::filesystem::remove_all(reference_dir);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(preemption)

BOOST_AUTO_TEST_CASE(one_device_stops_after_the_signalled_step_and_resumes_bit_identical) {
  dist::one_device_strategy<dist::cpu> a, b;
  every_point_of_a_run(a, b, "one_device");
}

BOOST_AUTO_TEST_CASE(mirrored_replicas_stop_together_and_resume_bit_identical) {
  dist::mirrored_strategy<dist::cpu> a{dist::cpu_replicas(2)}, b{dist::cpu_replicas(2)};
  every_point_of_a_run(a, b, "mirrored");
}

BOOST_AUTO_TEST_CASE(a_second_signal_during_the_save_neither_stops_nor_tears_it) {
  const auto dir = fresh_dir("second_signal");
  dist::one_device_strategy<dist::cpu> s;
  struct sigaction before{};
  ::sigaction(SIGUSR1, nullptr, &before);
  std::vector<float> state(1000, 1.5f);
  int saves = 0;
  {
    dist::preemption_checkpoint handler{s, dir,
                                        [&](ckpt::archive& a) {
                                          ++saves;
                                          std::raise(SIGTERM);  // again, and another of the watched ones
                                          std::raise(SIGINT);
                                          a.put_bytes("state", std::as_bytes(std::span(state)));
                                        },
                                        [](const ckpt::archive&) {}};
    std::raise(SIGUSR1);
    BOOST_TEST(handler.after_step(0));
    BOOST_TEST(handler.signal() == SIGUSR1);
    BOOST_TEST(handler.describe().find("SIGUSR1 after step 0") != std::string::npos, handler.describe());
  }
  BOOST_TEST(saves == 1);
  ckpt::directory d{dir};
  const auto latest = d.load_latest();
  BOOST_TEST_REQUIRE(latest.has_value());
  BOOST_TEST(latest->get<std::int64_t>("preemption/step") == 0);
  // The action the handler found came back (checked without raising the signal).
  struct sigaction now{};
  ::sigaction(SIGUSR1, nullptr, &now);
  BOOST_TEST((now.sa_handler == before.sa_handler));
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(without_a_signal_nothing_stops_and_the_options_are_checked) {
  const auto dir = fresh_dir("options");
  dist::one_device_strategy<dist::cpu> s;
  const auto nothing = [](ckpt::archive&) {};
  const auto ignore = [](const ckpt::archive&) {};
  {
    dist::preemption_checkpoint handler{s, dir, nothing, ignore, {.save_every = 4}};
    BOOST_TEST(handler.first_step() == 0);
    for (std::int64_t step = 0; step < 10; ++step) BOOST_TEST(!handler.after_step(step));
    BOOST_TEST(!handler.preempted());
    BOOST_TEST(handler.exit_code() == 0);
  }
  ckpt::directory d{dir};
  const auto steps = d.steps();
  BOOST_TEST_REQUIRE(steps.size() == 2u);  // after steps 3 and 7
  BOOST_TEST(steps[0].first == 7);
  BOOST_TEST(steps[1].first == 3);
  {
    dist::preemption_checkpoint handler{s, dir, nothing, ignore, {.exit_code = 75}};
    BOOST_TEST(handler.first_step() == 8);
    BOOST_TEST(handler.resumed());
    std::raise(SIGTERM);
    BOOST_TEST(handler.after_step(8));
    BOOST_TEST(handler.exit_code() == 75);
  }
  BOOST_CHECK_THROW((dist::preemption_checkpoint{s, dir, nothing, ignore, {.save_every = -1}}), std::invalid_argument);
  BOOST_CHECK_THROW((dist::preemption_checkpoint{s, dir, {}, ignore}), std::invalid_argument);
  BOOST_CHECK_THROW((dist::preemption_checkpoint{s, dir, nothing, ignore, {.signals = {SIGKILL}}}),
                    std::invalid_argument);
  // A directory whose every checkpoint is damaged is an error, not a fresh start.
  for (const auto& [step, file] : d.steps()) std::filesystem::resize_file(file, 10);
  BOOST_CHECK_THROW((dist::preemption_checkpoint{s, dir, nothing, ignore}), ckpt::no_loadable_checkpoint);
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_SUITE_END()
