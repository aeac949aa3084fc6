#pragma once
// How much memory one file from outside may make the input pipeline allocate. Every reader checks
// what a header promises against these limits before it allocates, inflates or decodes, so that a
// small hostile or broken file (a gzip or PNG "bomb", a header promising 16384x16384 pixels) is
// refused in milliseconds instead of exhausting memory. The defaults fit any (Fashion-)MNIST file and
// any photograph a training pipeline resizes; pass larger ones for larger inputs.

#include <cstdint>
#include <string>

namespace distribute::data {

struct input_limits {
  // Bytes of one file after gunzipping: an IDX file, or an encoded image. Fashion-MNIST's largest
  // file has 47 MB.
  std::uint64_t max_file_bytes = std::uint64_t{256} << 20;
  // Bytes of one decoded image, height x width x channels (16 bits a channel count twice): 64 MiB is
  // 4096 x 4096 RGBA. stb_image needs a few times this while it decodes.
  std::uint64_t max_image_bytes = std::uint64_t{64} << 20;
};

namespace detail {
inline std::string mib(std::uint64_t bytes) {
  return bytes % (std::uint64_t{1} << 20) == 0 ? std::to_string(bytes >> 20) + " MiB"
                                               : std::to_string(bytes) + " bytes";
}
}  // namespace detail

}  // namespace distribute::data
