#pragma once
// Which API issued a collective, and in which step: carried with every collective so that a mismatch
// or a timeout names the calls a user wrote (`strategy.reduce`, `all_reduce_gradients`,
// `sync_batch_norm forward`, ...) rather than only the wire-level operation ("all_reduce(sum) of 1
// float32").
//
// The library's own APIs label their collectives; a program labels its own with
//
//   dist::collective_label label("validation loss");
//   r.all_reduce(dist::reduce_op::sum, loss);          // named "validation loss" in errors
//
// The label is per thread and the innermost one wins. Collectives whose API labels differ on two
// replicas or workers are a mismatch even when they move the same number of the same elements: a
// worker's `strategy.reduce` must never silently pair with another's gradient all-reduce.

#include <cstdint>
#include <cstring>
#include <string>

namespace distribute {

// What a collective was issued from.
struct collective_origin {
  const char* api = nullptr;  // a string with static storage duration, or nullptr (a direct call)
  std::int64_t step = -1;     // the step: `run` call k (from 0) issued it, or it came after step k; -1 unknown
  bool in_step = false;       // issued inside `run` (else between steps)
};

namespace detail {
inline thread_local collective_origin current_origin{};

inline bool same_api(const char* a, const char* b) noexcept { return std::strcmp(a ? a : "", b ? b : "") == 0; }

// What follows a collective's description: " from strategy.reduce after step 3", " from
// all_reduce_gradients in step 4", " in step 4", or "" when nothing is known.
inline std::string describe_origin(const char* api, std::int64_t step, bool in_step) {
  std::string s = api && *api ? " from " + std::string(api) : std::string{};
  if (step >= 0) s += std::string(in_step ? " in step " : " after step ") + std::to_string(step);
  return s;
}
inline std::string describe_origin(const collective_origin& o) { return describe_origin(o.api, o.step, o.in_step); }

// Sets the step of the collectives this thread issues (the strategies, around `run` and between steps).
class step_scope {
 public:
  step_scope(std::int64_t step, bool in_step) noexcept : saved_{current_origin} {
    current_origin.step = step;
    current_origin.in_step = in_step;
  }
  ~step_scope() { current_origin = saved_; }
  step_scope(const step_scope&) = delete;
  step_scope& operator=(const step_scope&) = delete;

 private:
  collective_origin saved_;
};
}  // namespace detail

// Labels the collectives this thread issues until the end of the scope. `api` must outlive them
// (a string literal).
class collective_label {
 public:
  explicit collective_label(const char* api) noexcept : saved_{detail::current_origin.api} {
    detail::current_origin.api = api;
  }
  ~collective_label() { detail::current_origin.api = saved_; }
  collective_label(const collective_label&) = delete;
  collective_label& operator=(const collective_label&) = delete;

 private:
  const char* saved_;
};

namespace detail {
// A strategy's own collective between steps: `api` ("strategy.reduce") after step `last_step`.
class api_scope {
 public:
  api_scope(const char* api, std::int64_t last_step) noexcept : label_{api}, step_{last_step, false} {}

 private:
  collective_label label_;
  step_scope step_;
};
}  // namespace detail

}  // namespace distribute
