// libFuzzer target: PNG/JPEG decoding (stb_image behind decode_image), gzip-wrapped or not, and the
// image operations of the pipeline on whatever it decodes. It must either give an image whose shape
// matches its values, or throw input_error. Each input is tried as it is (raw bytes, or a gzip stream
// when it starts with 1F 8B) and wrapped in a valid gzip stream, so the gunzip path sees both broken
// and well-formed gzip around every image the mutator makes.

#include <distribute/data/image.hpp>

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <vector>

namespace {

namespace data = distribute::data;

// Small limits keep each run fast; the checks against them are what is being tested.
constexpr data::input_limits limits{.max_file_bytes = 1 << 20, .max_image_bytes = 1 << 20};

void decode(std::span<const std::uint8_t> bytes) {
  for (int channels : {0, 1, 3}) {
    try {
      auto img = data::decode_image(bytes, "fuzz-input", channels, limits);
      if (img.shape.size() != 3 || img.shape[0] * img.shape[1] * img.shape[2] != img.values.size()) std::abort();
      if (img.values.size() > limits.max_image_bytes) std::abort();
      auto small = data::resize_image(img, 5, 7, limits);
      if (small.values.size() != 5 * 7 * img.shape[2]) std::abort();
      auto window = data::crop_image(small, 1, 2, 3, 4);
      data::flip_left_right(window);
    } catch (const data::input_error&) {}
  }
}

std::vector<std::uint8_t> gzip(std::span<const std::uint8_t> bytes) {
  z_stream z{};
  if (deflateInit2(&z, 1, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  std::vector<std::uint8_t> out(deflateBound(&z, static_cast<uLong>(bytes.size())) + 32);
  z.next_in = const_cast<Bytef*>(bytes.data());
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = out.data();
  z.avail_out = static_cast<uInt>(out.size());
  if (deflate(&z, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  const std::span<const std::uint8_t> in(bytes, size);
  decode(in);
  decode(gzip(in));
  return 0;
}
