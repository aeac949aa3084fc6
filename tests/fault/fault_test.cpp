// The crash test of the CycleGAN example: cyclegan_train is killed (SIGKILL) at chosen system calls
// while it writes checkpoints, losses.csv and pictures (fault_shim.cpp, preloaded), then resumed
// until it finishes. Every resumed run must end with whole outputs (every CSV row once, whole PNGs,
// no temporaries left) and a final checkpoint byte-identical to that of an uninterrupted run.
//
//   fault_test <cyclegan_train> <fault_shim.so> <work dir>
//
// It trains on a small synthetic Fashion-MNIST-format directory, so each run takes a fraction of a
// second and the test needs no dataset.

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;

namespace {

std::string trainer, shim;
int failures = 0;

void fail(const std::string& scenario, const std::string& what) {
  std::fprintf(stderr, "FAIL [%s]: %s\n", scenario.c_str(), what.c_str());
  ++failures;
}

std::vector<char> bytes_of(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void write_idx(const fs::path& p, std::vector<std::uint32_t> dims, const std::vector<std::uint8_t>& values) {
  std::vector<std::uint8_t> b{0, 0, 0x08, static_cast<std::uint8_t>(dims.size())};
  for (auto d : dims)
    for (int s : {24, 16, 8, 0}) b.push_back(static_cast<std::uint8_t>(d >> s));
  b.insert(b.end(), values.begin(), values.end());
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

// Sneakers (7) and ankle boots (9) of random pixels, with a few other labels between them.
void make_dataset(const fs::path& dir) {
  fs::create_directories(dir);
  std::mt19937 gen(5);
  for (const auto& [prefix, n] : {std::pair<std::string, std::uint32_t>{"train", 60}, {"t10k", 20}}) {
    std::vector<std::uint8_t> pixels(static_cast<std::size_t>(n) * 28 * 28), labels(n);
    for (auto& v : pixels) v = static_cast<std::uint8_t>(gen());
    for (std::uint32_t i = 0; i < n; ++i) labels[i] = i % 3 == 0 ? 7 : i % 3 == 1 ? 9 : 1;
    write_idx(dir / (prefix + "-images-idx3-ubyte"), {n, 28, 28}, pixels);
    write_idx(dir / (prefix + "-labels-idx1-ubyte"), {n}, labels);
  }
}

struct fault {
  std::string call, match, mode;
  long at = 0;
};

// Runs the trainer; returns its exit code, or 128 + the signal that ended it.
int run(const std::vector<std::string>& args, const fault* f, const fs::path& log_file = {}) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (f || !log_file.empty()) {
      ::setenv("LD_PRELOAD", shim.c_str(), 1);
      // A sanitizer runtime wants to come first; the shim only wraps three calls.
      const char* asan = std::getenv("ASAN_OPTIONS");
      ::setenv("ASAN_OPTIONS",
               (std::string(asan ? asan : "") + (asan && *asan ? ":" : "") + "verify_asan_link_order=0").c_str(), 1);
    }
    if (f) {
      ::setenv("FAULT_CALL", f->call.c_str(), 1);
      ::setenv("FAULT_MATCH", f->match.c_str(), 1);
      ::setenv("FAULT_MODE", f->mode.c_str(), 1);
      ::setenv("FAULT_AT", std::to_string(f->at).c_str(), 1);
    }
    if (!log_file.empty()) ::setenv("FAULT_LOG", log_file.c_str(), 1);
    std::vector<char*> argv{const_cast<char*>(trainer.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(trainer.c_str(), argv.data());
    std::perror("execv");
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::vector<std::string> arguments(const fs::path& data, const fs::path& out, bool resume) {
  std::vector<std::string> a{"--strategy",
                             "one_device",
                             "--filters",
                             "4",
                             "--blocks",
                             "1",
                             "--d-filters",
                             "4",
                             "--d-layers",
                             "2",
                             "--batch",
                             "2",
                             "--pool-size",
                             "4",
                             "--steps",
                             "6",
                             "--checkpoint-every",
                             "2",
                             "--sample-every",
                             "3",
                             "--samples",
                             "2",
                             "--fmnist-dir",
                             data.string(),
                             "--out",
                             out.string(),
                             "--checkpoint-dir",
                             (out / "ckpt").string(),
                             "--quiet"};
  if (resume) a.push_back("--resume");
  return a;
}

constexpr int steps = 6;
const char* final_checkpoint = "ckpt-0000000006.dck";

bool whole_png(const fs::path& p) {
  const auto b = bytes_of(p);
  static const char signature[8] = {'\x89', 'P', 'N', 'G', '\r', '\n', '\x1a', '\n'};
  static const char iend[12] = {0, 0, 0, 0, 'I', 'E', 'N', 'D', '\xae', 'B', '`', '\x82'};
  return b.size() > 20 && std::equal(signature, signature + 8, b.begin()) && std::equal(iend, iend + 12, b.end() - 12);
}

// The outputs of a finished run, against the uninterrupted run's checkpoint.
void check_outputs(const std::string& scenario, const fs::path& out, const std::vector<char>& reference) {
  if (bytes_of(out / "ckpt" / final_checkpoint) != reference)
    fail(scenario, "the final checkpoint differs from the uninterrupted run's");
  std::ifstream csv(out / "losses.csv");
  std::string line;
  std::getline(csv, line);
  if (line.rfind("step,", 0) != 0) fail(scenario, "losses.csv has no header");
  std::int64_t expect = 1;
  while (std::getline(csv, line)) {
    if (std::count(line.begin(), line.end(), ',') != 9) fail(scenario, "losses.csv has a broken row: '" + line + "'");
    if (std::atoll(line.c_str()) != expect) {
      fail(scenario, "losses.csv row for step " + std::to_string(expect) + " is '" + line + "'");
      return;
    }
    ++expect;
  }
  if (expect != steps + 1)
    fail(scenario, "losses.csv holds " + std::to_string(expect - 1) + " rows, not " + std::to_string(steps));
  for (const char* png : {"samples_final.png", "losses.png", "samples_step000003.png", "samples_step000006.png"})
    if (!whole_png(out / png)) fail(scenario, std::string(png) + " is missing or not a whole PNG");
  for (const auto& e : fs::recursive_directory_iterator(out))
    if (e.path().filename().string().find(".tmp-") != std::string::npos)
      fail(scenario, "left behind: " + e.path().string());
}

// How many of the logged calls are `call` on a path containing `match`.
long count_calls(const fs::path& log, const std::string& call, const std::string& match) {
  std::ifstream in(log);
  std::string line;
  long n = 0;
  while (std::getline(in, line))
    if (line.rfind(call + " ", 0) == 0 && line.find(match, call.size() + 1) != std::string::npos) ++n;
  return n;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: fault_test <cyclegan_train> <fault_shim.so> <work dir>\n");
    return 2;
  }
  trainer = argv[1];
  shim = argv[2];
  const fs::path work = fs::absolute(argv[3]);
  fs::remove_all(work);
  const fs::path data = work / "fmnist";
  make_dataset(data);
  const auto t0 = std::chrono::steady_clock::now();

  // The uninterrupted run, with every write, fsync and rename logged.
  const fs::path ref_out = work / "reference", log = work / "calls.log";
  if (const int rc = run(arguments(data, ref_out, false), nullptr, log); rc != 0) {
    std::fprintf(stderr, "FAIL: the uninterrupted run exited with %d\n", rc);
    return 1;
  }
  const auto reference = bytes_of(ref_out / "ckpt" / final_checkpoint);
  check_outputs("uninterrupted", ref_out, reference);

  // Where to kill: the writes of the checkpoints, the CSV and the pictures, whole or torn, before and
  // after their fsync and rename, at the first, a middle or the last such call of the run. With
  // `chain`, the resumed run is killed once more at the first such call before the last resume.
  enum where { first, middle, last };
  struct scenario {
    std::string call, match, mode;
    where at;
    bool chain;
  };
  const std::vector<scenario> scenarios{
      {"write", "/ckpt/ckpt-", "torn", middle, true},  {"fsync", "/ckpt/ckpt-", "before", first, false},
      {"rename", "/ckpt/ckpt-", "after", last, false}, {"write", "losses.csv", "torn", middle, false},
      {"rename", "losses.csv", "before", last, true},  {"write", ".png", "torn", middle, false},
      {"rename", ".png", "before", first, false},
  };
  int count = 0, killed = 0;
  for (const auto& sc : scenarios) {
    const long n = count_calls(log, sc.call, sc.match);
    if (n == 0) {
      fail(sc.call + " " + sc.match, "the uninterrupted run made no such call (is the shim loaded?)");
      continue;
    }
    const long at = sc.at == first ? 1 : sc.at == middle ? (n + 1) / 2 : n;
    const std::string name =
        sc.call + " '" + sc.match + "' #" + std::to_string(at) + "/" + std::to_string(n) + " " + sc.mode;
    const fs::path out = work / ("run" + std::to_string(count++));
    const fault f{sc.call, sc.match, sc.mode, at};
    const int rc = run(arguments(data, out, false), &f);
    if (rc == 128 + SIGKILL) ++killed;
    else fail(name, "the run was not killed (exit " + std::to_string(rc) + ")");
    if (sc.chain) {
      const fault again{sc.call, sc.match, sc.mode, 1};
      const int rc2 = run(arguments(data, out, true), &again);
      if (rc2 != 0 && rc2 != 128 + SIGKILL) fail(name, "the first resumed run exited with " + std::to_string(rc2));
    }
    if (const int rc3 = run(arguments(data, out, true), nullptr); rc3 != 0)
      fail(name, "the resumed run exited with " + std::to_string(rc3));
    else check_outputs(name, out, reference);
    std::printf("%-45s killed, resumed%s: %s\n", name.c_str(), sc.chain ? " (killed again)" : "",
                failures ? "see above" : "whole");
    std::fflush(stdout);
    fs::remove_all(out);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%d scenarios, %d runs killed at the chosen call, %d failures, %.1f s\n", count, killed, failures,
              seconds);
  if (failures == 0) fs::remove_all(work);
  return failures == 0 ? 0 : 1;
}
