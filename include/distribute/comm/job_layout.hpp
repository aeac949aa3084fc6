#pragma once
// Where a multi-worker job's replicas are: worker w holds replicas first_replica(w) ..
// first_replica(w) + replicas_of(w) - 1, numbered across the job in worker order. Learning it is a
// collective of the workers (they exchange their replica counts over the cross-worker communicator).

#include <distribute/collective_origin.hpp>

#include <algorithm>
#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute::comm {

class job_layout {
 public:
  job_layout() = default;

  // Every worker's replica count, gathered over `cross` (every worker calls it).
  template <class Cross>
  static job_layout gather(Cross& cross, int local_replicas) {
    std::vector<int> counts(static_cast<std::size_t>(cross.size()));
    {
      const collective_label label("strategy construction (replica counts)");
      cross.all_gather(std::span<const int>(&local_replicas, 1), std::span<int>(counts));
    }
    job_layout out;
    out.first_.assign(counts.size() + 1, 0);
    for (std::size_t w = 0; w < counts.size(); ++w) {
      if (counts[w] < 1)
        throw std::invalid_argument("distribute: worker " + std::to_string(w) + " has " + std::to_string(counts[w]) +
                                    " replicas; every worker needs at least one");
      out.first_[w + 1] = out.first_[w] + counts[w];
    }
    return out;
  }

  int num_workers() const noexcept { return static_cast<int>(first_.size()) - 1; }
  int total_replicas() const noexcept { return first_.empty() ? 0 : first_.back(); }
  // The first replica of worker `w` and how many it holds.
  int first_replica(int w) const noexcept { return first_[static_cast<std::size_t>(w)]; }
  int replicas_of(int w) const noexcept {
    return first_[static_cast<std::size_t>(w) + 1] - first_[static_cast<std::size_t>(w)];
  }
  int worker_of(int replica) const noexcept {
    return static_cast<int>(std::upper_bound(first_.begin(), first_.end(), replica) - first_.begin()) - 1;
  }
  // Whether every worker holds as many replicas as worker 0.
  bool even() const noexcept {
    for (int w = 1; w < num_workers(); ++w)
      if (replicas_of(w) != replicas_of(0)) return false;
    return true;
  }

 private:
  std::vector<int> first_;
};

}  // namespace distribute::comm
