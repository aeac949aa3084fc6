#pragma once
// Reads a whole file, gunzipping it when it is gzip (zlib's gzread passes other files through
// unchanged), so that `.gz` and plain copies of a dataset read alike.

#include <distribute/data/error.hpp>

#include <zlib.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

namespace distribute::data::detail {

inline std::vector<std::uint8_t> read_file(const std::filesystem::path& path) {
  const std::string name = path.string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) throw input_error(name, "no such file");
  if (std::filesystem::is_directory(path, ec)) throw input_error(name, "is a directory, not a file");
  gzFile f = gzopen(name.c_str(), "rb");
  if (!f) throw input_error(name, std::string("cannot open: ") + std::strerror(errno));
  gzbuffer(f, 1 << 17);
  std::vector<std::uint8_t> out;
  std::uint8_t chunk[1 << 16];
  for (;;) {
    const int n = gzread(f, chunk, sizeof chunk);
    if (n < 0) {
      int code = 0;
      const std::string why = gzerror(f, &code);
      gzclose(f);
      throw input_error(name, "cannot read: " + why + (code == Z_DATA_ERROR ? " (corrupt gzip data)" : ""));
    }
    out.insert(out.end(), chunk, chunk + n);
    if (n < static_cast<int>(sizeof chunk)) break;
  }
  // A gzip stream cut short reads as a short file without error until gzerror is asked.
  int code = Z_OK;
  const std::string why = gzerror(f, &code);
  gzclose(f);
  if (code != Z_OK && code != Z_STREAM_END)
    throw input_error(name, "cannot read: " + why + (code == Z_BUF_ERROR ? " (the gzip stream is truncated)" : ""));
  return out;
}

}  // namespace distribute::data::detail
