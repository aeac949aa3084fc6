#pragma once
// The errors of a layer's options: each names the layer (with all its options), the option, its
// value (and whether that is the default, which the caller did not write), and what it must be.
//
//   distribute: conv_transpose2d {in_channels 16, out_channels 32, kernel 7, stride 1, padding 0,
//   output_padding 1}: output_padding is 1 but must be below stride (1)

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>

namespace distribute::nn::detail {

// 1e-05, 0.1, 2: as a person would write the option.
inline std::string short_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

class option_check {
 public:
  option_check(const char* layer, std::string described) : layer_{layer}, described_{std::move(described)} {}

  // `value` (the option `name`, whose default is `fallback`) must be at least `least`.
  void at_least(const char* name, std::int64_t value, std::int64_t fallback, std::int64_t least) const {
    if (value < least) fail(name, value, fallback, "must be at least " + std::to_string(least));
  }
  // ... and below `bound` (another option, `bound_name`).
  void below(const char* name, std::int64_t value, std::int64_t fallback, const char* bound_name,
             std::int64_t bound) const {
    if (value >= bound)
      fail(name, value, fallback, "must be below " + std::string(bound_name) + " (" + std::to_string(bound) + ")");
  }
  void positive(const char* name, double value, double fallback) const {
    if (!(value > 0)) fail(name, short_number(value), value == fallback, "must be positive");
  }
  void within(const char* name, double value, double fallback, double lo, double hi) const {
    if (!(value >= lo && value <= hi))
      fail(name, short_number(value), value == fallback,
           "must be in [" + short_number(lo) + ", " + short_number(hi) + "]");
  }
  // ... in [lo, hi).
  void within_below(const char* name, double value, double fallback, double lo, double hi) const {
    if (!(value >= lo && value < hi))
      fail(name, short_number(value), value == fallback,
           "must be in [" + short_number(lo) + ", " + short_number(hi) + ")");
  }
  // Any other rule, said in `rule` ("must be at least 1 (or 0: the kernel size)").
  void require(bool ok, const char* name, std::int64_t value, std::int64_t fallback, const std::string& rule) const {
    if (!ok) fail(name, value, fallback, rule);
  }

 private:
  [[noreturn]] void fail(const char* name, std::int64_t value, std::int64_t fallback, const std::string& rule) const {
    fail(name, std::to_string(value), value == fallback, rule);
  }
  [[noreturn]] void fail(const char* name, const std::string& value, bool is_default, const std::string& rule) const {
    throw std::invalid_argument("distribute: " + std::string(layer_) + " " + described_ + ": " + name + " is " + value +
                                (is_default ? " (the default)" : "") + " but " + rule);
  }

  const char* layer_;
  std::string described_;
};

}  // namespace distribute::nn::detail
