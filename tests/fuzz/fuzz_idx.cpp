// libFuzzer target: the IDX parser on arbitrary bytes. It must either return a tensor whose shape
// matches its values, or throw input_error; anything else (a crash, a sanitizer report, another
// exception) is a bug.

#include <distribute/data/idx.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  for (std::uint32_t magic : {0u, distribute::data::idx_images_magic, distribute::data::idx_labels_magic}) {
    try {
      const auto t = distribute::data::parse_idx(std::span<const std::uint8_t>(bytes, size), "fuzz-input", magic);
      std::size_t count = 1;
      for (auto d : t.shape) count *= d;
      if (count != t.values.size()) std::abort();
    } catch (const distribute::data::input_error&) {}
  }
  return 0;
}
