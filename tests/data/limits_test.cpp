// Inputs built to exhaust memory or to break the readers' promises: gzip and PNG "bombs", headers
// that promise more than the limits, gzip wrapped around images, and label files that do not fit
// their classes. Each is refused before the memory is allocated, by an input_error that names the
// file and the limit.

#include <distribute/data.hpp>

#include <boost/test/unit_test.hpp>

#include <zlib.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <unistd.h>

namespace data = distribute::data;
namespace fs = std::filesystem;

namespace {

struct temp_dir {
  fs::path path;
  temp_dir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("distribute_limits_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void write_bytes(const fs::path& p, const std::vector<std::uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// Gzip of `head` followed by `zeros` zero bytes, written in pieces (nothing that size in memory).
std::vector<std::uint8_t> gzip(const std::vector<std::uint8_t>& head, std::uint64_t zeros = 0) {
  z_stream z{};
  BOOST_TEST_REQUIRE(deflateInit2(&z, 9, Z_DEFLATED, 16 + MAX_WBITS, 9, Z_DEFAULT_STRATEGY) == Z_OK);
  std::vector<std::uint8_t> out, chunk(1 << 16);
  const std::vector<std::uint8_t> zero(1 << 20, 0);
  auto feed = [&](const std::uint8_t* p, std::size_t n, int flush) {
    z.next_in = const_cast<Bytef*>(p);
    z.avail_in = static_cast<uInt>(n);
    do {
      z.next_out = chunk.data();
      z.avail_out = static_cast<uInt>(chunk.size());
      deflate(&z, flush);
      out.insert(out.end(), chunk.data(), chunk.data() + (chunk.size() - z.avail_out));
    } while (z.avail_out == 0);
  };
  feed(head.data(), head.size(), Z_NO_FLUSH);
  for (std::uint64_t left = zeros; left > 0;) {
    const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(left, zero.size()));
    feed(zero.data(), n, Z_NO_FLUSH);
    left -= n;
  }
  feed(nullptr, 0, Z_FINISH);
  deflateEnd(&z);
  return out;
}

std::vector<std::uint8_t> idx_header(std::uint8_t rank_code, std::vector<std::uint32_t> dims) {
  std::vector<std::uint8_t> b{0, 0, 0x08, rank_code};
  for (auto d : dims)
    for (int shift : {24, 16, 8, 0}) b.push_back(static_cast<std::uint8_t>(d >> shift));
  return b;
}

void be32(std::vector<std::uint8_t>& b, std::uint32_t v) {
  for (int shift : {24, 16, 8, 0}) b.push_back(static_cast<std::uint8_t>(v >> shift));
}
void png_chunk(std::vector<std::uint8_t>& b, const char* type, const std::vector<std::uint8_t>& body) {
  be32(b, static_cast<std::uint32_t>(body.size()));
  const std::size_t at = b.size();
  b.insert(b.end(), type, type + 4);
  b.insert(b.end(), body.begin(), body.end());
  be32(b, static_cast<std::uint32_t>(crc32(0, b.data() + at, static_cast<uInt>(4 + body.size()))));
}
// A greyscale 8-bit PNG of w x h whose image data is the zlib stream of `raw_bytes` zeros.
std::vector<std::uint8_t> png(std::uint32_t w, std::uint32_t h, std::uint64_t raw_bytes) {
  std::vector<std::uint8_t> b{0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  std::vector<std::uint8_t> ihdr;
  be32(ihdr, w);
  be32(ihdr, h);
  ihdr.insert(ihdr.end(), {8, 0, 0, 0, 0});
  png_chunk(b, "IHDR", ihdr);
  std::vector<std::uint8_t> raw(static_cast<std::size_t>(raw_bytes), 0);
  std::vector<std::uint8_t> packed(compressBound(static_cast<uLong>(raw.size())));
  uLongf n = packed.size();
  BOOST_TEST_REQUIRE(compress2(packed.data(), &n, raw.data(), static_cast<uLong>(raw.size()), 9) == Z_OK);
  packed.resize(n);
  png_chunk(b, "IDAT", packed);
  png_chunk(b, "IEND", {});
  return b;
}

// `f` throws an input_error naming `file` whose message contains every one of `parts`, in < 1 s.
void expect_refused(const std::function<void()>& f, const std::string& file, std::vector<std::string> parts) {
  const auto t0 = std::chrono::steady_clock::now();
  try {
    f();
    BOOST_ERROR("no input_error for " << file);
  } catch (const data::input_error& e) {
    const std::string what = e.what();
    BOOST_TEST(e.file() == file);
    for (const auto& p : parts) BOOST_TEST(what.find(p) != std::string::npos, "'" << p << "' in: " << what);
  }
  BOOST_TEST(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < 1.0);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(limits)

BOOST_AUTO_TEST_CASE(gzip_is_refused_once_it_inflates_past_the_limit) {
  temp_dir tmp;
  const data::input_limits small{.max_file_bytes = 1 << 20, .max_image_bytes = 1 << 20};
  // 8 MiB of zeros behind a header that fits: refused at 1 MiB, whatever the name says.
  const auto bomb = gzip(idx_header(3, {10, 28, 28}), 8 << 20);
  for (const char* name : {"bomb.gz", "bomb.idx", "bomb.png"}) {
    write_bytes(tmp.path / name, bomb);
    expect_refused([&] { data::read_idx(tmp.path / name, 0, small); }, (tmp.path / name).string(),
                   {"inflates to more than the limit of 1 MiB", "input_limits::max_file_bytes"});
  }
  expect_refused([&] { data::read_image_file(tmp.path / "bomb.png", 0, small); }, (tmp.path / "bomb.png").string(),
                 {"inflates to more than the limit of 1 MiB"});
  expect_refused([&] { data::decode_image(bomb, "in-memory.png", 0, small); }, "in-memory.png",
                 {"inflates to more than"});
  // Under the limit, the same stream is an IDX file with bytes after its data: refused by the header.
  expect_refused([&] { data::read_idx(tmp.path / "bomb.gz"); }, (tmp.path / "bomb.gz").string(),
                 {"bytes after the 7840 bytes"});
}

BOOST_AUTO_TEST_CASE(idx_headers_are_checked_before_the_data_is_read) {
  temp_dir tmp;
  const data::input_limits small{.max_file_bytes = 1 << 20};
  // A header promising 2 MiB, gzip or plain, refused without reading on.
  const auto header = idx_header(3, {2048, 32, 32});
  write_bytes(tmp.path / "big.gz", gzip(header, 2 << 20));
  expect_refused([&] { data::read_idx(tmp.path / "big.gz", 0, small); }, (tmp.path / "big.gz").string(),
                 {"promises 2097152 bytes of data, more than the limit of 1 MiB"});
  auto plain = header;
  plain.resize(plain.size() + (2 << 20));
  write_bytes(tmp.path / "big.idx", plain);
  expect_refused([&] { data::read_idx(tmp.path / "big.idx", 0, small); }, (tmp.path / "big.idx").string(),
                 {"more than the limit of 1 MiB"});
  // The whole file counts, header included.
  expect_refused([&] { data::read_idx(tmp.path / "big.idx", 0, {.max_file_bytes = 2 << 20}); },
                 (tmp.path / "big.idx").string(), {"2097168 bytes, more than the limit of 2 MiB"});
  BOOST_TEST(data::read_idx(tmp.path / "big.idx", 0, {.max_file_bytes = 4 << 20}).values.size() == std::size_t{2}
                                                                                                       << 20);
  BOOST_TEST(data::read_idx(tmp.path / "big.gz", 0, {.max_file_bytes = 4 << 20}).values.size() == std::size_t{2} << 20);
  // Two gzip members read as one stream; bytes after the stream are refused.
  auto two = gzip(idx_header(1, {4}));
  const auto second = gzip({1, 2, 3, 4});
  two.insert(two.end(), second.begin(), second.end());
  write_bytes(tmp.path / "two.gz", two);
  BOOST_TEST(data::read_idx(tmp.path / "two.gz").values == (std::vector<std::uint8_t>{1, 2, 3, 4}));
  two.push_back('x');
  write_bytes(tmp.path / "junk.gz", two);
  expect_refused([&] { data::read_idx(tmp.path / "junk.gz"); }, (tmp.path / "junk.gz").string(),
                 {"bytes after the end of the gzip stream"});
}

BOOST_AUTO_TEST_CASE(image_headers_are_checked_before_decoding) {
  // 16384 x 16384 greyscale is 256 MiB decoded: refused by the header alone (the data here is short).
  const auto huge = png(16384, 16384, 1 << 10);
  expect_refused([&] { data::decode_image(huge, "huge.png"); }, "huge.png",
                 {"16384x16384", "more than the limit of 64 MiB", "input_limits::max_image_bytes"});
  // 8 x 8 pixels whose data inflates to 4 MiB: refused by the PNG check, not inflated by stb.
  const auto inflated = png(8, 8, 4 << 20);
  expect_refused([&] { data::decode_image(inflated, "inflated.png"); }, "inflated.png",
                 {"inflates to more than the 360 bytes"});
  // An honest 8 x 8 PNG decodes, and so does its gzip.
  const auto honest = png(8, 8, 8 * 9);
  BOOST_TEST(data::decode_image(honest, "honest.png").values.size() == 64u);
  BOOST_TEST(data::decode_image(gzip(honest), "honest.png.gz").values.size() == 64u);
  expect_refused([&] { data::decode_image(gzip(gzip(honest)), "twice.gz"); }, "twice.gz", {"gzip inside gzip"});
  // Resizing to more than the limit is refused before allocating.
  const auto img = data::decode_image(honest, "honest.png");
  BOOST_CHECK_THROW(data::resize_image(img, 20000, 20000), std::invalid_argument);
  BOOST_TEST(data::resize_image(img, 16, 16).values.size() == 256u);
}

BOOST_AUTO_TEST_CASE(image_folder_refuses_a_resize_past_the_limit) {
  temp_dir tmp;
  fs::create_directories(tmp.path / "a");
  write_bytes(tmp.path / "a" / "x.png", png(8, 8, 8 * 9));
  BOOST_CHECK_THROW(data::image_folder(tmp.path, {.channels = 3, .resize = data::image_size{20000, 20000}}),
                    std::invalid_argument);
  // A gzip file named .png: its content decides (and the limit bounds it).
  write_bytes(tmp.path / "a" / "y.png", gzip(png(8, 8, 8 * 9)));
  std::size_t n = 0;
  for (auto&& e : data::image_folder(tmp.path, {.channels = 1}).epoch(0)) n += e.image.values.size();
  BOOST_TEST(n == 128u);
}

BOOST_AUTO_TEST_CASE(labels_outside_the_classes_are_refused) {
  temp_dir tmp;
  auto images = idx_header(3, {4, 2, 2});
  images.resize(images.size() + 16, 7);
  auto labels = idx_header(1, {4});
  labels.insert(labels.end(), {1, 9, 10, 3});
  write_bytes(tmp.path / "train-images-idx3-ubyte", images);
  write_bytes(tmp.path / "train-labels-idx1-ubyte", labels);
  expect_refused([&] { data::mnist(data::split::train, tmp.path); }, (tmp.path / "train-labels-idx1-ubyte").string(),
                 {"label 2 is 10; labels must be 0 to 9"});
  // A generic IDX pair takes any label unless told the number of classes.
  BOOST_TEST(data::idx_dataset(tmp.path / "train-images-idx3-ubyte", tmp.path / "train-labels-idx1-ubyte").size() ==
             4u);
  labels.back() = 9;
  labels[labels.size() - 2] = 0;
  write_bytes(tmp.path / "train-labels-idx1-ubyte", labels);
  BOOST_TEST(data::mnist(data::split::train, tmp.path).size() == 4u);
}

BOOST_AUTO_TEST_SUITE_END()
