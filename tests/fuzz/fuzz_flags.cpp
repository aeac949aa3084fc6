// libFuzzer target: the example programs' command-line parsers (examples/cyclegan/flags.hpp). The
// input is split at NUL bytes into arguments; a first byte of 0x01 picks fmnist_classifier's flags,
// anything else cyclegan_train's. Parsing, and then checking the settings as `run` does, must either
// succeed with every value inside its flag's range or throw std::invalid_argument whose message names
// a flag; anything else (a crash, a sanitizer report, another exception) is a bug.

#include "../../examples/cyclegan/classifier_training.hpp"
#include "../../examples/cyclegan/program.hpp"

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const bool classifier = size > 0 && data[0] == 0x01;
  std::vector<std::string> args;
  std::string current;
  for (std::size_t i = classifier ? 1 : 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  args.push_back(current);
  std::vector<const char*> argv{"fuzz"};
  for (const auto& a : args) argv.push_back(a.c_str());
  const int argc = static_cast<int>(argv.size());
  try {
    if (classifier) {
      cyclegan::classifier_settings st;
      if (cyclegan::parse_classifier_arguments(st, argc, argv.data())) {
        const auto& o = st.options;
        if (o.epochs < 1 || o.batch < 1 || st.replicas < 1 || !(o.lr > 0) || !std::isfinite(o.lr)) std::abort();
      }
    } else {
      cyclegan::settings st;
      if (cyclegan::parse_arguments(st, argc, argv.data())) {
        cyclegan::validate(st);  // what the parser accepted, run accepts
        const auto& t = st.train;
        if (t.batch < 1 || st.replicas < 1 || st.epochs < 1 || !std::isfinite(t.lr) || !(t.lr > 0) || st.samples < 1 ||
            !(t.decay_fraction >= 0 && t.decay_fraction <= 1) || st.image_size < 8)
          std::abort();
      }
    }
  } catch (const std::invalid_argument& e) {
    const std::string what = e.what();
    if (what.find("--") == std::string::npos) std::abort();  // every message names a flag
  }
  return 0;
}
