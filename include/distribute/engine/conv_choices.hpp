#pragma once
// The kernel choices a CPU engine made by timing (compute_options::cpu_conv_choice): one record per
// convolution pass, shape (whatever the batch) and precision, naming the candidate weighed against
// oneDNN's direct kernel (Winograd for a wide 3x3 convolution; the swapped convolution's data gradient
// for the forward of a convolution with few output channels, dnnl_conv.hpp), with the two times and
// the winner, for logs and benchmarks (engine<cpu>::conv_choices()); and the table that keeps them,
// one for the process, so that every replica's engine and every later step use the first choice made.
//
// Runs on one machine keep their choices too: the table reads and appends a file of them, one line
// per choice, under the machine's name (its CPU, oneDNN's ISA and version), so that the second run of
// a program, or a job resumed from its checkpoint, computes with the kernels of the first, bit for
// bit, where fresh timings within noise of the margin could have chosen the other. The file is
// $DISTRIBUTE_CONV_CHOICES, or ${XDG_CACHE_HOME:-$HOME/.cache}/distribute/cpu_conv_choices.txt;
// DISTRIBUTE_CONV_CHOICES=off keeps the choices in the process only. Delete the file to time again
// (after a change of hardware or library the machine's name differs, and its lines are not used).
// Lines are appended whole (O_APPEND, one write) under an advisory lock, so processes of one job may
// share it; a line that does not parse (a line of an older format among them) is ignored.

#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/engine.hpp>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

namespace distribute {

// The candidate a timed choice weighs against oneDNN's direct kernel.
enum class conv_alternative : std::uint8_t {
  winograd,  // Winograd F(4x4, 3x3) (dnnl_conv.hpp; winograd_pays)
  swapped,   // a narrow convolution's forward as its swapped convolution's data gradient (swaps_sides)
};
inline const char* to_string(conv_alternative a) noexcept {
  return a == conv_alternative::winograd ? "Winograd" : "swapped";
}

struct conv_choice_record {
  conv_pass pass = conv_pass::forward;
  conv_geometry geometry;  // as timed (the batch of the first call)
  compute_precision precision = compute_precision::float32;
  int threads = 1;  // the count it was timed on
  conv_alternative alternative = conv_alternative::winograd;
  double alternative_seconds = 0, direct_seconds = 0;
  bool use_alternative = true;  // the choice: the alternative, or the direct kernel
  bool from_file = false;       // made by an earlier run on this machine (the choices file), not timed here

  // The timed choice keeps the kernel the pass ran before choices were timed unless the other takes
  // at most two thirds of its time: Winograd, unless the direct kernel is that much faster; the direct
  // forward, unless the swapped one is (compute_options::cpu_conv_choice).
  static bool alternative_wins(conv_alternative alternative, double alternative_seconds,
                               double direct_seconds) noexcept {
    return alternative == conv_alternative::winograd ? !(direct_seconds * 1.5 <= alternative_seconds)
                                                     : alternative_seconds * 1.5 <= direct_seconds;
  }
  // A choice holds for a pass, a geometry and a precision, whatever the batch and the thread count,
  // as the rule it replaces did: an example computes alike however a batch is split between replicas
  // or engines, and on any configured count.
  bool same_case(const conv_choice_record& o) const noexcept {
    conv_geometry a = geometry, b = o.geometry;
    a.batch = b.batch = 1;
    return pass == o.pass && a == b && precision == o.precision && alternative == o.alternative;
  }
  // "forward [1x256x66x66 -> 256x64x64, ...] bfloat16, 2 threads: Winograd 8.10 ms, direct 20.50 ms: Winograd"
  std::string to_string() const {
    char times[96];
    std::snprintf(times, sizeof times, ": %s %.2f ms, direct %.2f ms: ", distribute::to_string(alternative),
                  alternative_seconds * 1e3, direct_seconds * 1e3);
    return std::string(distribute::to_string(pass)) + " " + geometry.to_string() +
           (precision == compute_precision::bfloat16 ? " bfloat16, " : " float32, ") +
           (from_file ? std::string("from an earlier run")
                      : std::to_string(threads) + (threads == 1 ? " thread" : " threads")) +
           times + (use_alternative ? distribute::to_string(alternative) : "direct");
  }
};

namespace detail {

// A choice as one line of the file: "<machine>\t<pass> <geometry less the batch> <precision>
// <alternative> <choice> <alternative's ms> <direct ms>", the alternative and the choice as words
// ("winograd", "swapped", "direct"); and back (false where the line is not one, is another machine's
// or is of an older format).
inline const char* conv_alternative_word(conv_alternative a) noexcept {
  return a == conv_alternative::winograd ? "winograd" : "swapped";
}
inline std::string conv_choice_line(const std::string& machine, const conv_choice_record& r) {
  const conv_geometry& g = r.geometry;
  std::ostringstream o;
  o << machine << '\t' << static_cast<int>(r.pass) << ' ' << g.in_channels << ' ' << g.in_height << ' ' << g.in_width
    << ' ' << g.out_channels << ' ' << g.kernel << ' ' << g.stride << ' ' << g.pad << ' ' << g.out_height << ' '
    << g.out_width << ' ' << static_cast<int>(r.precision) << ' ' << conv_alternative_word(r.alternative) << ' '
    << (r.use_alternative ? conv_alternative_word(r.alternative) : "direct") << ' ' << r.alternative_seconds * 1e3
    << ' ' << r.direct_seconds * 1e3 << '\n';
  return o.str();
}
inline bool parse_conv_choice_line(const std::string& line, const std::string& machine, conv_choice_record& r) {
  const auto tab = line.find('\t');
  if (tab == std::string::npos || line.compare(0, tab, machine) != 0 || tab != machine.size()) return false;
  std::istringstream in(line.substr(tab + 1));
  int pass = -1, precision = -1;
  std::string alternative, choice;
  conv_geometry g;
  double a_ms = 0, d_ms = 0;
  if (!(in >> pass >> g.in_channels >> g.in_height >> g.in_width >> g.out_channels >> g.kernel >> g.stride >> g.pad >>
        g.out_height >> g.out_width >> precision >> alternative >> choice >> a_ms >> d_ms))
    return false;
  if (pass < 0 || pass > 2 ||
      (precision != static_cast<int>(compute_precision::float32) &&
       precision != static_cast<int>(compute_precision::bfloat16)) ||
      (alternative != "winograd" && alternative != "swapped") || (choice != alternative && choice != "direct"))
    return false;
  const auto alt = alternative == "winograd" ? conv_alternative::winograd : conv_alternative::swapped;
  g.batch = 1;
  r = {.pass = static_cast<conv_pass>(pass),
       .geometry = g,
       .precision = static_cast<compute_precision>(precision),
       .threads = 0,
       .alternative = alt,
       .alternative_seconds = a_ms / 1e3,
       .direct_seconds = d_ms / 1e3,
       .use_alternative = choice != "direct",
       .from_file = true};
  return true;
}

// The file of choices this process reads and appends (above); empty: none.
inline std::filesystem::path default_conv_choices_file() {
  if (const char* set = std::getenv("DISTRIBUTE_CONV_CHOICES")) {
    const std::string v = set;
    if (v.empty() || v == "off" || v == "0") return {};
    return v;
  }
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache && *cache)
    return std::filesystem::path(cache) / "distribute" / "cpu_conv_choices.txt";
  if (const char* home = std::getenv("HOME"); home && *home)
    return std::filesystem::path(home) / ".cache" / "distribute" / "cpu_conv_choices.txt";
  return {};
}

// Records by case; the first decision for a case is kept. Thread-safe: replicas decide concurrently.
class conv_choice_table {
 public:
  conv_choice_table() = default;
  // A table that reads and appends `file`'s lines of `machine` (empty file: none).
  conv_choice_table(std::filesystem::path file, std::string machine)
      : file_{std::move(file)}, machine_{std::move(machine)} {}

  // The record of `wanted`'s case, or null.
  const conv_choice_record* find(const conv_choice_record& wanted) {
    const std::lock_guard lock{mutex_};
    return find_locked(wanted);
  }
  // The record of `wanted`'s case, made by `time(record)` (which fills in the times and the choice)
  // where no engine of this process made it and the file does not hold it; then appended to the
  // file. The timing runs under the table's lock: replicas reaching a new case together wait for the
  // first one's choice, and their passes do not disturb its timing.
  template <class Time>
  const conv_choice_record& decide(const conv_choice_record& wanted, Time&& time) {
    const std::lock_guard lock{mutex_};
    if (const auto* known = find_locked(wanted)) return *known;
    read_file();  // (another process of the job may have just decided it)
    if (const auto* known = find_locked(wanted)) return *known;
    conv_choice_record r = wanted;
    time(r);
    records_.push_back(r);
    append(r);
    return records_.back();
  }
  std::vector<conv_choice_record> all() const {
    const std::lock_guard lock{mutex_};
    return {records_.begin(), records_.end()};
  }
  const std::filesystem::path& file() const noexcept { return file_; }
  // Names the machine whose lines of the file are this table's (the first name given stays): until
  // then the file is neither read nor written.
  void name_machine(const std::string& machine) {
    const std::lock_guard lock{mutex_};
    if (machine_.empty()) machine_ = machine;
  }

 private:
  const conv_choice_record* find_locked(const conv_choice_record& wanted) {
    if (!read_) read_file();
    for (const auto& r : records_)
      if (r.same_case(wanted)) return &r;  // (a deque: addresses stay valid as it grows at its end)
    return nullptr;
  }
  void read_file() {
    if (file_.empty() || machine_.empty()) return;
    read_ = true;
    std::ifstream in(file_);
    std::string line;
    conv_choice_record r;
    while (std::getline(in, line)) {
      if (!parse_conv_choice_line(line, machine_, r)) continue;
      bool known = false;
      for (const auto& k : records_) known = known || k.same_case(r);
      if (!known) records_.push_back(r);
    }
  }
  // One line, in one write with O_APPEND under an advisory lock. Best effort: a directory that
  // cannot be written costs the next run a timing, not this one its result.
  void append(const conv_choice_record& r) const {
    if (file_.empty() || machine_.empty()) return;
    std::error_code ec;
    std::filesystem::create_directories(file_.parent_path(), ec);
    const int fd = ::open(file_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    ::flock(fd, LOCK_EX);
    const std::string line = conv_choice_line(machine_, r);
    [[maybe_unused]] const auto written = ::write(fd, line.data(), line.size());
    ::flock(fd, LOCK_UN);
    ::close(fd);
  }

  mutable std::mutex mutex_;
  std::deque<conv_choice_record> records_;
  std::filesystem::path file_;
  std::string machine_;
  bool read_ = false;
};

// The process's table (engine<cpu>::conv_choices()), with the file of this machine's choices.
inline conv_choice_table& shared_conv_choices() {
  static conv_choice_table table{default_conv_choices_file(), std::string()};
  return table;
}

}  // namespace detail

// The choices the CPU engines of this process made by timing or read from the choices file, in the
// order they were made or read.
inline std::vector<conv_choice_record> cpu_conv_choices() { return detail::shared_conv_choices().all(); }

}  // namespace distribute
