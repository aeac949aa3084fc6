// Jobs that fail, started by this test (itself not under mpiexec) as mpiexec -np N <this program>
// --scenario=...: a killed worker, a stalled worker, a worker whose step throws, workers that
// disagree (with and without fingerprints), and the resume from the chief's checkpoint after a kill,
// which must reach the parameters of a job that was never killed. Every failed job must end
// non-zero within seconds. Also: the program started without a launcher is a single worker.

#include <boost/test/unit_test.hpp>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <unistd.h>
#include <csignal>
#include <vector>

#include <sys/wait.h>

#ifndef DISTRIBUTE_TEST_MPIEXEC
#  error "DISTRIBUTE_TEST_MPIEXEC must name mpiexec"
#endif
#ifndef DISTRIBUTE_TEST_MPIEXEC_PREFLAGS
#  define DISTRIBUTE_TEST_MPIEXEC_PREFLAGS ""
#endif

namespace {

struct job_result {
  int exit_code;
  double seconds;
  std::string output;
};

std::string self_path() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

std::string quote(const std::string& s) {
  std::string q = "'";
  for (const char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

// Runs `command` through the shell with stderr merged into stdout.
job_result run_command(const std::string& command) {
  const auto start = std::chrono::steady_clock::now();
  std::FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  BOOST_TEST_REQUIRE(pipe != nullptr);
  std::string output;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, pipe)) output += buf;
  const int status = pclose(pipe);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  BOOST_TEST_MESSAGE("$ " << command << "\n-> exit " << code << " after " << seconds << " s\n" << output);
  return {code, seconds, output};
}

job_result run_job(int processes, const std::string& args) {
  std::string command = quote(DISTRIBUTE_TEST_MPIEXEC);
  if (*DISTRIBUTE_TEST_MPIEXEC_PREFLAGS) command += std::string(" ") + DISTRIBUTE_TEST_MPIEXEC_PREFLAGS;
  command += " -np " + std::to_string(processes) + " " + quote(self_path()) + " " + args;
  return run_command(command);
}

bool has(const job_result& r, const std::string& text) { return r.output.find(text) != std::string::npos; }

// A fresh directory in the system's temporary directory.
std::filesystem::path fresh_dir(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("distribute_mpi_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::vector<char> read_all(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(failure)

BOOST_AUTO_TEST_CASE(a_killed_worker_stops_the_job) {
  const auto dir = fresh_dir("kill");
  const auto r = run_job(3, "--scenario=train --steps=6 --kill-at=3 --timeout-ms=5000 --dir=" + quote(dir.string()));
  BOOST_TEST(r.exit_code != 0, "the job must fail");
  BOOST_TEST(!has(r, "trained to step"));
  BOOST_TEST(r.seconds < 30.0, "the survivors stopped after " << r.seconds << " s");
  std::filesystem::remove_all(dir);
}

BOOST_AUTO_TEST_CASE(a_stalled_worker_times_out_the_others) {
  // Through shared memory every survivor names the missing worker ...
  const auto r = run_job(3, "--scenario=stall --timeout-ms=2000");
  BOOST_TEST(r.exit_code != 0);
  BOOST_TEST(has(r, "worker 0 of 3 timed out after 2000 ms (waited "), "the survivors name the missing worker");
  BOOST_TEST(has(r, "worker 1 of 3 timed out after 2000 ms (waited "));
  BOOST_TEST(has(r, " ms) waiting for worker 2 "));
  BOOST_TEST(has(r, "all_reduce(sum) of 1000 float32"), "and the collective");
  BOOST_TEST(r.seconds < 30.0, "the job stopped after " << r.seconds << " s, not when the stalled worker woke");
  // ... and over the ring, the neighbour that waits for its message does.
  const auto ring = run_job(3, "--scenario=stall --no-shared-memory --timeout-ms=2000");
  BOOST_TEST(ring.exit_code != 0);
  BOOST_TEST(has(ring, "timed out after 2000 ms (waited "));
  BOOST_TEST(has(ring, " ms) waiting for a message from worker 2"));
  BOOST_TEST(ring.seconds < 30.0);
}

BOOST_AUTO_TEST_CASE(a_worker_whose_step_throws_ends_the_job_without_waiting_for_the_timeout) {
  // The timeout is 60 s; the job must end as the failed worker exits ...
  const auto exits = run_job(3, "--scenario=throw --timeout-ms=60000");
  BOOST_TEST(exits.exit_code != 0);
  BOOST_TEST(has(exits, "worker 1 of 3 failed: boom at step 2"));
  BOOST_TEST(exits.seconds < 20.0);
  // ... or, if it goes on running, when the abort grace (2 s in the tests) has passed.
  const auto lingers = run_job(3, "--scenario=throw --linger --timeout-ms=60000");
  BOOST_TEST(lingers.exit_code != 0);
  BOOST_TEST(has(lingers, "caught: boom at step 2"));
  // Through shared memory the others see at once that worker 1 left, without waiting for the abort.
  BOOST_TEST(has(lingers, "stopped: worker 1 failed: distribute: worker 1 of 3 failed: boom at step 2"));
  BOOST_TEST(lingers.seconds < 20.0);
}

BOOST_AUTO_TEST_CASE(a_worker_that_throws_with_a_gradient_overlap_open_ends_the_job_without_waiting) {
  // A bucket on the failing replica's communication thread, the next one never started: the job ends
  // as the failed worker exits, over the shared-memory window and over the ring alike.
  for (const char* path : {"", " --no-shared-memory"}) {
    const auto r = run_job(3, std::string("--scenario=throw --overlap --timeout-ms=60000") + path);
    BOOST_TEST(r.exit_code != 0, path);
    BOOST_TEST(has(r, "worker 1 of 3 failed: boom at step 2"), path);
    BOOST_TEST(r.seconds < 20.0, path);
  }
}

BOOST_AUTO_TEST_CASE(workers_that_disagree_stop_the_job_with_each_call_named) {
  const auto r = run_job(2, "--scenario=mismatch --timeout-ms=5000");
  BOOST_TEST(r.exit_code != 0);
  BOOST_TEST(has(r, "worker 0 called all_reduce(sum) of 4 float32"));
  BOOST_TEST(has(r, "worker 1 called all_reduce(sum) of 5 float32"));
  BOOST_TEST(r.seconds < 30.0);
}

// Worker 1's strategy.reduce meets worker 0's gradient all-reduce: the same wire-level collective
// (all_reduce(sum) of 1 float32). The API labels tell them apart; each worker prints one line naming
// both calls and their steps, and an exception left uncaught ends the job without a signal's backtrace.
BOOST_AUTO_TEST_CASE(a_reduce_meeting_a_gradient_all_reduce_names_both_calls) {
  for (const std::string extra : {"", " --no-shared-memory", " --uncaught"}) {
    BOOST_TEST_CONTEXT("flags:" << extra) {
      const auto r = run_job(2, "--scenario=api-mismatch --replicas=1 --timeout-ms=5000" + extra);
      BOOST_TEST(r.exit_code != 0);
      const std::string w0 = "worker 0 called all_reduce(sum) of 1 float32 from all_reduce_gradients in step 1";
      const std::string w1 = "worker 1 called all_reduce(sum) of 1 float32 from strategy.reduce after step 1";
      BOOST_TEST(has(r, w0));
      BOOST_TEST(has(r, w1));
      // One line per worker that saw it (the first to leave may end the job before the other prints):
      // never the same failure twice from one worker.
      auto count = [&](const std::string& text) {
        std::size_t n = 0;
        for (std::size_t at = r.output.find(text); at != std::string::npos; at = r.output.find(text, at + 1)) ++n;
        return n;
      };
      BOOST_TEST(count(w1) >= 1u);
      BOOST_TEST(count(w1) <= 2u);
      BOOST_TEST(count("distribute: worker 0 of 2 failed:") <= 1u);
      BOOST_TEST(count("distribute: worker 1 of 2 failed:") <= 1u);
      BOOST_TEST(!has(r, "uncaught exception"), "the uncaught failure is not printed again");
      BOOST_TEST(!has(r, "terminate called"));
      BOOST_TEST(!has(r, "Process received signal"));
      BOOST_TEST(r.seconds < 30.0);
    }
  }
}

// An exception outside any step unwinds worker 1's strategy: the worker leaves the job, and worker 0,
// waiting in a step, stops at once rather than at its 60 s timeout.
BOOST_AUTO_TEST_CASE(a_worker_whose_program_throws_outside_a_step_ends_the_job_at_once) {
  const auto r = run_job(2, "--scenario=throw-outside --timeout-ms=60000");
  BOOST_TEST(r.exit_code != 0);
  BOOST_TEST(has(r, "worker 1 of 2 failed: an exception ended the program's use of the strategy"));
  BOOST_TEST(r.seconds < 30.0, "the job stopped after " << r.seconds << " s");
}

BOOST_AUTO_TEST_CASE(without_fingerprints_a_size_mismatch_still_stops_the_job) {
  // Through shared memory every worker's call is compared in any build ...
  const auto r = run_job(2, "--scenario=mismatch --no-fingerprints --replicas=1 --timeout-ms=5000");
  BOOST_TEST(r.exit_code != 0);
  BOOST_TEST(has(r, "worker 0 called all_reduce(sum) of 4 float32"));
  BOOST_TEST(has(r, "worker 1 called all_reduce(sum) of 5 float32"));
  BOOST_TEST(r.seconds < 30.0);
  // ... over the ring, worker 1's blocks are longer than worker 0's: a short message, which MPI
  // accepts silently and the ring refuses.
  const auto ring =
      run_job(2, "--scenario=mismatch --no-fingerprints --no-shared-memory --replicas=1 --timeout-ms=5000");
  BOOST_TEST(ring.exit_code != 0);
  BOOST_TEST(has(ring, "the workers called collectives of different sizes"));
  BOOST_TEST(ring.seconds < 30.0);
}

// A receive whose sender never sends times out naming both workers, the message, and where the
// receive was issued; the job ends.
BOOST_AUTO_TEST_CASE(a_recv_whose_sender_never_sends_names_both_workers) {
  const auto r = run_job(2, "--scenario=p2p-never-sent --timeout-ms=2000");
  BOOST_TEST(r.exit_code != 0);
  BOOST_TEST(has(r,
                 "distribute: worker 1 waited 2000 ms for a message from worker 0 (recv of 64 float32, tag 3 from "
                 "stage backward) that was never sent"));
  BOOST_TEST(r.seconds < 30.0, "the job stopped after " << r.seconds << " s");
  // In a split communicator, workers are named as in the world.
  const auto split = run_job(3, "--scenario=p2p-never-sent --split --timeout-ms=2000");
  BOOST_TEST(split.exit_code != 0);
  BOOST_TEST(has(split, "distribute: worker 2 waited 2000 ms for a message from worker 1 (recv of 64 float32, tag 3"));
  BOOST_TEST(split.seconds < 30.0);
}

// A receive that meets a message of another length or element type names both calls; the message
// is taken off the wire, and the job ends.
BOOST_AUTO_TEST_CASE(a_recv_meeting_a_different_send_names_both_workers) {
  const auto r = run_job(2, "--scenario=p2p-mismatch --timeout-ms=2000");
  BOOST_TEST(r.exit_code != 0);
  BOOST_TEST(has(r,
                 "distribute: worker 1's recv of 64 float32 from worker 0 (tag 3) met worker 0's send of 80 float32 "
                 "from stage forward"));
  BOOST_TEST(r.seconds < 30.0);
  const auto type = run_job(2, "--scenario=p2p-mismatch --type --timeout-ms=2000");
  BOOST_TEST(type.exit_code != 0);
  BOOST_TEST(has(type, "worker 1's recv of 64 float32 from worker 0 (tag 3) met worker 0's send of 64 int32"));
  BOOST_TEST(type.seconds < 30.0);
}

// Pipeline stages as workers: a stage that throws ends the job with its error; a stage that never
// sends makes the next stage time out, naming both workers and the pipeline's messages.
BOOST_AUTO_TEST_CASE(a_pipeline_stage_that_fails_ends_the_job_naming_it) {
  const auto throws = run_job(2, "--scenario=pipeline-throws --replicas=1 --timeout-ms=60000");
  BOOST_TEST(throws.exit_code != 0);
  BOOST_TEST(has(throws, "worker 0 of 2 failed: stage 0 failed on micro-batch 1"));
  BOOST_TEST(throws.seconds < 20.0, "the job stopped after " << throws.seconds << " s");
  const auto stalls = run_job(2, "--scenario=pipeline-stall --replicas=1 --timeout-ms=1000");
  BOOST_TEST(stalls.exit_code != 0);
  BOOST_TEST(has(stalls,
                 "distribute: worker 1 waited 1000 ms for a message from worker 0 (recv of 6 int64, tag 3 from "
                 "pipeline activations, stage 0 to stage 1 in step 0) that was never sent"));
  BOOST_TEST(stalls.seconds < 20.0);
}

BOOST_AUTO_TEST_CASE(resume_after_a_kill_matches_an_uninterrupted_run) {
  const auto clean = fresh_dir("clean"), killed = fresh_dir("killed");
  const std::string common = "--scenario=train --steps=8 --timeout-ms=5000 ";
  const auto reference = run_job(2, common + "--dir=" + quote(clean.string()));
  BOOST_TEST_REQUIRE(reference.exit_code == 0);

  const auto first = run_job(2, common + "--kill-at=5 --dir=" + quote(killed.string()));
  BOOST_TEST(first.exit_code != 0);
  BOOST_TEST(!std::filesystem::exists(killed / "final.bin"));
  const auto resumed = run_job(2, common + "--dir=" + quote(killed.string()));
  BOOST_TEST_REQUIRE(resumed.exit_code == 0);
  BOOST_TEST((has(resumed, "resumed at step 4") || has(resumed, "resumed at step 5")),
             "the job continues from the chief's last checkpoint");

  const auto want = read_all(clean / "final.bin"), got = read_all(killed / "final.bin");
  BOOST_TEST(!want.empty());
  BOOST_TEST((got == want), "the resumed job's parameters are bit-identical to the uninterrupted job's");
  std::filesystem::remove_all(clean);
  std::filesystem::remove_all(killed);
}

// preemption_checkpoint across processes: SIGTERM to one of three workers (raised by it inside a
// step while the others wait in a collective, or sent from outside by pid) stops all three after
// the same step with one checkpoint, and the job run again continues from it to the parameters of
// a job that was never interrupted.
BOOST_AUTO_TEST_CASE(a_signal_to_one_worker_stops_every_worker_after_the_same_step_with_one_checkpoint) {
  const auto clean = fresh_dir("preempt_clean"), inside = fresh_dir("preempt_inside"),
             outside = fresh_dir("preempt_outside");
  const std::string common = "--scenario=preempt --steps=8 --replicas=1 --timeout-ms=20000 ";
  const auto reference = run_job(3, common + "--dir=" + quote(clean.string()));
  BOOST_TEST_REQUIRE(reference.exit_code == 0);
  const auto want = read_all(clean / "final.bin");
  BOOST_TEST_REQUIRE(!want.empty());

  const auto stopped = run_job(3, common + "--signal-at=3 --signal-worker=1 --dir=" + quote(inside.string()));
  BOOST_TEST(stopped.exit_code == 0);
  for (int w = 0; w < 3; ++w)
    BOOST_TEST(has(stopped, "worker " + std::to_string(w) + " stopped after step 3"), "worker " << w);
  BOOST_TEST(has(stopped, "SIGTERM after step 3"));  // worker 1's own line
  BOOST_TEST(has(stopped, "a signal to another worker after step 3"));
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(inside / "checkpoints"))
    files.push_back(e.path().filename().string());
  BOOST_TEST_REQUIRE(files.size() == 1u, "one checkpoint");
  BOOST_TEST(files[0] == "ckpt-0000000003.dck");
  const auto resumed = run_job(3, common + "--dir=" + quote(inside.string()));
  BOOST_TEST_REQUIRE(resumed.exit_code == 0);
  BOOST_TEST(has(resumed, "resumed at step 4"));
  BOOST_TEST((read_all(inside / "final.bin") == want), "the resumed job's parameters are the uninterrupted job's");

  // From outside: the job runs with 50 ms steps; SIGTERM goes to worker 2's process by its pid.
  job_result from_outside{};
  std::thread job([&] {
    from_outside = run_job(3, common + "--pid-dir=" + quote(outside.string()) + " --dir=" + quote(outside.string()));
  });
  const auto pid_file = outside / "pid-2";
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!std::filesystem::exists(pid_file) && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(120));  // a few steps in
  pid_t pid = 0;
  std::ifstream(pid_file) >> pid;
  BOOST_TEST_REQUIRE(pid > 0);
  BOOST_TEST(::kill(pid, SIGTERM) == 0);
  job.join();
  BOOST_TEST(from_outside.exit_code == 0);
  BOOST_TEST(has(from_outside, "SIGTERM after step"));
  // Every worker names the same step.
  std::string first_line;
  for (int w = 0; w < 3; ++w) {
    const auto at = from_outside.output.find("worker " + std::to_string(w) + " stopped after step ");
    BOOST_TEST_REQUIRE(at != std::string::npos, "worker " << w);
    const auto step = from_outside.output.substr(at + 28, from_outside.output.find(' ', at + 28) - (at + 28));
    if (w == 0) first_line = step;
    BOOST_TEST(step == first_line, "worker " << w << " stopped after step " << step);
  }
  const auto finished = run_job(3, common + "--dir=" + quote(outside.string()));
  BOOST_TEST_REQUIRE(finished.exit_code == 0);
  BOOST_TEST(has(finished, "resumed at step"));
  BOOST_TEST((read_all(outside / "final.bin") == want),
             "resumed after a signal from outside: the uninterrupted job's parameters");
  for (const auto& d : {clean, inside, outside}) std::filesystem::remove_all(d);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(single_worker)

BOOST_AUTO_TEST_CASE(a_program_started_without_a_launcher_is_one_worker) {
  const auto r = run_command(quote(self_path()) + " --scenario=single --replicas=2");
  BOOST_TEST(r.exit_code == 0);
  BOOST_TEST(has(r, "single worker: 1 workers, 2 replicas, sum 3"));
}

BOOST_AUTO_TEST_SUITE_END()
