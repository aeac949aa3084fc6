#pragma once
// What each element-wise pass of an engine exposes to a device: its work items, the independent
// calls (or, for a sum, the threads adding their own share) that an engine may run in parallel.
// On a GPU the work items are what fills the machine: a pass over a 256x256 plane that offers one
// work item a plane runs on one thread a plane, and leaves all but one of a GPU's 132 multiprocessors
// idle. The CPU runs the same passes split by plane (its threads are few and want long contiguous
// loops), so a wrongly shaped pass is invisible there unless it is counted.
//
// Every engine reports each pass it runs to the installed observer, if any (one atomic load a pass
// otherwise): the pass's kind, its work items and the functor it calls. The work items are those of
// the pass's shape, the same on every engine:
//   for_each(n, f)                      n
//   for_each_in_segments(s, length, f)  s * length (the CPU engine may run a segment as one loop,
//                                       through the functor's whole_segment, but a GPU runs every
//                                       element on a thread of its own)
//   segmented_sum(s, length, f, out)    the threads of the GPU engine's reduction
//                                       (engine/detail/segmented_sum_plan.hpp)
// Tests and tools install an observer (observe_passes) to check that no pass over a large tensor
// offers few work items; the functor's bytes let them see what it points into.
//
// Engines also report each read of device values on the host (an engine's to_host, the library's
// host copies of a tensor): on a GPU the host waits for the replica's stream there, which a CUDA
// graph's capture cannot hold (cuda/nn/graphed.cuh), so a tool can see on the CPU where a step would
// stop a graph. Code that reads a CPU tensor's values directly is not seen.

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace distribute {

enum class pass_kind : std::uint8_t { for_each, for_each_in_segments, segmented_sum };

struct pass_record {
  pass_kind kind;
  std::int64_t work_items;
  // What the pass calls for each element: its type's name and a copy's bytes (the pointers it holds
  // say which tensors the pass covers).
  std::string_view functor_name;
  const void* functor;
  std::size_t functor_bytes;
  // The kernel launches a GPU engine makes for the pass: 1, or 2 for a segmented sum cut into chunks
  // (detail/segmented_sum_plan.hpp: a partial sum per chunk, then the chunks' sums).
  int launches = 1;
};

// Receives every pass of every engine while installed; called from the thread that runs the pass.
class pass_observer {
 public:
  virtual void on_pass(const pass_record& pass) = 0;
  // A read of `bytes` of device values on the host.
  virtual void on_host_read(std::size_t /*bytes*/) {}

 protected:
  ~pass_observer() = default;
};

namespace detail {
inline std::atomic<pass_observer*> installed_pass_observer{nullptr};

// F's name as the compiler spells it, without RTTI (which a program may be built without).
template <class F>
std::string_view functor_name() noexcept {
  std::string_view s = __PRETTY_FUNCTION__;  // "... [with F = name]" (g++), "... [F = name]" (clang)
  const auto at = s.find("F = ");
  if (at == std::string_view::npos) return s;
  s.remove_prefix(at + 4);
  return s.substr(0, s.find_first_of(";]"));
}

template <class F>
void record_pass(pass_kind kind, std::int64_t work_items, const F& f, int launches = 1) {
  if (pass_observer* o = installed_pass_observer.load(std::memory_order_acquire))
    o->on_pass(pass_record{kind, work_items, functor_name<F>(), &f, sizeof(F), launches});
}

inline void record_host_read(std::size_t bytes) {
  if (pass_observer* o = installed_pass_observer.load(std::memory_order_acquire)) o->on_host_read(bytes);
}
}  // namespace detail

// While it lives, `o` sees every pass; scopes nest (the innermost observer sees the passes, the one
// it replaced sees them again when it ends).
class observe_passes {
 public:
  explicit observe_passes(pass_observer& o) : saved_{detail::installed_pass_observer.exchange(&o)} {}
  ~observe_passes() { detail::installed_pass_observer.store(saved_); }
  observe_passes(const observe_passes&) = delete;
  observe_passes& operator=(const observe_passes&) = delete;

 private:
  pass_observer* saved_;
};

}  // namespace distribute
