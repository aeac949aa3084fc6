// Built against distribute as an outside project would be; exit status 0 means the package works.
#include <distribute/distribute.hpp>

int main() {
  distribute::one_device_strategy<distribute::cpu> strategy;
  auto result = strategy.run([](auto& r) { return r.replica_id() + 1; });
  return strategy.reduce(distribute::reduce_op::sum, result) == 1 ? 0 : 1;
}
