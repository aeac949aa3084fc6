// Failure semantics of the CPU strategies: the cases every device shares (failure_cases.hpp),
// instantiated for CPU replicas.

#include "test_support.hpp"

#include <distribute/device/cpu.hpp>
#include <distribute/strategy/mirrored_strategy.hpp>
#include <distribute/strategy/one_device_strategy.hpp>

#include <boost/mpl/list.hpp>

#include <climits>

namespace distribute::test {

// CPU replicas, threads of this process.
struct cpu_mirrored {
  static mirrored_strategy<> make(int replicas, collective_options o = {}) {
    return mirrored_strategy<>{cpu_replicas(replicas), o};
  }
  static int max_replicas() noexcept { return INT_MAX; }
  static one_device_strategy<> one_device() { return {}; }
};

using failure_makers = boost::mpl::list<cpu_mirrored>;

}  // namespace distribute::test

#include "failure_cases.hpp"
