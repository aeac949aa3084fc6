#pragma once
// The safetensors format (Hugging Face's): a little-endian u64 N, N bytes of JSON naming each tensor's
// dtype, shape and [begin, end) byte range in the data that follows, then the data:
//
//   {"__metadata__": {"format": "pt"}, "0.weight": {"dtype": "F32", "shape": [16, 1, 7, 7],
//    "data_offsets": [0, 3136]}, ...}
//
// Reading trusts nothing before it is checked: N against the file's size and a cap, the JSON through
// nlohmann's SAX parser with a handler that accepts only this shape of document (so no document of
// any size becomes a tree in memory, and nesting deeper than the format's is refused at its first
// bracket), every shape's byte count against its range, and the ranges against each other: they must
// tile the data exactly, as the format's own reader demands. Memory is bounded by the header's size;
// the data is read tensor by tensor into buffers the caller sized from its model.

#include <distribute/nn/interop_error.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace distribute::nn::detail::safetensors {

static_assert(std::endian::native == std::endian::little,
              "distribute: safetensors files are little-endian; this reader copies bytes as they are");

// The format's own reader refuses headers over 100 MB; so does this one.
inline constexpr std::uint64_t max_header_bytes = 100'000'000;
inline constexpr std::size_t max_rank = 16;

// Bytes per element of the format's dtypes; 0 for a name it does not have.
inline std::size_t element_size(std::string_view dtype) {
  static constexpr std::array<std::pair<std::string_view, std::size_t>, 16> sizes{{{"BOOL", 1},
                                                                                   {"U8", 1},
                                                                                   {"I8", 1},
                                                                                   {"F8_E5M2", 1},
                                                                                   {"F8_E4M3", 1},
                                                                                   {"I16", 2},
                                                                                   {"U16", 2},
                                                                                   {"F16", 2},
                                                                                   {"BF16", 2},
                                                                                   {"I32", 4},
                                                                                   {"U32", 4},
                                                                                   {"F32", 4},
                                                                                   {"F64", 8},
                                                                                   {"I64", 8},
                                                                                   {"U64", 8},
                                                                                   {"C64", 8}}};
  for (const auto& [name, size] : sizes)
    if (name == dtype) return size;
  return 0;
}

struct tensor_entry {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::uint64_t begin = 0, end = 0;  // within the data, which starts after the header

  std::string shape_text() const {
    std::string s = "[";
    for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
  }
};

struct index {
  std::vector<tensor_entry> tensors;  // in the order of their ranges
  std::uint64_t data_start = 0;       // 8 + N
  std::uint64_t data_size = 0;

  const tensor_entry* find(std::string_view name) const {
    for (const auto& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
};

// Accepts {"__metadata__": {string: string, ...}, name: {"dtype": s, "shape": [u...], "data_offsets": [u, u]}, ...}
// and nothing else; stops at the first token that does not fit, with its reason.
class header_handler : public nlohmann::json_sax<nlohmann::json> {
  using json = nlohmann::json;

 public:
  std::vector<tensor_entry> tensors;
  std::string error;

  bool null() override { return refuse("null"); }
  bool boolean(bool) override { return refuse("a boolean"); }
  bool number_integer(json::number_integer_t v) override {
    if (v < 0) return refuse("a negative number");
    return number(static_cast<std::uint64_t>(v));
  }
  bool number_unsigned(json::number_unsigned_t v) override { return number(v); }
  bool number_float(json::number_float_t, const json::string_t&) override { return refuse("a fraction"); }
  bool binary(json::binary_t&) override { return refuse("binary data"); }
  bool string(json::string_t& s) override {
    if (depth_ == 2 && in_metadata_) return true;
    if (depth_ == 2 && field_ == field::dtype && !seen_dtype_) {
      seen_dtype_ = true;
      tensors.back().dtype = s;
      return true;
    }
    return refuse("a string");
  }
  bool start_object(std::size_t) override {
    if (depth_ == 0) return (depth_ = 1, true);
    if (depth_ == 1) {
      depth_ = 2;
      if (!in_metadata_) {
        tensors.push_back({});
        tensors.back().name = std::move(key_);
        seen_dtype_ = seen_shape_ = seen_offsets_ = false;
      }
      field_ = field::none;
      return true;
    }
    return refuse("an object");
  }
  bool key(json::string_t& k) override {
    if (depth_ == 1) {
      in_metadata_ = k == "__metadata__";
      if (in_metadata_ && seen_metadata_) return fail("__metadata__ appears twice");
      seen_metadata_ = seen_metadata_ || in_metadata_;
      key_ = k;
      return true;
    }
    if (depth_ == 2 && in_metadata_) return true;
    if (depth_ == 2) {
      if (k == "dtype" && !seen_dtype_) field_ = field::dtype;
      else if (k == "shape" && !seen_shape_) field_ = field::shape;
      else if (k == "data_offsets" && !seen_offsets_) field_ = field::offsets;
      else
        return fail("tensor '" + tensors.back().name + "' has " +
                    (k == "dtype" || k == "shape" || k == "data_offsets" ? "a second " : "an unknown field ") + "'" +
                    k + "'");
      return true;
    }
    return refuse("a key");
  }
  bool end_object() override {
    if (depth_ == 2) {
      if (!in_metadata_ && !(seen_dtype_ && seen_shape_ && seen_offsets_))
        return fail("tensor '" + tensors.back().name + "' lacks " +
                    (!seen_dtype_   ? "its dtype"
                     : !seen_shape_ ? "its shape"
                                    : "its data_offsets"));
      in_metadata_ = false;
      return (depth_ = 1, true);
    }
    depth_ = 0;
    return true;
  }
  bool start_array(std::size_t) override {
    if (depth_ == 2 && !in_metadata_ && (field_ == field::shape || field_ == field::offsets)) {
      depth_ = 3;
      count_ = 0;
      return true;
    }
    return refuse("an array");
  }
  bool end_array() override {
    if (field_ == field::shape) {
      seen_shape_ = true;
    } else {
      if (count_ != 2)
        return fail("tensor '" + tensors.back().name + "' has " + std::to_string(count_) + " data_offsets, not 2");
      seen_offsets_ = true;
    }
    field_ = field::none;
    depth_ = 2;
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    if (error.empty())
      error = "malformed JSON at byte " + std::to_string(position) + " of the header (" + e.what() + ")";
    return false;
  }

 private:
  enum class field { none, dtype, shape, offsets };

  bool number(std::uint64_t v) {
    if (depth_ != 3) return refuse("a number");
    auto& t = tensors.back();
    if (field_ == field::shape) {
      if (t.shape.size() == max_rank)
        return fail("tensor '" + t.name + "' has more than " + std::to_string(max_rank) + " dimensions");
      t.shape.push_back(v);
    } else {
      if (count_ == 0) t.begin = v;
      else if (count_ == 1) t.end = v;
    }
    ++count_;
    return true;
  }
  bool refuse(const char* what) {
    std::string where = depth_ == 0    ? "at the top level"
                        : depth_ == 1  ? "as the value of '" + key_ + "' (a tensor's entry is an object)"
                        : in_metadata_ ? "in __metadata__"
                                       : "in tensor '" + tensors.back().name + "'";
    return fail(std::string(what) + " is out of place " + where);
  }
  bool fail(std::string why) {
    if (error.empty()) error = std::move(why);
    return false;
  }

  int depth_ = 0;
  field field_ = field::none;
  bool in_metadata_ = false, seen_metadata_ = false;
  bool seen_dtype_ = false, seen_shape_ = false, seen_offsets_ = false;
  std::size_t count_ = 0;
  std::string key_;
};

[[noreturn]] inline void fail(std::string_view origin, const std::string& why) {
  throw interop_error("distribute: " + std::string(origin) + ": " + why);
}

// The header's tensors, checked against each other and against `data_size` bytes of data.
inline index parse_header(std::string_view json_text, std::uint64_t data_size, std::string_view origin) {
  header_handler h;
  const bool ok =
      nlohmann::json::sax_parse(json_text.begin(), json_text.end(), &h, nlohmann::json::input_format_t::json, true);
  if (!ok || !h.error.empty())
    fail(origin, "not a safetensors header: " + (h.error.empty() ? std::string("malformed JSON") : h.error));
  index ix;
  ix.data_size = data_size;
  ix.tensors = std::move(h.tensors);
  {
    std::map<std::string_view, int> names;
    for (const auto& t : ix.tensors)
      if (!names.emplace(t.name, 0).second) fail(origin, "tensor '" + t.name + "' appears twice in the header");
  }
  for (const auto& t : ix.tensors) {
    const std::size_t width = element_size(t.dtype);
    if (width == 0) fail(origin, "tensor '" + t.name + "' has an unknown dtype '" + t.dtype + "'");
    if (t.begin > t.end)
      fail(origin, "tensor '" + t.name + "' has data_offsets [" + std::to_string(t.begin) + ", " +
                       std::to_string(t.end) + ") that end before they begin");
    if (t.end > data_size)
      fail(origin, "tensor '" + t.name + "' ends at byte " + std::to_string(t.end) + " of the data, past its end (" +
                       std::to_string(data_size) + " bytes: a truncated file?)");
    std::uint64_t bytes = width;
    bool overflow = false;
    for (const auto d : t.shape) overflow = overflow || __builtin_mul_overflow(bytes, d, &bytes);
    if (overflow || bytes != t.end - t.begin)
      fail(origin, "tensor '" + t.name + "' of shape " + t.shape_text() + " and dtype " + t.dtype + " needs " +
                       (overflow ? std::string("over 2^64 bytes") : std::to_string(bytes) + " bytes") +
                       "; its data_offsets give " + std::to_string(t.end - t.begin));
  }
  // The ranges tile the data: sorted by start, each begins where the one before ends.
  std::stable_sort(ix.tensors.begin(), ix.tensors.end(), [](const tensor_entry& a, const tensor_entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t at = 0;
  const tensor_entry* last = nullptr;
  for (const auto& t : ix.tensors) {
    if (t.begin < at)
      fail(origin, "tensor '" + t.name + "' [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                       ") overlaps tensor '" + last->name + "' [" + std::to_string(last->begin) + ", " +
                       std::to_string(last->end) + ")");
    if (t.begin > at)
      fail(origin,
           "bytes [" + std::to_string(at) + ", " + std::to_string(t.begin) + ") of the data belong to no tensor");
    at = t.end;
    last = &t;
  }
  if (at != data_size)
    fail(origin, "bytes [" + std::to_string(at) + ", " + std::to_string(data_size) +
                     ") at the end of the data belong to no tensor");
  return ix;
}

// Where the bytes come from: a file (read piecewise, never whole) or memory (tests, fuzzing).
class file_source {
 public:
  explicit file_source(const std::filesystem::path& path) : origin_{path.string()} {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail(origin_, std::string("cannot open: ") + std::strerror(errno));
    struct ::stat st{};
    if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd_);
      fail(origin_, "not a regular file");
    }
    size_ = static_cast<std::uint64_t>(st.st_size);
  }
  file_source(const file_source&) = delete;
  file_source& operator=(const file_source&) = delete;
  ~file_source() { ::close(fd_); }

  std::uint64_t size() const noexcept { return size_; }
  const std::string& origin() const noexcept { return origin_; }
  void read(std::uint64_t offset, std::span<std::byte> out) const {
    while (!out.empty()) {
      const ::ssize_t n = ::pread(fd_, out.data(), out.size(), static_cast<::off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        fail(origin_, n == 0 ? std::string("the file ended early (changed while read?)")
                             : std::string("cannot read: ") + std::strerror(errno));
      out = out.subspan(static_cast<std::size_t>(n));
      offset += static_cast<std::uint64_t>(n);
    }
  }

 private:
  std::string origin_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
};

class memory_source {
 public:
  memory_source(std::span<const std::byte> bytes, std::string origin) : bytes_{bytes}, origin_{std::move(origin)} {}
  std::uint64_t size() const noexcept { return bytes_.size(); }
  const std::string& origin() const noexcept { return origin_; }
  void read(std::uint64_t offset, std::span<std::byte> out) const {
    if (offset > bytes_.size() || out.size() > bytes_.size() - offset) fail(origin_, "read past the end");
    if (!out.empty()) std::memcpy(out.data(), bytes_.data() + offset, out.size());
  }

 private:
  std::span<const std::byte> bytes_;
  std::string origin_;
};

// The index of a safetensors file: its length prefix and header checked before anything else is read.
template <class Source>
index read_index(const Source& src) {
  const auto& origin = src.origin();
  if (src.size() < 8)
    fail(origin,
         "not a safetensors file: " + std::to_string(src.size()) + " bytes, fewer than the 8 of its header's length");
  std::array<std::byte, 8> prefix{};
  src.read(0, prefix);
  std::uint64_t n = 0;
  std::memcpy(&n, prefix.data(), 8);
  if (n > src.size() - 8)
    fail(origin, "the header's length (" + std::to_string(n) + " bytes) runs past the end of the file (" +
                     std::to_string(src.size()) + " bytes): not a safetensors file, or a truncated one");
  if (n > max_header_bytes)
    fail(origin,
         "a header of " + std::to_string(n) + " bytes, over the format's limit of " + std::to_string(max_header_bytes));
  if (n < 2) fail(origin, "a header of " + std::to_string(n) + " bytes cannot be a JSON object");
  std::string text(static_cast<std::size_t>(n), '\0');
  src.read(8, std::as_writable_bytes(std::span<char>(text)));
  // The format pads the header with trailing spaces to align the data; JSON allows them.
  auto ix = parse_header(text, src.size() - 8 - n, origin);
  ix.data_start = 8 + n;
  return ix;
}

// One tensor to write: its name, dtype, shape and little-endian bytes.
struct tensor_to_write {
  std::string name;
  std::string dtype;
  std::vector<std::uint64_t> shape;
  std::vector<std::byte> bytes;
};

// The file's bytes: the header (padded with spaces to a multiple of 8 bytes, as the format's writer
// does, so that the data starts aligned), then the tensors in the order given.
inline std::vector<std::byte> encode(const std::vector<tensor_to_write>& tensors) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::uint64_t at = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + t.bytes.size()}}};
    at += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::vector<std::byte> out(8 + text.size() + at);
  const std::uint64_t n = text.size();
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  std::size_t pos = 8 + text.size();
  for (const auto& t : tensors) {
    if (!t.bytes.empty()) std::memcpy(out.data() + pos, t.bytes.data(), t.bytes.size());
    pos += t.bytes.size();
  }
  return out;
}

}  // namespace distribute::nn::detail::safetensors
