// libFuzzer target: the checkpoint parser on arbitrary bytes. It must either return an archive that
// serialises back to the same bytes, or throw checkpoint_error; anything else (a crash, a sanitizer
// report, another exception) is a bug. The checksum would reject almost every mutation before the
// section parser sees it, so the target also re-seals each input with a correct checksum.

#include <distribute/checkpoint/file.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

namespace ckpt = distribute::checkpoint;

namespace {
void check(std::span<const std::byte> bytes) {
  try {
    const auto a = ckpt::parse(bytes, "fuzz-input");
    const auto again = ckpt::serialize(a);
    if (again.size() != bytes.size() || std::memcmp(again.data(), bytes.data(), bytes.size()) != 0) std::abort();
  } catch (const ckpt::checkpoint_error&) {
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  check(bytes);
  if (size >= 4) {
    std::vector<std::byte> sealed(bytes.begin(), bytes.end());
    const auto crc = ckpt::detail::crc32(std::span(sealed).first(size - 4));
    std::memcpy(sealed.data() + size - 4, &crc, 4);
    check(sealed);
  }
  return 0;
}
