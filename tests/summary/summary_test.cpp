// summary::writer: CRC-32C against published vectors, TFRecord framing against records of a real
// event file, the protobuf encoding against TensorBoard's own classes, PNG through a decoder, grids
// of image tensors read back pixel by pixel, the writer's files, errors and threads, and a round trip
// through TensorBoard's reader.

#include <distribute/summary.hpp>

#if __has_include(<stb/stb_image.h>)
#  include <distribute/data/detail/stb.hpp>  // stb_image, to decode the PNGs
#  define DISTRIBUTE_TEST_HAVE_STB 1
#endif

#include <boost/test/unit_test.hpp>

#include "../shell_command.hpp"

#include <zlib.h>

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace summary = distribute::summary;
namespace detail = distribute::summary::detail;
namespace fs = std::filesystem;
using namespace std::string_literals;

namespace {

std::span<const std::byte> bytes_of(std::string_view s) { return detail::as_bytes(s); }

std::string hex(std::string_view s) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out.empty() ? "-" : out;
}

std::string float_bits(float v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", std::bit_cast<std::uint32_t>(v));
  return buf;
}

// A fresh directory per test, removed afterwards.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("distribute_summary_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

// --- a reader, to check the files without TensorBoard --------------------------------------------

std::uint64_t le(std::string_view s) {
  std::uint64_t v = 0;
  for (std::size_t i = s.size(); i-- > 0;) v = (v << 8) | static_cast<unsigned char>(s[i]);
  return v;
}

// Every record of a TFRecord file; fails the test on a bad CRC or a record cut short.
std::vector<std::string> read_records(const std::string& file) {
  std::vector<std::string> out;
  std::string_view rest = file;
  while (!rest.empty()) {
    BOOST_TEST_REQUIRE(rest.size() >= 12u, "a record header cut short");
    const std::uint64_t length = le(rest.substr(0, 8));
    BOOST_TEST_REQUIRE(le(rest.substr(8, 4)) == detail::masked_crc32c(bytes_of(rest.substr(0, 8))), "the length's CRC");
    BOOST_TEST_REQUIRE(rest.size() >= 16 + length, "a record cut short");
    const std::string_view data = rest.substr(12, length);
    BOOST_TEST_REQUIRE(le(rest.substr(12 + length, 4)) == detail::masked_crc32c(bytes_of(data)), "the data's CRC");
    out.emplace_back(data);
    rest.remove_prefix(16 + length);
  }
  return out;
}

struct field {
  std::uint32_t number = 0;
  int wire = 0;
  std::uint64_t value = 0;  // varint, fixed32, fixed64
  std::string_view bytes;   // length-delimited
};

std::vector<field> decode(std::string_view m) {
  std::vector<field> out;
  auto varint = [&] {
    std::uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      BOOST_TEST_REQUIRE(!m.empty(), "a varint cut short");
      const auto b = static_cast<unsigned char>(m.front());
      m.remove_prefix(1);
      v |= static_cast<std::uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  };
  while (!m.empty()) {
    const std::uint64_t key = varint();
    field f;
    f.number = static_cast<std::uint32_t>(key >> 3);
    f.wire = static_cast<int>(key & 7);
    if (f.wire == 0) f.value = varint();
    else if (f.wire == 1 || f.wire == 5) {
      const std::size_t n = f.wire == 1 ? 8 : 4;
      BOOST_TEST_REQUIRE(m.size() >= n);
      f.value = le(m.substr(0, n));
      m.remove_prefix(n);
    } else {
      BOOST_TEST_REQUIRE(f.wire == 2);
      const std::uint64_t n = varint();
      BOOST_TEST_REQUIRE(m.size() >= n);
      f.bytes = m.substr(0, n);
      m.remove_prefix(n);
    }
    out.push_back(f);
  }
  return out;
}

std::optional<field> find(const std::vector<field>& fs, std::uint32_t number) {
  for (const auto& f : fs)
    if (f.number == number) return f;
  return std::nullopt;
}

struct value {
  std::string tag;
  std::optional<float> scalar;
  std::optional<std::string> text, plugin;
  int height = 0, width = 0, colorspace = 0;
  std::string png;
};
struct event {
  double wall_time = 0;
  std::int64_t step = 0;
  std::string file_version;
  std::vector<value> values;
};

event parse_event(std::string_view record) {
  event e;
  for (const auto& f : decode(record)) {
    if (f.number == 1) e.wall_time = std::bit_cast<double>(f.value);
    else if (f.number == 2) e.step = static_cast<std::int64_t>(f.value);
    else if (f.number == 3) e.file_version = std::string(f.bytes);
    else if (f.number == 5) {
      for (const auto& vf : decode(f.bytes)) {
        value v;
        for (const auto& x : decode(vf.bytes)) {
          if (x.number == 1) v.tag = std::string(x.bytes);
          else if (x.number == 2) v.scalar = std::bit_cast<float>(static_cast<std::uint32_t>(x.value));
          else if (x.number == 4) {
            const auto img = decode(x.bytes);
            v.height = static_cast<int>(find(img, 1)->value);
            v.width = static_cast<int>(find(img, 2)->value);
            v.colorspace = static_cast<int>(find(img, 3)->value);
            v.png = std::string(find(img, 4)->bytes);
          } else if (x.number == 8) {
            const auto t = decode(x.bytes);
            BOOST_TEST(find(t, 1)->value == 7u);  // DT_STRING
            v.text = std::string(find(t, 8)->bytes);
          } else if (x.number == 9) {
            v.plugin = std::string(find(decode(find(decode(x.bytes), 1)->bytes), 1)->bytes);
          }
        }
        e.values.push_back(v);
      }
    }
  }
  return e;
}

std::vector<event> read_events(const fs::path& file) {
  std::vector<event> out;
  for (const auto& r : read_records(read_file(file))) out.push_back(parse_event(r));
  return out;
}

// Test images: every filter of the PNG encoder has something to do on them.
std::vector<std::uint8_t> test_image(int h, int w, int c, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint8_t> px(static_cast<std::size_t>(h) * w * c);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int k = 0; k < c; ++k) {
        const auto i = (static_cast<std::size_t>(y) * w + x) * c + k;
        const int region = (x * 4 / w) + (y * 2 / h) * 4;  // flat, gradients and noise side by side
        switch (region % 4) {
          case 0: px[i] = static_cast<std::uint8_t>(40 * k + 7); break;
          case 1: px[i] = static_cast<std::uint8_t>(x * 3 + k); break;
          case 2: px[i] = static_cast<std::uint8_t>(y * 5 + x + k * 11); break;
          default: px[i] = static_cast<std::uint8_t>(rng()); break;
        }
      }
  return px;
}

}  // namespace

// --- CRC-32C ---------------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(crc32c)

BOOST_AUTO_TEST_CASE(published_vectors) {
  std::string zeros(32, '\0'), ones(32, '\xFF'), ascending(32, '\0');
  for (int i = 0; i < 32; ++i) ascending[static_cast<std::size_t>(i)] = static_cast<char>(i);
  struct vector {
    std::string data;
    std::uint32_t crc;
  };
  const std::vector<vector> vectors{
      {"", 0x00000000u},        {"123456789", 0xE3069283u},  // the CRC catalogue's check value of CRC-32/ISCSI
      {zeros, 0x8A9136AAu},                                  // RFC 3720, B.4: 32 bytes of zeros
      {ones, 0x62A8AB43u},                                   //                32 bytes of 0xFF
      {ascending, 0x46DD794Eu},                              //                0, 1, ..., 31
  };
  for (const auto& v : vectors) {
    BOOST_TEST(detail::crc32c(bytes_of(v.data)) == v.crc, hex(v.data));
    BOOST_TEST(detail::crc32c_extend_table(0, bytes_of(v.data)) == v.crc, hex(v.data));
#ifdef DISTRIBUTE_SUMMARY_CRC32C_SSE42
    if (detail::crc32c_has_sse42()) BOOST_TEST(detail::crc32c_extend_sse42(0, bytes_of(v.data)) == v.crc, hex(v.data));
#endif
  }
  // TensorBoard's data server (tensorboard/data/server/masked_crc.rs): the masked CRC of a record of a
  // real TensorFlow event file, Event(file_version="CRC test, one two").
  BOOST_TEST(detail::masked_crc32c(bytes_of("\x1a\x11"
                                            "CRC test, one two")) == 0x5794D08Au);
  BOOST_TEST(detail::mask_crc(0x8A9136AAu) == (((0x8A9136AAu >> 15) | (0x8A9136AAu << 17)) + 0xA282EAD8u));
}

BOOST_AUTO_TEST_CASE(the_instruction_and_the_table_agree_at_every_length_and_alignment) {
  std::mt19937 rng(7);
  std::string data(300, '\0');
  for (auto& c : data) c = static_cast<char>(rng());
  for (std::size_t offset = 0; offset < 9; ++offset)
    for (std::size_t n = 0; n + offset <= data.size(); n += 1 + n / 8) {
      const auto part = bytes_of(std::string_view(data).substr(offset, n));
      const std::uint32_t table = detail::crc32c_extend_table(0, part);
      BOOST_TEST(detail::crc32c(part) == table);
#ifdef DISTRIBUTE_SUMMARY_CRC32C_SSE42
      if (detail::crc32c_has_sse42()) BOOST_TEST(detail::crc32c_extend_sse42(0, part) == table);
#endif
      // Extending by the second half gives the CRC of the whole.
      const auto first = part.first(n / 2), second = part.subspan(n / 2);
      BOOST_TEST(detail::crc32c_extend(detail::crc32c(first), second) == table);
    }
  BOOST_TEST_MESSAGE(
      "SSE4.2 crc32 instruction: " << (detail::crc32c_has_sse42() ? "used" : "not available, table only"));
}

BOOST_AUTO_TEST_SUITE_END()

// --- TFRecord framing ------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(tfrecord)

// The two records of a real event file written by `tf.summary.scalar("accuracy", 0.99, step=77)`,
// as TensorBoard's data server tests them (tensorboard/data/server/tf_record.rs, test_success).
BOOST_AUTO_TEST_CASE(records_of_a_real_event_file) {
  const std::string data1 =
      "\x09\x00\x00\x80\x38\x99\xd6\xd7\x41\x1a\x0d"
      "brain.Event:2"s;
  const std::string record1 =
      "\x18\x00\x00\x00\x00\x00\x00\x00"
      "\xa3\x7f\x4b\x22"s +
      data1 + "\x12\x4b\x36\xab"s;
  const std::string data2 =
      "\x09\xc4\x05\xb7\x3d\x99\xd6\xd7\x41"
      "\x10\x4d\x2a\x25"
      "\x0a\x23\x0a\x08"
      "accuracy"
      "\x42\x0a\x08\x01\x12\x00\x22\x04\xa4\x70\x7d\x3f\x4a"
      "\x0b\x0a\x09\x0a\x07"
      "scalars"s;
  const std::string record2 =
      "\x32\x00\x00\x00\x00\x00\x00\x00"
      "\x24\x19\x56\xec"s +
      data2 + "\xa5\x5b\x64\x33"s;
  std::string framed;
  detail::append_record(framed, data1);
  BOOST_TEST(hex(framed) == hex(record1));
  detail::append_record(framed, data2);
  BOOST_TEST(hex(framed) == hex(record1 + record2));
  // The first record is the version event; the encoder writes the same bytes for its wall time.
  BOOST_TEST(hex(detail::version_event(std::bit_cast<double>(0x41D7D69938800000ull))) == hex(data1));
  BOOST_TEST(read_records(framed) == (std::vector<std::string>{data1, data2}));
}

BOOST_AUTO_TEST_CASE(an_empty_record) {
  std::string framed;
  detail::append_record(framed, "");
  BOOST_TEST(framed.size() == 16u);
  BOOST_TEST(le(std::string_view(framed).substr(8, 4)) == detail::masked_crc32c(bytes_of(std::string(8, '\0'))));
  BOOST_TEST(le(std::string_view(framed).substr(12, 4)) == detail::mask_crc(0));
}

BOOST_AUTO_TEST_SUITE_END()

// --- the protobuf encoding --------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(protobuf)

// The expected bytes are what TensorBoard 2.21.0's own classes serialise for the same messages
// (tensorboard.compat.proto summary_pb2 and event_pb2 under protobuf 7.36.2, and
// tensorboard.plugins.text.summary_v2.text_pb for the text).
BOOST_AUTO_TEST_CASE(as_tensorboard_serialises_them) {
  detail::message two_scalars;
  two_scalars.nested(1, detail::scalar_value("loss/total", 0.25f)).nested(1, detail::scalar_value("zero", 0.0f));
  BOOST_TEST(hex(two_scalars.encoded()) == "0a110a0a6c6f73732f746f74616c150000803e0a0b0a047a65726f1500000000");

  BOOST_TEST(hex(detail::summary_of(detail::text_value("t", "hello")).encoded()) ==
             "0a1a0a0174420b08071200420568656c6c6f4a080a060a0474657874");

  const auto image = detail::image_value("img", 2, 3, 3, "\x89PNG");
  BOOST_TEST(hex(detail::summary_of(image).encoded()) == "0a130a03696d67220c080210031803220489504e47");
  BOOST_TEST(hex(detail::summary_event(1700000000.5, -3, image)) ==
             "0900002040fc54d94110fdffffffffffffffff012a150a130a03696d67220c080210031803220489504e47");

  BOOST_TEST(hex(detail::version_event(1700000000.5)) == "0900002040fc54d9411a0d627261696e2e4576656e743a32");
  // A step of 0 is proto3's default and left out, as protobuf does.
  BOOST_TEST(hex(detail::event_header(1.25, 300).encoded()) == "09000000000000f43f10ac02");
  BOOST_TEST(hex(detail::event_header(1.25, 0).encoded()) == "09000000000000f43f");
}

BOOST_AUTO_TEST_CASE(varints) {
  const std::vector<std::pair<std::uint64_t, std::string>> cases{
      {0, "00"},
      {1, "01"},
      {127, "7f"},
      {128, "8001"},
      {300, "ac02"},
      {16384, "808001"},
      {std::numeric_limits<std::uint64_t>::max(), "ffffffffffffffffff01"}};
  for (const auto& [v, want] : cases) {
    std::string out;
    detail::append_varint(out, v);
    BOOST_TEST(hex(out) == want, v);
  }
  // A long string's length takes several bytes.
  detail::message m;
  m.bytes(1, std::string(200, 'x'));
  BOOST_TEST(hex(m.encoded().substr(0, 3)) == "0ac801");
}

BOOST_AUTO_TEST_SUITE_END()

// --- PNG -------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(png)

BOOST_AUTO_TEST_CASE(decodes_to_the_same_pixels) {
  struct shape {
    int h, w, c;
  };
  for (const shape s : {shape{1, 1, 1}, shape{1, 1, 3}, shape{2, 3, 4}, shape{17, 23, 1}, shape{31, 64, 3},
                        shape{40, 9, 4}, shape{3, 200, 3}}) {
    BOOST_TEST_CONTEXT(s.h << "x" << s.w << "x" << s.c) {
      const auto px = test_image(s.h, s.w, s.c, static_cast<unsigned>(s.h * 1000 + s.w * 10 + s.c));
      const std::string png = detail::encode_png(s.h, s.w, s.c, px.data());
      BOOST_TEST(png.substr(0, 8) == "\x89PNG\r\n\x1a\n"s);
      BOOST_TEST(png.substr(12, 4) == "IHDR");
      BOOST_TEST(png.substr(png.size() - 12) == "\0\0\0\0IEND\xae\x42\x60\x82"s);
#ifdef DISTRIBUTE_TEST_HAVE_STB
      int w = 0, h = 0, c = 0;
      stbi_uc* decoded = stbi_load_from_memory(reinterpret_cast<const stbi_uc*>(png.data()),
                                               static_cast<int>(png.size()), &w, &h, &c, 0);
      BOOST_TEST_REQUIRE(decoded != nullptr, stbi_failure_reason());
      BOOST_TEST(w == s.w);
      BOOST_TEST(h == s.h);
      BOOST_TEST(c == s.c);
      BOOST_TEST(std::equal(px.begin(), px.end(), decoded));
      stbi_image_free(decoded);
#endif
    }
  }
}

BOOST_AUTO_TEST_CASE(rows_take_different_filters) {
  const int h = 64, w = 64, c = 3;
  const auto px = test_image(h, w, c, 3);
  const std::string png = detail::encode_png(h, w, c, px.data());
  // The one IDAT chunk's zlib stream, inflated: each row starts with its filter type.
  const std::size_t idat = png.find("IDAT");
  BOOST_TEST_REQUIRE(idat != std::string::npos);
  std::size_t length = 0;  // big-endian, before the chunk's type
  for (std::size_t i = idat - 4; i < idat; ++i) length = (length << 8) | static_cast<unsigned char>(png[i]);
  std::vector<std::uint8_t> raw(static_cast<std::size_t>(h) * (w * c + 1));
  uLongf raw_size = static_cast<uLongf>(raw.size());
  BOOST_TEST_REQUIRE(::uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(png.data() + idat + 4),
                                  static_cast<uLong>(length)) == Z_OK);
  BOOST_TEST(raw_size == raw.size());
  std::set<int> filters;
  for (int y = 0; y < h; ++y) filters.insert(raw[static_cast<std::size_t>(y) * (w * c + 1)]);
  BOOST_TEST(filters.size() >= 3u, "filters used: " << filters.size());
  for (int f : filters) BOOST_TEST(f <= 4);
}

BOOST_AUTO_TEST_SUITE_END()

// --- PNG grids of image tensors ------------------------------------------------------------------

namespace {

// A PNG read back with zlib alone: every chunk's CRC checked, the IDAT chunks inflated and each row
// unfiltered (the encoder picks one of the five filters per row).
struct decoded_png {
  std::uint32_t width = 0, height = 0;
  int bit_depth = 0, colour_type = 0, channels = 0;
  std::vector<std::uint8_t> pixels;  // HWC
  std::uint8_t at(std::uint32_t y, std::uint32_t x, int ch) const {
    return pixels[(static_cast<std::size_t>(y) * width + x) * static_cast<std::size_t>(channels) +
                  static_cast<std::size_t>(ch)];
  }
};

std::uint32_t be32(std::string_view s, std::size_t at) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < 4; ++i) v = (v << 8) | static_cast<unsigned char>(s[at + i]);
  return v;
}

decoded_png decode_png(const std::string& png) {
  decoded_png d;
  BOOST_TEST_REQUIRE(png.size() > 8u);
  BOOST_TEST_REQUIRE(png.substr(0, 8) == "\x89PNG\r\n\x1a\n"s);
  std::string idat;
  for (std::size_t at = 8; at + 12 <= png.size();) {
    const std::uint32_t length = be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    BOOST_TEST_REQUIRE(at + 12 + length <= png.size());
    const uLong crc = ::crc32(0L, reinterpret_cast<const Bytef*>(png.data() + at + 4), length + 4);
    BOOST_TEST(be32(png, at + 8 + length) == crc, type << " chunk CRC");
    const std::string data = png.substr(at + 8, length);
    if (type == "IHDR") {
      BOOST_TEST_REQUIRE(length == 13u);
      d.width = be32(data, 0);
      d.height = be32(data, 4);
      d.bit_depth = data[8];
      d.colour_type = data[9];
      BOOST_TEST(data.substr(10) == "\0\0\0"s);  // deflate, adaptive filters, no interlace
    } else if (type == "IDAT") {
      idat += data;
    }
    at += 12 + length;
  }
  BOOST_TEST_REQUIRE((d.colour_type == 0 || d.colour_type == 2));
  d.channels = d.colour_type == 0 ? 1 : 3;
  const std::size_t stride = static_cast<std::size_t>(d.width) * static_cast<std::size_t>(d.channels);
  std::vector<std::uint8_t> raw(d.height * (stride + 1));
  uLongf raw_size = static_cast<uLongf>(raw.size());
  BOOST_TEST_REQUIRE(::uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()),
                                  static_cast<uLong>(idat.size())) == Z_OK);
  BOOST_TEST_REQUIRE(raw_size == raw.size());
  d.pixels.resize(d.height * stride);
  const auto bpp = static_cast<std::size_t>(d.channels);
  for (std::size_t y = 0; y < d.height; ++y) {
    const std::uint8_t filter = raw[y * (stride + 1)];
    const std::uint8_t* in = raw.data() + y * (stride + 1) + 1;
    std::uint8_t* row = d.pixels.data() + y * stride;
    const std::uint8_t* up = y > 0 ? row - stride : nullptr;
    for (std::size_t i = 0; i < stride; ++i) {
      const int a = i >= bpp ? row[i - bpp] : 0, b = up ? up[i] : 0, c = up && i >= bpp ? up[i - bpp] : 0;
      int predicted = 0;
      switch (filter) {
        case 0: break;
        case 1: predicted = a; break;
        case 2: predicted = b; break;
        case 3: predicted = (a + b) / 2; break;
        case 4: {
          const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
          predicted = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
          break;
        }
        default: BOOST_FAIL("row " << y << " has filter " << int{filter});
      }
      row[i] = static_cast<std::uint8_t>(in[i] + predicted);
    }
  }
  return d;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(png_grid)

BOOST_AUTO_TEST_CASE(an_rgb_grid_lands_where_expected_with_its_padding) {
  // 5 images of 3 channels, 2x3 pixels, in 2 rows: 3 columns, the sixth cell empty.
  const int n = 5, c = 3, h = 2, w = 3;
  distribute::tensor<float> images{distribute::shape::nchw(n, c, h, w)};
  // A value per (image, channel, row, column), each a distinct byte once mapped from [-1, 1].
  auto value = [](int i, int ch, int y, int x) {
    return -0.9f + 0.05f * static_cast<float>(i * 7 + ch * 5 + y * 3 + x);
  };
  for (int i = 0; i < n; ++i)
    for (int ch = 0; ch < c; ++ch)
      for (int y = 0; y < h; ++y)
        for (int x = 0; x < w; ++x) images(i, ch, y, x) = value(i, ch, y, x);
  // Outside the range: clamped; NaN: 0.
  images(0, 0, 0, 0) = 3.0f;
  images(0, 1, 0, 0) = -7.0f;
  images(0, 2, 0, 0) = std::numeric_limits<float>::quiet_NaN();
  images(4, 0, 1, 2) = 1.0f;
  images(4, 1, 1, 2) = -1.0f;
  images(4, 2, 1, 2) = 0.0f;

  temp_dir d;
  fs::create_directories(d.path);
  const fs::path file = d.path / "grid.png";
  summary::write_png_grid(file, images, 2,
                          {.range = summary::value_range::minus_one_to_one, .padding = 1, .padding_value = 77});
  BOOST_TEST(files_in(d.path) == std::vector<fs::path>{file});  // nothing left beside it
  const decoded_png png = decode_png(read_file(file));
  BOOST_TEST(png.width == 3u * 3 + 4);  // 3 columns of 3, 4 paddings of 1
  BOOST_TEST(png.height == 2u * 2 + 3);
  BOOST_TEST(png.bit_depth == 8);
  BOOST_TEST(png.colour_type == 2);  // RGB

  auto byte_of = [](float v) { return static_cast<int>(std::floor((v + 1.0) / 2.0 * 255.0 + 0.5)); };
  // Every pixel: inside a cell the image's value, elsewhere (frame, gaps, the empty sixth cell) padding.
  for (std::uint32_t gy = 0; gy < png.height; ++gy)
    for (std::uint32_t gx = 0; gx < png.width; ++gx) {
      const int cy = static_cast<int>(gy) - 1, cx = static_cast<int>(gx) - 1;  // past the frame
      const int row = cy / (h + 1), y = cy % (h + 1), col = cx / (w + 1), x = cx % (w + 1);
      const int i = row * 3 + col;
      const bool inside = cy >= 0 && cx >= 0 && y < h && x < w && row < 2 && col < 3 && i < n;
      for (int ch = 0; ch < c; ++ch) {
        const int expected = !inside                           ? 77
                             : std::isnan(images(i, ch, y, x)) ? 0
                                                               : std::clamp(byte_of(images(i, ch, y, x)), 0, 255);
        BOOST_TEST(int{png.at(gy, gx, ch)} == expected, "pixel (" << gy << ", " << gx << ") channel " << ch);
      }
    }
  // The same, spelled out at a few places.
  BOOST_TEST(int{png.at(0, 0, 0)} == 77);                          // the frame
  BOOST_TEST(int{png.at(1, 1, 0)} == 255);                         // image 0's first pixel: 3 clamped to 1
  BOOST_TEST(int{png.at(1, 1, 1)} == 0);                           // -7 clamped to -1
  BOOST_TEST(int{png.at(1, 1, 2)} == 0);                           // NaN
  BOOST_TEST(int{png.at(1, 4, 0)} == 77);                          // the gap between images 0 and 1
  BOOST_TEST(int{png.at(1, 5, 0)} == byte_of(value(1, 0, 0, 0)));  // image 1's first pixel
  BOOST_TEST(int{png.at(3, 1, 0)} == 77);                          // the gap between the rows
  BOOST_TEST(int{png.at(5, 7, 0)} == 255);                         // image 4 (row 1, column 1), pixel (1, 2)
  BOOST_TEST(int{png.at(5, 7, 1)} == 0);
  BOOST_TEST(int{png.at(5, 7, 2)} == 128);  // 0 is the middle: round(127.5)
  BOOST_TEST(int{png.at(4, 9, 0)} == 77);   // the empty sixth cell
  BOOST_TEST(int{png.at(5, 11, 2)} == 77);
}

BOOST_AUTO_TEST_CASE(a_grey_grid_of_doubles_in_zero_to_one) {
  // 3 images of 1 channel, 4x2 pixels, in 3 rows of one column, the default padding of 2, black.
  distribute::tensor<double> images{distribute::shape::nchw(3, 1, 4, 2)};
  for (std::size_t k = 0; k < images.size(); ++k) images[k] = static_cast<double>(k) / 23.0;
  images[0] = -0.5;  // clamped to 0
  images[1] = 1.5;   // clamped to 1
  temp_dir d;
  fs::create_directories(d.path);
  summary::write_png_grid(d.path / "grey.png", images, 3);
  const decoded_png png = decode_png(read_file(d.path / "grey.png"));
  BOOST_TEST(png.colour_type == 0);  // grey
  BOOST_TEST(png.width == 2u + 2 * 2);
  BOOST_TEST(png.height == 3u * 4 + 4 * 2);
  for (int i = 0; i < 3; ++i)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 2; ++x) {
        const double v = std::clamp(images(i, 0, y, x), 0.0, 1.0);
        const auto gy = static_cast<std::uint32_t>(2 + i * 6 + y), gx = static_cast<std::uint32_t>(2 + x);
        BOOST_TEST(int{png.at(gy, gx, 0)} == static_cast<int>(std::floor(v * 255.0 + 0.5)));
      }
  BOOST_TEST(int{png.at(2, 2, 0)} == 0);
  BOOST_TEST(int{png.at(2, 3, 0)} == 255);
  for (const std::uint32_t y : {0u, 1u, 6u, 7u, 12u, 13u, 18u, 19u})
    for (std::uint32_t x = 0; x < png.width; ++x) BOOST_TEST(int{png.at(y, x, 0)} == 0, "padding row " << y);

  // make_image_grid gives the same pixels, for summary::writer::image.
  const auto g = summary::make_image_grid(images, 3);
  BOOST_TEST(g.height == 20);
  BOOST_TEST(g.width == 6);
  BOOST_TEST(g.channels == 1);
  BOOST_TEST(g.pixels == png.pixels);
}

BOOST_AUTO_TEST_CASE(bad_arguments_and_paths_are_named) {
  using distribute::shape;
  auto error = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const std::invalid_argument& e) {
      return "invalid_argument: "s + e.what();
    } catch (const summary::summary_error& e) {
      return "summary_error: "s + e.what();
    }
    return "no error";
  };
  temp_dir d;
  fs::create_directories(d.path);
  const fs::path file = d.path / "g.png";
  const distribute::tensor<float> four{shape::nchw(4, 3, 2, 2)};
  BOOST_TEST(error([&] { summary::write_png_grid(file, distribute::tensor<float>{shape{4, 3, 2}}, 1); }) ==
             "invalid_argument: distribute: summary::write_png_grid: images of shape (4, 3, 2): expected [N, C, H, W] "
             "(rank 4)");
  BOOST_TEST(error([&] { summary::write_png_grid(file, distribute::tensor<float>{shape::nchw(4, 2, 2, 2)}, 1); }) ==
             "invalid_argument: distribute: summary::write_png_grid: images of shape (4, 2, 2, 2): 2 channels "
             "(accepted: 1 grey, 3 RGB)");
  BOOST_TEST(error([&] { summary::make_image_grid(distribute::tensor<double>{shape::nchw(1, 4, 2, 2)}, 1); }) ==
             "invalid_argument: distribute: summary::make_image_grid: images of shape (1, 4, 2, 2): 4 channels "
             "(accepted: 1 grey, 3 RGB)");
  BOOST_TEST(error([&] { summary::write_png_grid(file, four, 0); }) ==
             "invalid_argument: distribute: summary::write_png_grid: images of shape (4, 3, 2, 2): rows is 0 but must "
             "be in [1, 4] (the image count)");
  BOOST_TEST(error([&] { summary::write_png_grid(file, four, 5); }) ==
             "invalid_argument: distribute: summary::write_png_grid: images of shape (4, 3, 2, 2): rows is 5 but must "
             "be in [1, 4] (the image count)");
  BOOST_TEST(error([&] { summary::write_png_grid(file, four, 2, {.padding = -1}); }) ==
             "invalid_argument: distribute: summary::write_png_grid: images of shape (4, 3, 2, 2): padding is -1 but "
             "must be at least 0");
  BOOST_TEST(error([&] { summary::write_png_grid(file, distribute::tensor<float>{shape::nchw(2, 3, 0, 2)}, 1); }) ==
             "invalid_argument: distribute: summary::write_png_grid: images of shape (2, 3, 0, 2): no pixels");
  BOOST_TEST(!fs::exists(file));
  // A path in a directory that does not exist, and a path that is a directory.
  const fs::path missing = d.path / "no" / "such" / "g.png";
  BOOST_TEST(error([&] { summary::write_png_grid(missing, four, 2); }) ==
             "summary_error: distribute: summary::write_png_grid: cannot write " + missing.string() +
                 ": No such file or directory");
  fs::create_directories(d.path / "dir.png");
  const std::string e = error([&] { summary::write_png_grid(d.path / "dir.png", four, 2); });
  BOOST_TEST(e.starts_with("summary_error: distribute: summary::write_png_grid: cannot write " +
                           (d.path / "dir.png").string() + ": "),
             e);
  BOOST_TEST(files_in(d.path) == std::vector<fs::path>{d.path / "dir.png"});  // no partial file left
  // Written where it can be, padding 0 included.
  summary::write_png_grid(file, four, 4, {.padding = 0});
  const decoded_png png = decode_png(read_file(file));
  BOOST_TEST(png.width == 2u);
  BOOST_TEST(png.height == 8u);
}

BOOST_AUTO_TEST_SUITE_END()

// --- the writer -------------------------------------------------------------------------------------

BOOST_AUTO_TEST_SUITE(writer)

BOOST_AUTO_TEST_CASE(creates_its_directory_and_a_file_named_as_tensorflow_does) {
  temp_dir t;
  const fs::path dir = t.path / "runs" / "exp1";
  {
    summary::writer w(dir);
    BOOST_TEST(w.enabled());
    BOOST_TEST(w.file().parent_path() == dir);
    // events.out.tfevents.<unix time>.<host>.<pid>.<n>
    const std::string name = w.file().filename().string();
    BOOST_TEST(name.rfind("events.out.tfevents.", 0) == 0u, name);
    const long long t0 = std::stoll(name.substr(20, name.find('.', 20) - 20));
    BOOST_TEST(std::abs(t0 - static_cast<long long>(std::time(nullptr))) < 60);
    BOOST_TEST(name.find("." + std::to_string(::getpid()) + ".") != std::string::npos, name);
    // The version record is in the file from the start.
    const auto events = read_events(w.file());
    BOOST_TEST_REQUIRE(events.size() == 1u);
    BOOST_TEST(events[0].file_version == "brain.Event:2");
    BOOST_TEST(std::abs(events[0].wall_time - static_cast<double>(std::time(nullptr))) < 60);
    w.scalar("a", 1.5, 7);
  }
  const auto files = files_in(dir);
  BOOST_TEST_REQUIRE(files.size() == 1u);
  const auto events = read_events(files[0]);  // the destructor flushed
  BOOST_TEST_REQUIRE(events.size() == 2u);
  BOOST_TEST(events[1].step == 7);
  BOOST_TEST_REQUIRE(events[1].values.size() == 1u);
  BOOST_TEST(events[1].values[0].tag == "a");
  BOOST_TEST(*events[1].values[0].scalar == 1.5f);
}

BOOST_AUTO_TEST_CASE(two_writers_never_share_a_file) {
  temp_dir t;
  summary::writer a(t.path), b(t.path);
  BOOST_TEST(a.file() != b.file());
  BOOST_TEST(files_in(t.path).size() == 2u);
}

BOOST_AUTO_TEST_CASE(every_kind_of_value_reads_back) {
  temp_dir t;
  const auto rgb = test_image(5, 7, 3, 1), grey = test_image(9, 4, 1, 2);
  fs::path file;
  {
    summary::writer w(t.path);
    file = w.file();
    w.scalar("loss", 0.5, 1);
    w.scalar("loss", std::numeric_limits<double>::quiet_NaN(), 2);
    w.scalar("loss", 1e300, 3);  // beyond float: infinity
    w.image("rgb", 4, 5, 7, 3, rgb.data());
    w.image("grey", 5, 9, 4, 1, grey.data());
    w.text("notes", "hello *world*", -6);
  }
  const auto events = read_events(file);
  BOOST_TEST_REQUIRE(events.size() == 7u);
  BOOST_TEST(*events[1].values[0].scalar == 0.5f);
  BOOST_TEST(std::isnan(*events[2].values[0].scalar));
  BOOST_TEST(*events[3].values[0].scalar == std::numeric_limits<float>::infinity());
  const auto& img = events[4].values[0];
  BOOST_TEST(img.tag == "rgb");
  BOOST_TEST(img.height == 5);
  BOOST_TEST(img.width == 7);
  BOOST_TEST(img.colorspace == 3);
  BOOST_TEST(img.png == detail::encode_png(5, 7, 3, rgb.data()));
  BOOST_TEST(events[5].values[0].colorspace == 1);
  BOOST_TEST(events[6].step == -6);
  BOOST_TEST(*events[6].values[0].text == "hello *world*");
  BOOST_TEST(*events[6].values[0].plugin == "text");
  for (std::size_t i = 1; i < events.size(); ++i) BOOST_TEST(events[i].wall_time >= events[i - 1].wall_time);
}

BOOST_AUTO_TEST_CASE(records_wait_in_memory_until_a_flush) {
  temp_dir t;
  summary::writer w(t.path, {.flush_interval = std::chrono::hours(1)});
  const auto empty_size = fs::file_size(w.file());
  w.scalar("x", 1, 1);
  BOOST_TEST(fs::file_size(w.file()) == empty_size);
  w.flush();
  BOOST_TEST(fs::file_size(w.file()) > empty_size);
  // A full buffer is written without a flush.
  summary::writer small(t.path, {.flush_interval = std::chrono::hours(1), .max_buffered = 100});
  const auto before = fs::file_size(small.file());
  for (int i = 0; i < 5; ++i) small.scalar("x", i, i);
  BOOST_TEST(fs::file_size(small.file()) > before);
  // An interval of zero writes every record at once.
  summary::writer eager(t.path, {.flush_interval = std::chrono::milliseconds(0)});
  eager.text("t", "x", 0);
  BOOST_TEST(read_events(eager.file()).size() == 2u);
}

BOOST_AUTO_TEST_CASE(a_disabled_writer_writes_nothing_but_checks_its_arguments) {
  temp_dir t;
  summary::writer w = summary::writer::disabled();
  BOOST_TEST(!w.enabled());
  BOOST_TEST(w.file().empty());
  const std::uint8_t px[3] = {1, 2, 3};
  w.scalar("a", 1, 1);
  w.image("b", 1, 1, 1, 3, px);
  w.text("c", "x", 1);
  w.flush();
  w.close();
  BOOST_CHECK_THROW(w.scalar("", 1, 1), std::invalid_argument);
  BOOST_CHECK_THROW(w.image("b", 1, 0, 1, 3, px), std::invalid_argument);
  // The pattern of a multi-worker program: only the chief writes.
  for (const bool chief : {false, true}) {
    summary::writer x = chief ? summary::writer(t.path) : summary::writer::disabled();
    x.scalar("a", 1, 1);
  }
  BOOST_TEST(files_in(t.path).size() == 1u);
  // Moved from, a writer is disabled; assigned to, it closes its own file first.
  summary::writer a(t.path / "m");
  summary::writer b = std::move(a);
  BOOST_TEST(!a.enabled());  // NOLINT(bugprone-use-after-move): moved-from state is specified
  b.scalar("kept", 3, 3);
  b = summary::writer::disabled();
  const auto events = read_events(files_in(t.path / "m").at(0));
  BOOST_TEST(events.size() == 2u);
}

namespace {
template <class F>
std::string invalid_argument_message(F&& f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(no std::invalid_argument)";
}
bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }
}  // namespace

BOOST_AUTO_TEST_CASE(bad_arguments_are_named) {
  temp_dir t;
  summary::writer w(t.path);
  const std::vector<std::uint8_t> px(64, 9);
  std::string m = invalid_argument_message([&] { w.scalar("", 1, 1); });
  BOOST_TEST((contains(m, "scalar") && contains(m, "tag is empty")), m);
  m = invalid_argument_message([&] { w.text("", "x", 1); });
  BOOST_TEST((contains(m, "text") && contains(m, "tag is empty")), m);
  m = invalid_argument_message([&] { w.image("", 1, 1, 1, 1, px.data()); });
  BOOST_TEST((contains(m, "image") && contains(m, "tag is empty")), m);
  m = invalid_argument_message([&] { w.image("pic", 1, 0, 4, 3, px.data()); });
  BOOST_TEST((contains(m, "'pic'") && contains(m, "0x4 pixels")), m);
  m = invalid_argument_message([&] { w.image("pic", 1, 4, -2, 3, px.data()); });
  BOOST_TEST(contains(m, "4x-2"), m);
  for (int c : {0, 2, 5}) {
    m = invalid_argument_message([&] { w.image("pic", 1, 2, 2, c, px.data()); });
    BOOST_TEST(contains(m, std::to_string(c) + " channels (accepted: 1 grey, 3 RGB, 4 RGBA)"), m);
  }
  m = invalid_argument_message([&] { w.image("pic", 1, 2, 2, 3, nullptr); });
  BOOST_TEST(contains(m, "null pointer"), m);
  m = invalid_argument_message([&] { w.image("pic", 1, 1 << 30, 1 << 30, 4, px.data()); });
  BOOST_TEST(contains(m, "too large"), m);
  m = invalid_argument_message([&] { w.image("pic", 1, (1 << 15) + 1, 1 << 15, 1, px.data()); });  // just past 1 GiB
  BOOST_TEST(contains(m, "32769x32768x1 bytes is too large"), m);
  m = invalid_argument_message([&] { w.scalar("bad \xff tag", 1, 1); });
  BOOST_TEST(contains(m, "not valid UTF-8"), m);
  m = invalid_argument_message([&] { w.text("t", "\xc0\xaf", 1); });  // an overlong '/'
  BOOST_TEST(contains(m, "text is not valid UTF-8"), m);
  // Well-formed UTF-8 of every length passes; surrogates and code points past U+10FFFF do not.
  BOOST_TEST(detail::valid_utf8("a \xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x99\x82"));
  BOOST_TEST(!detail::valid_utf8("\xed\xa0\x80"));
  BOOST_TEST(!detail::valid_utf8("\xf4\x90\x80\x80"));
  BOOST_TEST(!detail::valid_utf8("\xe2\x9c"));
  // Nothing of the refused calls reached the file.
  w.close();
  BOOST_TEST(read_events(files_in(t.path).at(0)).size() == 1u);
}

BOOST_AUTO_TEST_CASE(a_directory_that_cannot_be_made_is_named) {
  temp_dir t;
  fs::create_directories(t.path);
  std::ofstream(t.path / "plain_file") << "x";
  try {
    summary::writer w(t.path / "plain_file" / "run");
    BOOST_FAIL("no summary_error");
  } catch (const summary::summary_error& e) {
    const std::string m = e.what();
    BOOST_TEST(contains(m, "cannot create the directory " + (t.path / "plain_file" / "run").string()), m);
    BOOST_TEST(contains(m, std::strerror(ENOTDIR)), m);
  }
}

// A write that fails (here: past the file size limit, as on a full disk) names the file and the
// system's reason; the file is cut back to its last whole record and the writer carries on.
BOOST_AUTO_TEST_CASE(a_failed_write_is_named_and_the_file_stays_readable) {
  temp_dir t;
  summary::writer w(t.path, {.flush_interval = std::chrono::hours(1)});
  w.scalar("before", 1, 1);
  w.flush();
  const auto good_size = fs::file_size(w.file());

  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit old_limit{};
  ::getrlimit(RLIMIT_FSIZE, &old_limit);
  rlimit limit = old_limit;
  limit.rlim_cur = static_cast<rlim_t>(good_size + 1000);
  BOOST_TEST_REQUIRE(::setrlimit(RLIMIT_FSIZE, &limit) == 0);
  const auto noise = test_image(64, 64, 3, 9);  // about 12 KB of PNG: past the limit
  w.image("too_big", 2, 64, 64, 3, noise.data());
  std::string message;
  try {
    w.flush();
  } catch (const summary::summary_error& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old_limit);
  std::signal(SIGXFSZ, old_handler);
  BOOST_TEST(contains(message, "cannot write the TensorBoard events file " + w.file().string()), message);
  BOOST_TEST(contains(message, std::strerror(EFBIG)), message);
  BOOST_TEST(fs::file_size(w.file()) == good_size);

  w.scalar("after", 3, 3);
  w.close();
  const auto events = read_events(w.file());
  BOOST_TEST_REQUIRE(events.size() == 3u);
  BOOST_TEST(events[1].values[0].tag == "before");
  BOOST_TEST(events[2].values[0].tag == "after");
  // A closed writer refuses further records.
  try {
    w.scalar("late", 1, 1);
    BOOST_FAIL("no summary_error");
  } catch (const summary::summary_error& e) {
    BOOST_TEST(contains(e.what(), "is closed"), e.what());
  }
  w.close();  // a second close does nothing
}

BOOST_AUTO_TEST_CASE(threads_share_one_writer) {
  temp_dir t;
  const int threads = 4, per_thread = 300;
  fs::path file;
  {
    summary::writer w(t.path, {.flush_interval = std::chrono::milliseconds(1), .max_buffered = 4096});
    file = w.file();
    std::vector<std::thread> pool;
    for (int k = 0; k < threads; ++k)
      pool.emplace_back([&, k] {
        const std::uint8_t px[4] = {static_cast<std::uint8_t>(k), 1, 2, 3};
        for (int i = 0; i < per_thread; ++i) {
          w.scalar("thread" + std::to_string(k), i, i);
          if (i % 50 == 0) w.image("img" + std::to_string(k), i, 1, 1, 4, px);
          if (i % 100 == 0) w.flush();
        }
      });
    for (auto& th : pool) th.join();
  }
  const auto events = read_events(file);
  BOOST_TEST(events.size() == static_cast<std::size_t>(1 + threads * (per_thread + per_thread / 50)));
  std::vector<int> next(threads, 0);
  for (std::size_t i = 1; i < events.size(); ++i) {
    const auto& v = events[i].values.at(0);
    if (v.tag.rfind("thread", 0) != 0) continue;
    const int k = std::stoi(v.tag.substr(6));
    BOOST_TEST(*v.scalar ==
               static_cast<float>(next[static_cast<std::size_t>(k)]));  // each thread's records in its order
    BOOST_TEST(events[i].step == next[static_cast<std::size_t>(k)]++);
  }
}

BOOST_AUTO_TEST_SUITE_END()

// --- the round trip through TensorBoard's reader ----------------------------------------------------

namespace {

using distribute::test::command_result;
using distribute::test::run_command;
using distribute::test::shell_quoted;

command_result run_reader(const std::string& python, const fs::path& file) {
  return run_command(shell_quoted(python) + " " + shell_quoted(DISTRIBUTE_SUMMARY_READER) + " " +
                     shell_quoted(file.string()));
}

// The Python of the virtual environment scripts/setup.sh creates. Its absence skips the test only
// where setup.sh could not install it (it leaves a note saying why); anywhere else it is a failure.
std::string tensorboard_python() {
  const fs::path venv = DISTRIBUTE_TENSORBOARD_VENV;
  const fs::path python = venv / "bin" / "python";
  if (fs::exists(python)) return python.string();
  fs::path note = venv;
  note += ".unavailable";
  if (fs::exists(note)) {
    std::printf("SKIPPED: TensorBoard's reader could not be installed on this machine (%s): %s\n", note.c_str(),
                read_file(note).c_str());
    std::fflush(stdout);
    std::exit(77);
  }
  BOOST_FAIL(
      python.string() << " is missing: scripts/setup.sh creates it (configure with -DDISTRIBUTE_TENSORBOARD_VENV=DIR "
                         "for another place)");
  return {};
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(round_trip)

BOOST_AUTO_TEST_CASE(tensorboard_reads_back_every_value) {
  const std::string python = tensorboard_python();
  temp_dir t;
  std::vector<std::string> expected{"version brain.Event:2"};
  fs::path file;
  {
    summary::writer w(t.path);
    file = w.file();
    auto scalar = [&](const std::string& tag, double v, std::int64_t step) {
      w.scalar(tag, v, step);
      const bool beyond_float = std::isfinite(v) && std::abs(v) > std::numeric_limits<float>::max();
      const float stored = !beyond_float ? static_cast<float>(v)
                           : v > 0       ? std::numeric_limits<float>::infinity()
                                         : -std::numeric_limits<float>::infinity();
      expected.push_back("raw scalar " + hex(tag) + " " + std::to_string(step) + " " + float_bits(stored));
      expected.push_back("tb scalars " + hex(tag) + " " + std::to_string(step) + " " + float_bits(stored));
    };
    for (int step = 0; step < 5; ++step) scalar("loss/total", 1.0 / (step + 1), step);
    for (int step = 0; step < 3; ++step) scalar("loss/zero", step == 1 ? -0.0 : 0.0, step);
    const double values[] = {std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity(),
                             -std::numeric_limits<double>::infinity(),
                             1e-40 /* a float subnormal */,
                             std::numeric_limits<float>::max(),
                             1e300,
                             -1e300,
                             0.1 /* rounded to float */};
    std::int64_t step = -1;
    for (const double v : values) scalar("edge cases", v, step++);
    scalar("\xce\xbb/\xcf\x80", 3.25, std::int64_t{1} << 40);  // a Unicode tag, a large step

    struct picture {
      std::string tag;
      int h, w, c;
      std::int64_t step;
      const char* mode;
    };
    for (const picture& p : {picture{"samples/rgb", 13, 21, 3, 10, "RGB"}, picture{"samples/grey", 9, 4, 1, 10, "L"},
                             picture{"samples/rgb", 16, 16, 3, 20, "RGB"}, picture{"rgba", 3, 5, 4, 7, "RGBA"}}) {
      const auto px = test_image(p.h, p.w, p.c, static_cast<unsigned>(p.step + p.c));
      w.image(p.tag, p.step, p.h, p.w, p.c, px.data());
      const std::string pixels = hex(std::string_view(reinterpret_cast<const char*>(px.data()), px.size()));
      expected.push_back("raw image " + hex(p.tag) + " " + std::to_string(p.step) + " " + std::to_string(p.h) + " " +
                         std::to_string(p.w) + " " + std::to_string(p.c) + " " + p.mode + " " + pixels);
      expected.push_back("tb images " + hex(p.tag) + " " + std::to_string(p.step) + " " + std::to_string(p.w) + " " +
                         std::to_string(p.h) + " " + pixels);
    }

    auto text = [&](const std::string& tag, const std::string& s, std::int64_t step) {
      w.text(tag, s, step);
      expected.push_back("raw text " + hex(tag) + " " + std::to_string(step) + " text DT_STRING " + hex(s));
      expected.push_back("tb text " + hex(tag) + " " + std::to_string(step) + " " + hex(s));
    };
    text("config", "lr **2e-4**, batch 8\n\n| a | b |\n|---|---|\n| 1 | 2 |", 0);
    text("config", "caf\xc3\xa9 \xe2\x9c\x93", 1);
    text("empty", "", 2);
  }

  const command_result r = run_reader(python, file);
  BOOST_TEST_REQUIRE(r.status == 0, "read_events.py failed (status " << r.status << "):\n" << r.output);
  std::vector<std::string> got = lines_of(r.output);
  std::sort(got.begin(), got.end());
  std::sort(expected.begin(), expected.end());
  std::vector<std::string> missing, extra;
  std::set_difference(expected.begin(), expected.end(), got.begin(), got.end(), std::back_inserter(missing));
  std::set_difference(got.begin(), got.end(), expected.begin(), expected.end(), std::back_inserter(extra));
  for (const auto& l : missing) BOOST_ERROR("not read back: " << l);
  for (const auto& l : extra) BOOST_ERROR("read back but not written: " << l);
  BOOST_TEST(got.size() == expected.size());
}

// A record whose CRC does not match must make the reader fail, not end the file quietly: otherwise
// the test above could pass on a file TensorBoard only partly shows.
BOOST_AUTO_TEST_CASE(a_corrupt_file_fails_the_reader) {
  const std::string python = tensorboard_python();
  temp_dir t;
  fs::path file;
  {
    summary::writer w(t.path);
    file = w.file();
    w.scalar("a", 1, 1);
    w.scalar("b", 2, 2);
  }
  std::string bytes = read_file(file);
  bytes[bytes.size() - 6] ^= 0x01;  // inside the last record's data
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
  const command_result r = run_reader(python, file);
  BOOST_TEST(r.status != 0, r.output);
}

BOOST_AUTO_TEST_SUITE_END()
