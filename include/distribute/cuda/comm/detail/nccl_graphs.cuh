#pragma once
// The NCCL communicator (cuda/comm/nccl.cuh) inside CUDA graphs (nn::graphed_step): while the
// replica's stream is being captured, a collective of device buffers is queued into the graph
// instead of being run. The replicas of this process still meet and compare it (at the capture);
// nothing waits for the GPU; `take_captured()` says how many were captured. A split-phase all-reduce
// goes into the graph in order, like any other. Host buffers, point-to-point calls and pending sends
// refuse with graph_capture_error. `replay_captured(n, launch)` launches such a graph as a
// collective: the replicas of this process meet first (a replica replaying a graph of another number
// of collectives, or calling something else, is a collective_mismatch; one that never comes, a
// timeout), then the replica waits for its stream with the deadline and the error polling of every
// collective, and a replay that does not finish in time aborts the communicator, so that no NCCL
// kernel of the graph waits forever.
//
// Here: the graphs the group must destroy before it lets a communicator go (the members above are
// the communicator's and its group's).

#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace distribute::comm::detail {

// The CUDA graphs that captured operations of each local replica's communicator. NCCL does not let a
// communicator go (ncclCommAbort, ncclCommDestroy) while a graph that captured its operations exists:
// it waits for those graphs to be destroyed, which would be forever for a graph its owner keeps. So
// they are destroyed first, each held here as a weak reference to the function that destroys it (the
// owner dropping its graph, or going away, ends it).
class nccl_graph_holds {
 public:
  void resize(std::size_t local_ranks) { held_.resize(local_ranks); }

  void hold(int local, std::weak_ptr<std::function<void()>> destroy) {
    const std::lock_guard lock{m_};
    auto& held = held_[static_cast<std::size_t>(local)];
    std::erase_if(held, [](const auto& w) { return w.expired(); });
    held.push_back(std::move(destroy));
  }

  // Destroys the graphs holding operations of local replica `local`'s communicator.
  void destroy(int local) noexcept {
    std::vector<std::weak_ptr<std::function<void()>>> held;
    {
      const std::lock_guard lock{m_};
      held.swap(held_[static_cast<std::size_t>(local)]);
    }
    for (const auto& w : held) {
      if (const auto destroy = w.lock()) {
        try {
          (*destroy)();
        } catch (...) {
          // Destroying a graph does not throw; nothing to add to the failure being handled.
        }
      }
    }
  }

  void destroy_all() noexcept {
    for (std::size_t i = 0; i < held_.size(); ++i) destroy(static_cast<int>(i));
  }

 private:
  std::mutex m_;
  std::vector<std::vector<std::weak_ptr<std::function<void()>>>> held_;
};

}  // namespace distribute::comm::detail
