#pragma once
// What every benchmark shares: the timing policy (grow iterations until a repetition is long enough,
// report the median) and the facts about the run that a recorded result must carry.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <fstream>
#include <string>
#include <vector>

namespace bench {

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  }
  return "unknown CPU";
}

inline const char* compiler() {
#if defined(__clang__)
  return "clang " __clang_version__;
#elif defined(__GNUC__)
  return "g++ " __VERSION__;
#else
  return "unknown compiler";
#endif
}

// Other work on the machine skews every figure; the 1-minute load average shows whether there was any.
inline std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one_minute;
  return in >> one_minute ? one_minute : "unknown";
}

inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// Grow the iteration count until one repetition takes at least `min_seconds`, at most 100x per round
// so that one slow outlier cannot blow up the count. Returns `iters` once it is long enough.
inline std::int64_t next_iterations(std::int64_t iters, double seconds, double min_seconds) {
  if (seconds >= min_seconds) return iters;
  const double wanted = static_cast<double>(iters) * 1.2 * min_seconds / std::max(seconds, 1e-9);
  return std::clamp(static_cast<std::int64_t>(wanted), 2 * iters, 100 * iters);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

// Seconds per call of `fn`: iterations grown until one repetition lasts `min_seconds`, then the
// median of `repetitions` repetitions.
template <class F>
double seconds_per_call(F&& fn, double min_seconds, int repetitions) {
  std::int64_t iters = 1;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto next = next_iterations(iters, s, min_seconds);
    if (next == iters) break;
    iters = next;
  }
  std::vector<double> reps;
  for (int r = 0; r < repetitions; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) fn();
    reps.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
                   static_cast<double>(iters));
  }
  return median(reps);
}

// "2,4" -> {2, 4}: the replica lists of the command lines.
inline std::vector<int> parse_int_list(const std::string& text) {
  std::vector<int> out;
  for (std::string s = text; !s.empty();) {
    const auto comma = s.find(',');
    out.push_back(std::stoi(s.substr(0, comma)));
    s = comma == std::string::npos ? "" : s.substr(comma + 1);
  }
  return out;
}

}  // namespace bench
