// Does not compile, on purpose: strategy.run's arguments in another order than fn's parameters. The
// test (compile.run_argument_order) expects one static_assert naming run's arguments 1 and 2.
#include <distribute/concepts/replica.hpp>
#include <distribute/strategy/mirrored_strategy.hpp>

struct net {};
struct batch {};

int main() {
  distribute::mirrored_strategy<distribute::cpu> s{distribute::cpu_replicas(2)};
  auto nets = s.mirror([](auto&) { return net{}; });
  const batch b;
  s.run([](distribute::replica auto&, net&, const batch&) {}, b, nets);
}
