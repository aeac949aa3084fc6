// libFuzzer target: the checkpoint parser on arbitrary bytes. It must either return an archive that
// serialises back to the same bytes, or throw checkpoint_error; anything else (a crash, a sanitizer
// report, another exception) is a bug. The checksum would reject almost every mutation before the
// section parser sees it, so the target also re-seals each input with a correct checksum.
//
// Mutated files rarely hold more than a few sections; an input that starts with "MANY" is instead a
// recipe for a large, valid checkpoint: a section count up to 2^14 from its next three bytes, names
// and sizes drawn from the bytes after them, then one byte of the serialised file changed at a place
// the recipe picks (and the file re-sealed). Parsing time must stay linear in the section count.

#include <distribute/checkpoint/file.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>
#include <vector>

namespace ckpt = distribute::checkpoint;

namespace {
void check(std::span<const std::byte> bytes) {
  try {
    const auto a = ckpt::parse(bytes, "fuzz-input");
    const auto again = ckpt::serialize(a);
    if (again.size() != bytes.size() || std::memcmp(again.data(), bytes.data(), bytes.size()) != 0) std::abort();
  } catch (const ckpt::checkpoint_error&) {}
}

void reseal(std::vector<std::byte>& b) {
  if (b.size() < 4) return;
  const auto crc = ckpt::detail::crc32(std::span(b).first(b.size() - 4));
  std::memcpy(b.data() + b.size() - 4, &crc, 4);
}

void many_sections(const std::uint8_t* data, std::size_t size) {
  if (size < 10) return;
  const std::uint32_t count = (std::uint32_t{data[4]} << 16 | std::uint32_t{data[5]} << 8 | data[6]) & 0x3FFF;
  const std::uint32_t flip_at = std::uint32_t{data[7]} << 16 | std::uint32_t{data[8]} << 8 | data[9];
  const std::uint8_t* recipe = data + 10;
  const std::size_t recipe_size = size - 10;
  ckpt::archive a;
  for (std::uint32_t i = 0; i < count; ++i) {
    const std::uint8_t r = recipe_size ? recipe[i % recipe_size] : 0;
    // Names share long prefixes (the case a per-name scan made quadratic); sizes 0 to 7 bytes.
    std::string name = "section/" + std::to_string(i);
    if (r & 0x80) name.insert(0, "shared/prefix/");
    std::vector<std::byte> value(r & 7u, std::byte{r});
    a.put_bytes(std::move(name), value);
  }
  auto bytes = ckpt::serialize(a);
  check(bytes);
  if (!bytes.empty()) {
    bytes[flip_at % bytes.size()] ^= std::byte{static_cast<unsigned char>(data[4] | 1)};
    reseal(bytes);
    check(bytes);
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size >= 4 && std::memcmp(data, "MANY", 4) == 0) {
    many_sections(data, size);
    return 0;
  }
  const auto bytes = std::as_bytes(std::span(data, size));
  check(bytes);
  if (size >= 4) {
    std::vector<std::byte> sealed(bytes.begin(), bytes.end());
    reseal(sealed);
    check(sealed);
  }
  return 0;
}
