#pragma once
// The command-line parser of the example programs: each flag is declared once with its type and the
// range it accepts, and every error names the flag, the value given and that range, e.g.
//   --batch: 0 is out of range (accepted: an integer from 1 to 4096)
//   --lr: nan is out of range (accepted: a finite number above 0 and at most 1)
// Integers are parsed whole into their own type (no silent cast: 4294967297 is not 1); floats must be
// finite where a flag says so. Errors are std::invalid_argument.

#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

namespace cyclegan::flags {

// "an integer from 1 to 4096"
template <std::integral T>
std::string integer_range(T lo, T hi) {
  return "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
}

inline std::string number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

// "a finite number above 0 and at most 1"
inline std::string real_range(double lo, double hi, bool lo_open) {
  return "a finite number " + std::string(lo_open ? "above " : "from ") + number(lo) +
         (lo_open ? " and at most " : " to ") + number(hi);
}

[[noreturn]] inline void out_of_range(std::string_view flag, std::string_view value, const std::string& accepted) {
  throw std::invalid_argument(std::string(flag) + ": " + std::string(value) +
                              " is out of range (accepted: " + accepted + ")");
}

// The value of `flag` as a T in [lo, hi].
template <std::integral T>
T parse_integer(std::string_view flag, std::string_view text, T lo, T hi) {
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  T value{};
  const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  const bool whole = !digits.empty() && end == digits.data() + digits.size();
  if (err == std::errc::result_out_of_range || (std::is_unsigned_v<T> && digits.size() > 1 && digits.front() == '-' &&
                                                digits.find_first_not_of("0123456789", 1) == std::string_view::npos))
    out_of_range(flag, text, integer_range(lo, hi));
  if (err != std::errc{} || !whole || (!digits.empty() && digits.front() == '+'))
    throw std::invalid_argument(std::string(flag) + ": '" + std::string(text) +
                                "' is not an integer (accepted: " + integer_range(lo, hi) + ")");
  if (value < lo || value > hi) out_of_range(flag, text, integer_range(lo, hi));
  return value;
}

// The value of `flag` as a finite double in [lo, hi] (or (lo, hi] when lo_open).
inline double parse_real(std::string_view flag, std::string_view text, double lo, double hi, bool lo_open = false) {
  std::string_view digits = text;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  double value = 0;
  const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if ((err != std::errc{} && err != std::errc::result_out_of_range) || digits.empty() ||
      end != digits.data() + digits.size())
    throw std::invalid_argument(std::string(flag) + ": '" + std::string(text) +
                                "' is not a number (accepted: " + real_range(lo, hi, lo_open) + ")");
  if (err == std::errc::result_out_of_range || !std::isfinite(value) || value < lo || value > hi ||
      (lo_open && value == lo))
    out_of_range(flag, text, real_range(lo, hi, lo_open));
  return value;
}

class parser {
 public:
  template <std::integral T>
  parser& integer(std::string name, T& target, T lo, T hi) {
    return add(std::move(name), [&target, lo, hi](std::string_view flag, std::string_view v) {
      target = parse_integer(flag, v, lo, hi);
    });
  }
  parser& real(std::string name, double& target, double lo, double hi, bool lo_open = false) {
    return add(std::move(name), [&target, lo, hi, lo_open](std::string_view flag, std::string_view v) {
      target = parse_real(flag, v, lo, hi, lo_open);
    });
  }
  parser& text(std::string name, std::string& target) {
    return add(std::move(name), [&target](std::string_view flag, std::string_view v) {
      if (v.empty()) throw std::invalid_argument(std::string(flag) + ": the value must not be empty");
      target = std::string(v);
    });
  }
  parser& path(std::string name, std::filesystem::path& target) {
    return add(std::move(name), [&target](std::string_view flag, std::string_view v) {
      if (v.empty()) throw std::invalid_argument(std::string(flag) + ": the path must not be empty");
      target = std::filesystem::path(std::string(v));
    });
  }
  // One of `choices`; `set` turns the accepted word into the setting.
  parser& choice(std::string name, std::vector<std::string> choices, std::function<void(const std::string&)> set) {
    return add(std::move(name),
               [choices = std::move(choices), set = std::move(set)](std::string_view flag, std::string_view v) {
                 for (const auto& c : choices)
                   if (c == v) return set(c);
                 std::string list;
                 for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
                 throw std::invalid_argument(std::string(flag) + ": '" + std::string(v) + "' is not one of " + list);
               });
  }
  parser& toggle(std::string name, bool& target) {
    toggles_[std::move(name)] = &target;
    return *this;
  }

  // Parses argv[1..argc). Returns false as soon as --help or -h is met (the caller prints its usage);
  // throws std::invalid_argument for an unknown flag or a bad value.
  bool parse(int argc, const char* const* argv) const {
    for (int i = 1; i < argc; ++i) {
      const std::string_view flag = argv[i];
      if (flag == "--help" || flag == "-h") return false;
      if (const auto t = toggles_.find(flag); t != toggles_.end()) {
        *t->second = true;
        continue;
      }
      const auto v = valued_.find(flag);
      if (v == valued_.end()) throw std::invalid_argument("unknown flag '" + std::string(flag) + "' (see --help)");
      if (i + 1 >= argc) throw std::invalid_argument(std::string(flag) + " needs a value");
      v->second(flag, argv[++i]);
    }
    return true;
  }

 private:
  using setter = std::function<void(std::string_view flag, std::string_view value)>;
  parser& add(std::string name, setter s) {
    valued_[std::move(name)] = std::move(s);
    return *this;
  }
  std::map<std::string, setter, std::less<>> valued_;
  std::map<std::string, bool*, std::less<>> toggles_;
};

}  // namespace cyclegan::flags
