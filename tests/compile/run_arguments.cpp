// How strategy.run's fn may take its arguments. Compiled once by check_compile_errors.sh
// (compile.run_arguments): the calls under "allowed" must compile, and each call under "refused"
// must give exactly the error of the `expect-error:` line above it, and no other. Each refused call
// names a different position or type, so that the compiler reports every one (it reports one
// template's failed instantiation once).
#include <distribute/concepts/replica.hpp>
#include <distribute/strategy/mirrored_strategy.hpp>
#include <distribute/strategy/one_device_strategy.hpp>

#include <vector>

namespace dist = distribute;

struct model {
  std::vector<float> w{0.0f};
  void step() { w[0] += 1.0f; }
};
struct optimiser {
  int steps = 0;
  void step() { ++steps; }
};
struct batch {
  int size = 0;
};

int main() {
  dist::mirrored_strategy<dist::cpu> s{dist::cpu_replicas(2)};
  using replica = dist::mirrored_strategy<dist::cpu>::replica_type;
  auto nets = s.mirror([](auto&) { return model{}; });
  auto opts = s.mirror([](auto&) { return optimiser{}; });
  const auto fixed_nets = nets;
  auto batches = s.values_from_function([](int) { return batch{}; });
  const auto fixed_batches = batches;
  const int step = 3;
  float lr = 0.1f;
  dist::one_device_strategy<dist::cpu> one{dist::cpu{}};
  auto one_net = one.mirror([](auto&) { return model{}; });

  // --- allowed --------------------------------------------------------------------------------------
  s.run([](auto&, batch& b, model& m) { b.size += 1, m.step(); }, batches, nets);
  s.run([](auto&, const batch&, const model& m) { (void)m; }, fixed_batches, nets);
  s.run([](auto&, const batch&, const model& m) { (void)m; }, fixed_batches, fixed_nets);
  // per-replica inputs and shared values by value: a copy of an input is the caller's choice
  s.run([](auto&, batch b, model& m, int k, float f) { b.size += k, m.step(), (void)f; }, batches, nets, step, lr);
  s.run([](auto&, int k) { (void)k; }, 4);
  s.run([](replica&, batch b, model& m) { b.size += 1, m.step(); }, batches, nets);
  s.run([](dist::replica auto&, auto& b, auto& m) { b.size += 1, m.step(); }, batches, nets);
  s.run([](auto&, auto& b, auto& m, auto k) { (void)b, (void)k, m.step(); }, fixed_batches, nets, step);
  s.run([](auto&, auto b, auto& m, auto k) { b.size += k, m.step(); }, fixed_batches, nets, step);
  s.run([](auto&, const auto& b, const auto& m) { (void)b, (void)m; }, fixed_batches, nets);
  s.run([](auto&, auto&& b, auto&& m) { (void)b, m.step(); }, batches, nets);
  s.run([](auto&, auto&... all) { (void)sizeof...(all); }, batches, nets);
  s.run([](auto&, const batch&, auto& m) { m.step(); }, fixed_batches, nets);
  s.run([](auto&, float f, auto k, auto& m) { (void)f, (void)(k % 2), m.step(); }, lr, step, nets);
  s.run([]<class M>(auto&, M& m) { m.step(); }, nets);
  s.run([](replica&, auto& m) { m.step(); }, nets);
  one.run([](auto&, model& m) { m.step(); }, one_net);
  s.run_on_primary([](auto&, model& m, optimiser& o) { m.step(), o.step(); }, nets, opts);

  // --- refused --------------------------------------------------------------------------------------
  // expect-error: fn takes argument 2 (a mirrored value) by value
  s.run([](auto&, batch& b, model m) { b.size += 1, m.step(); }, batches, nets);
  // expect-error: fn takes argument 2 (a mirrored value) by value
  s.run([](auto&, auto& b, auto o) { (void)b, o.step(); }, batches, opts);
  // expect-error: fn takes argument 1 (a mirrored value) by value
  s.run([](auto&, auto m, const batch&) { m.step(); }, nets, fixed_batches);
  // expect-error: fn takes argument 3 (a mirrored value) by value
  s.run([](replica&, batch&, int, model m) { m.step(); }, batches, step, nets);
  // expect-error: fn takes argument 1 (a mirrored value) by value
  one.run([](auto&, optimiser o) { o.step(); }, one.mirror([](auto&) { return optimiser{}; }));
  // expect-error: fn takes argument 3 (a mirrored value) by value
  s.run_on_primary([](auto&, int, float, optimiser o) { o.step(); }, step, lr, opts);
  // expect-error: argument 1 is const (a const per-replica input)
  s.run([](auto&, batch& b, model& m) { b.size += 1, m.step(); }, fixed_batches, nets);
  // expect-error: argument 2 is const (a const per-replica input)
  s.run([](replica&, int, batch& b) { b.size += 1; }, step, fixed_batches);
  // expect-error: argument 1 is const (a const value, shared by every replica)
  s.run([](auto&, int& k) { ++k; }, step);
  // expect-error: argument 1 is const (a const mirrored value)
  s.run([](auto&, model& m) { m.step(); }, fixed_nets);
}
