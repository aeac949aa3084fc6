#pragma once
// The kernel choices a CPU engine made by timing (engine_options::cpu_conv_choice): one record per
// convolution pass, shape (whatever the batch) and precision, with the two times and the winner,
// for logs and benchmarks (engine<cpu>::conv_choices()); and the table that keeps them, one for the
// process, so that every replica's engine and every later step use the first choice made.

#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/engine.hpp>

#include <cstdio>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace distribute {

struct conv_choice_record {
  conv_pass pass = conv_pass::forward;
  conv_geometry geometry;  // as timed (the batch of the first call)
  compute_precision precision = compute_precision::float32;
  int threads = 1;  // the count it was timed on
  double winograd_seconds = 0, direct_seconds = 0;
  bool winograd = true;  // the choice

  // A choice holds for a pass, a geometry and a precision, whatever the batch and the thread count,
  // as the rule it replaces did: an example computes alike however a batch is split between replicas
  // or engines, and on any configured count.
  bool same_case(const conv_choice_record& o) const noexcept {
    conv_geometry a = geometry, b = o.geometry;
    a.batch = b.batch = 1;
    return pass == o.pass && a == b && precision == o.precision;
  }
  // "forward [1x256x66x66 -> 256x64x64, ...] bfloat16, 2 threads: Winograd 8.10 ms, direct 20.50 ms: Winograd"
  std::string to_string() const {
    char times[96];
    std::snprintf(times, sizeof times, ": Winograd %.2f ms, direct %.2f ms: ", winograd_seconds * 1e3, direct_seconds * 1e3);
    return std::string(distribute::to_string(pass)) + " " + geometry.to_string() +
           (precision == compute_precision::bfloat16 ? " bfloat16, " : " float32, ") + std::to_string(threads) +
           (threads == 1 ? " thread" : " threads") + times + (winograd ? "Winograd" : "direct");
  }
};

namespace detail {

// Records by case; the first decision for a case is kept. Thread-safe: replicas decide concurrently.
class conv_choice_table {
 public:
  // The record of `wanted`'s case, or null.
  const conv_choice_record* find(const conv_choice_record& wanted) const {
    const std::lock_guard lock{mutex_};
    for (const auto& r : records_)
      if (r.same_case(wanted)) return &r;  // (a deque: addresses stay valid as it grows at its end)
    return nullptr;
  }
  // The record of `wanted`'s case, made by `time(record)` (which fills in the times and the choice)
  // where no engine has made it yet. The timing runs under the table's lock: replicas reaching a new
  // case together wait for the first one's choice, and their passes do not disturb its timing.
  template <class Time>
  const conv_choice_record& decide(const conv_choice_record& wanted, Time&& time) {
    const std::lock_guard lock{mutex_};
    for (const auto& r : records_)
      if (r.same_case(wanted)) return r;
    conv_choice_record r = wanted;
    time(r);
    records_.push_back(r);
    return records_.back();
  }
  std::vector<conv_choice_record> all() const {
    const std::lock_guard lock{mutex_};
    return {records_.begin(), records_.end()};
  }

 private:
  mutable std::mutex mutex_;
  std::deque<conv_choice_record> records_;
};

// The process's table (engine<cpu>::conv_choices()).
inline conv_choice_table& shared_conv_choices() {
  static conv_choice_table table;
  return table;
}

}  // namespace detail

// The choices the CPU engines of this process made by timing, in the order they were made.
inline std::vector<conv_choice_record> cpu_conv_choices() { return detail::shared_conv_choices().all(); }

}  // namespace distribute
