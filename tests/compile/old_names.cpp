// Names a program written against an earlier version may use still compile, each with a warning that
// names the new one: engine_options (compute_options) and set_engine_options (set_compute_options).
#include <distribute/distribute.hpp>

int main() {
  distribute::engine_options options;
  options.threads = 1;
  distribute::one_device_strategy<> one;
  one.set_engine_options(options);
  distribute::mirrored_strategy<> mirrored{distribute::cpu_replicas(2)};
  mirrored.set_engine_options(options);
  return 0;
}
