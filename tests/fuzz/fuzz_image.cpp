// libFuzzer target: PNG/JPEG decoding (stb_image behind decode_image) and the image operations of
// the pipeline on whatever it decodes. It must either give an image whose shape matches its values,
// or throw input_error.

#include <distribute/data/image.hpp>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* bytes, std::size_t size) {
  namespace data = distribute::data;
  // Huge declared sizes only make each run slow (decode_image's own limit is 2^28 pixels): skip
  // their decoding. stb is only asked after the guard that decode_image also runs first.
  try {
    data::detail::check_jpeg_tables(std::span<const std::uint8_t>(bytes, size), "fuzz-input");
  } catch (const data::input_error&) {
    return 0;
  }
  int w = 0, h = 0, c = 0;
  if (size < (1u << 20) && stbi_info_from_memory(bytes, static_cast<int>(size), &w, &h, &c) &&
      static_cast<long long>(w) * h > (1LL << 18))
    return 0;
  for (int channels : {0, 1, 3}) {
    try {
      auto img = data::decode_image(std::span<const std::uint8_t>(bytes, size), "fuzz-input", channels);
      if (img.shape.size() != 3 || img.shape[0] * img.shape[1] * img.shape[2] != img.values.size()) std::abort();
      if (img.shape[0] * img.shape[1] > 4096 * 4096) continue;  // keep each run fast
      auto small = data::resize_image(img, 5, 7);
      if (small.values.size() != 5 * 7 * img.shape[2]) std::abort();
      auto window = data::crop_image(small, 1, 2, 3, 4);
      data::flip_left_right(window);
    } catch (const data::input_error&) {
    }
  }
  return 0;
}
