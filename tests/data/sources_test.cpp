// Sources: IDX files (synthetic, gzip and plain), Fashion-MNIST when installed, image folders of
// PNG and JPEG; and every bad input raising an input_error that names the file and the problem.

#include <distribute/distribute.hpp>
#include <distribute/data.hpp>

// Test images are written with stb_image_write (private to this file).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
#pragma GCC diagnostic pop

#include <boost/test/unit_test.hpp>

#include <zlib.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <random>
#include <string>
#include <vector>

namespace dist = distribute;
namespace data = distribute::data;
namespace fs = std::filesystem;

namespace {

// A fresh directory per test, removed afterwards.
struct temp_dir {
  fs::path path;
  temp_dir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("distribute_data_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
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
void write_gz(const fs::path& p, const std::vector<std::uint8_t>& bytes) {
  gzFile f = gzopen(p.string().c_str(), "wb");
  BOOST_TEST_REQUIRE(f != nullptr);
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}
std::vector<std::uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::uint8_t> idx_bytes(std::uint8_t rank_code, std::vector<std::uint32_t> dims,
                                    const std::vector<std::uint8_t>& payload) {
  std::vector<std::uint8_t> b{0, 0, 0x08, rank_code};
  for (auto d : dims) {
    b.push_back(static_cast<std::uint8_t>(d >> 24));
    b.push_back(static_cast<std::uint8_t>(d >> 16));
    b.push_back(static_cast<std::uint8_t>(d >> 8));
    b.push_back(static_cast<std::uint8_t>(d));
  }
  b.insert(b.end(), payload.begin(), payload.end());
  return b;
}

// n images of 4x3 where pixel k of image i is i * 16 + k; labels i % 10.
void write_mnist(const fs::path& dir, const std::string& prefix, std::uint32_t n, bool gz) {
  std::vector<std::uint8_t> pixels, labels;
  for (std::uint32_t i = 0; i < n; ++i) {
    for (std::uint32_t k = 0; k < 12; ++k) pixels.push_back(static_cast<std::uint8_t>(i * 16 + k));
    labels.push_back(static_cast<std::uint8_t>(i % 10));
  }
  const auto img = idx_bytes(3, {n, 4, 3}, pixels), lab = idx_bytes(1, {n}, labels);
  if (gz) {
    write_gz(dir / (prefix + "-images-idx3-ubyte.gz"), img);
    write_gz(dir / (prefix + "-labels-idx1-ubyte.gz"), lab);
  } else {
    write_bytes(dir / (prefix + "-images-idx3-ubyte"), img);
    write_bytes(dir / (prefix + "-labels-idx1-ubyte"), lab);
  }
}

// Checks that `fn` throws an input_error naming `file` and containing `problem`.
template <class F>
void expect_input_error(F&& fn, const fs::path& file, const std::string& problem) {
  try {
    fn();
    BOOST_ERROR("no error for " << file << " (expected: " << problem << ")");
  } catch (const data::input_error& e) {
    const std::string what = e.what();
    BOOST_TEST(what.find(file.string()) != std::string::npos, "message names the file: " << what);
    BOOST_TEST(what.find(problem) != std::string::npos, "message says '" << problem << "': " << what);
    BOOST_TEST(e.file() == file.string());
  }
}

// A w x h image, channel c of pixel (x, y) = (x * 7 + y * 13 + c * 50 + seed) & 255.
std::vector<std::uint8_t> pattern(int w, int h, int channels, int seed) {
  std::vector<std::uint8_t> px(static_cast<std::size_t>(w * h * channels));
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < channels; ++c)
        px[static_cast<std::size_t>((y * w + x) * channels + c)] =
            static_cast<std::uint8_t>((x * 7 + y * 13 + c * 50 + seed) & 255);
  return px;
}
void write_png(const fs::path& p, int w, int h, int seed) {
  const auto px = pattern(w, h, 3, seed);
  BOOST_TEST_REQUIRE(stbi_write_png(p.string().c_str(), w, h, 3, px.data(), w * 3) != 0);
}
void write_jpg(const fs::path& p, int w, int h, int seed) {
  const auto px = pattern(w, h, 3, seed);
  BOOST_TEST_REQUIRE(stbi_write_jpg(p.string().c_str(), w, h, 3, px.data(), 95) != 0);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(sources)

BOOST_AUTO_TEST_CASE(idx_reads_gzip_and_plain_mnist_files) {
  temp_dir tmp;
  write_mnist(tmp.path, "train", 25, true);
  write_mnist(tmp.path, "t10k", 7, false);
  const auto train = data::mnist(data::split::train, tmp.path);
  const auto test = data::mnist(data::split::test, tmp.path);
  BOOST_TEST(train.size() == 25u);
  BOOST_TEST(test.size() == 7u);
  BOOST_TEST(train.rows() == 4u);
  BOOST_TEST(train.cols() == 3u);
  BOOST_TEST(train.cardinality() == 25);
  std::size_t i = 0;
  for (auto& e : train.epoch(0)) {
    BOOST_TEST(e.image.shape == (std::vector<std::size_t>{4, 3, 1}));
    BOOST_TEST(e.label == static_cast<int>(i % 10));
    for (std::size_t k = 0; k < 12; ++k) BOOST_TEST(e.image.values[k] == static_cast<std::uint8_t>(i * 16 + k));
    ++i;
  }
  BOOST_TEST(i == 25u);
  // Through a pipeline: to_float on batches.
  auto b = *data::mnist(data::split::test, tmp.path).batch(4).map(data::to_float{}).epoch(0).begin();
  BOOST_TEST(b.images.shape == (std::vector<std::size_t>{4, 4, 3, 1}));
  BOOST_TEST(b.images.values[0] == -1.0f);
  BOOST_TEST(b.images.values[13] == 17 * 2.0f / 255.0f - 1.0f, boost::test_tools::tolerance(1e-6f));
  // parse_idx on other ranks.
  const auto t = data::parse_idx(idx_bytes(2, {2, 3}, {1, 2, 3, 4, 5, 6}), "mem");
  BOOST_TEST(t.shape == (std::vector<std::size_t>{2, 3}));
  BOOST_TEST(t.values == (std::vector<std::uint8_t>{1, 2, 3, 4, 5, 6}));
}

BOOST_AUTO_TEST_CASE(idx_bad_inputs_name_the_file) {
  temp_dir tmp;
  // Missing file.
  expect_input_error([&] { data::mnist(data::split::train, tmp.path); }, tmp.path / "train-images-idx3-ubyte.gz",
                     "no such file");
  expect_input_error([&] { data::read_idx(tmp.path / "nothing.idx"); }, tmp.path / "nothing.idx", "no such file");

  // Wrong magic: a label file where images are expected, and bytes that are not IDX at all.
  write_mnist(tmp.path, "train", 3, true);
  fs::copy_file(tmp.path / "train-labels-idx1-ubyte.gz", tmp.path / "swapped-images.gz");
  expect_input_error(
      [&] { data::idx_dataset(tmp.path / "swapped-images.gz", tmp.path / "train-labels-idx1-ubyte.gz"); },
      tmp.path / "swapped-images.gz", "wrong IDX magic 0x00000801, expected 0x00000803");
  write_bytes(tmp.path / "text.idx", {'h', 'e', 'l', 'l', 'o', '\n', 0, 0, 0, 0, 0, 0});
  expect_input_error([&] { data::read_idx(tmp.path / "text.idx"); }, tmp.path / "text.idx",
                     "wrong IDX magic 0x68656C6C");

  // Truncated: data shorter than the header promises; a header cut short; a file of 2 bytes.
  write_bytes(tmp.path / "short.idx", idx_bytes(3, {10, 4, 3}, std::vector<std::uint8_t>(100, 1)));
  expect_input_error([&] { data::read_idx(tmp.path / "short.idx"); }, tmp.path / "short.idx",
                     "truncated: the header promises 120 bytes of data [10, 4, 3], the file holds 100");
  auto cut_header = idx_bytes(3, {10, 4, 3}, {});
  cut_header.resize(9);
  write_bytes(tmp.path / "header.idx", cut_header);
  expect_input_error([&] { data::read_idx(tmp.path / "header.idx"); }, tmp.path / "header.idx",
                     "truncated: the IDX header");
  write_bytes(tmp.path / "tiny.idx", {0, 0});
  expect_input_error([&] { data::read_idx(tmp.path / "tiny.idx"); }, tmp.path / "tiny.idx", "truncated");
  write_bytes(tmp.path / "long.idx", idx_bytes(1, {2}, {1, 2, 3}));
  expect_input_error([&] { data::read_idx(tmp.path / "long.idx"); }, tmp.path / "long.idx", "1 bytes after");

  // A gzip file cut short, and one with corrupt compressed data.
  std::vector<std::uint8_t> big;
  std::mt19937 gen(1);
  for (int i = 0; i < 20000; ++i) big.push_back(static_cast<std::uint8_t>(gen() % 7));
  write_gz(tmp.path / "whole.gz", idx_bytes(3, {20, 25, 40}, big));
  auto gz = read_bytes(tmp.path / "whole.gz");
  write_bytes(tmp.path / "cut.gz",
              std::vector<std::uint8_t>(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() / 2)));
  expect_input_error([&] { data::read_idx(tmp.path / "cut.gz"); }, tmp.path / "cut.gz", "truncated");
  auto corrupt = gz;
  for (std::size_t k = 20; k < 60; ++k) corrupt[k] ^= 0x5A;
  write_bytes(tmp.path / "corrupt.gz", corrupt);
  expect_input_error([&] { data::read_idx(tmp.path / "corrupt.gz"); }, tmp.path / "corrupt.gz", "cannot read");

  // Image and label counts that disagree.
  write_gz(tmp.path / "l5.gz", idx_bytes(1, {5}, {1, 2, 3, 4, 5}));
  expect_input_error([&] { data::idx_dataset(tmp.path / "train-images-idx3-ubyte.gz", tmp.path / "l5.gz"); },
                     tmp.path / "l5.gz", "holds 5 labels, but");
}

BOOST_AUTO_TEST_CASE(image_folder_reads_png_and_jpeg_with_labels) {
  temp_dir tmp;
  fs::create_directories(tmp.path / "cats");
  fs::create_directories(tmp.path / "dogs");
  fs::create_directories(tmp.path / "empty_class");
  write_png(tmp.path / "cats" / "a.png", 8, 6, 1);
  write_jpg(tmp.path / "cats" / "b.JPG", 8, 6, 2);
  write_png(tmp.path / "dogs" / "c.png", 8, 6, 3);
  write_bytes(tmp.path / "dogs" / "notes.txt", {'x'});  // not an image: ignored
  const auto ds = data::image_folder(tmp.path);
  BOOST_TEST(ds.class_names() == (std::vector<std::string>{"cats", "dogs", "empty_class"}));
  BOOST_TEST(ds.cardinality() == 3);
  std::vector<data::example<std::uint8_t>> got;
  for (auto& e : ds.epoch(0)) got.push_back(e);
  BOOST_TEST_REQUIRE(got.size() == 3u);
  BOOST_TEST(got[0].label == 0);
  BOOST_TEST(got[1].label == 0);
  BOOST_TEST(got[2].label == 1);
  for (auto& e : got) BOOST_TEST(e.image.shape == (std::vector<std::size_t>{6, 8, 3}));
  BOOST_TEST(got[0].image.values == pattern(8, 6, 3, 1));  // PNG is lossless
  BOOST_TEST(got[2].image.values == pattern(8, 6, 3, 3));
  int close = 0;  // JPEG is lossy but close
  const auto want = pattern(8, 6, 3, 2);
  for (std::size_t k = 0; k < want.size(); ++k) close += std::abs(int(got[1].image.values[k]) - int(want[k])) <= 24;
  BOOST_TEST(close > static_cast<int>(want.size() * 9 / 10));

  // Grayscale, resize, crop and flip.
  const auto gray = data::image_folder(
      tmp.path,
      {.channels = 1, .resize = data::image_size{12, 16}, .random_crop = {}, .random_flip = false, .seed = 0});
  for (auto& e : gray.epoch(0)) BOOST_TEST(e.image.shape == (std::vector<std::size_t>{12, 16, 1}));
  const auto aug = data::image_folder(tmp.path, {.channels = 3,
                                                 .resize = data::image_size{6, 8},
                                                 .random_crop = data::image_size{4, 5},
                                                 .random_flip = true,
                                                 .seed = 3});
  int flipped_or_moved = 0;
  for (std::uint64_t epoch = 0; epoch < 8; ++epoch) {
    std::size_t i = 0;
    for (auto& e : aug.epoch(epoch)) {
      BOOST_TEST(e.image.shape == (std::vector<std::size_t>{4, 5, 3}));
      if (i == 0) {  // the lossless first image: the crop is a window of it, maybe mirrored
        bool found = false;
        for (std::size_t top = 0; top <= 2 && !found; ++top)
          for (std::size_t left = 0; left <= 3 && !found; ++left)
            for (bool flip : {false, true}) {
              auto window =
                  data::crop_image(data::tensor<std::uint8_t>{{6, 8, 3}, pattern(8, 6, 3, 1)}, top, left, 4, 5);
              if (flip) data::flip_left_right(window);
              if (window == e.image) {
                found = true;
                flipped_or_moved += flip || top || left;
                break;
              }
            }
        BOOST_TEST(found);
      }
      ++i;
    }
  }
  BOOST_TEST(flipped_or_moved > 0);
  // The same (seed, epoch) gives the same images.
  BOOST_TEST(((*aug.epoch(5).begin()).image == (*aug.epoch(5).begin()).image));

  // Decoding is a map over the file list: a prefetch above runs it on its threads, in order, and a
  // map on top fuses with it.
  static_assert(std::is_same_v<
                decltype(aug.map(data::to_float{})),
                data::map_dataset<data::image_files, data::detail::composed<data::image_decoder, data::to_float>>>);
  for (std::size_t threads : {1u, 3u}) {
    std::vector<data::example<std::uint8_t>> parallel;
    for (auto& e : aug.prefetch(2, threads).epoch(4)) parallel.push_back(e);
    std::vector<data::example<std::uint8_t>> serial;
    for (auto& e : aug.epoch(4)) serial.push_back(e);
    BOOST_TEST((parallel == serial));
  }

  // Batches of them, distributed.
  dist::mirrored_strategy<> strategy{dist::cpu_replicas(2)};
  std::size_t total = 0;
  for (auto& per : strategy.distribute(ds.batch(3)))
    for (auto& part : per) total += part.size();
  BOOST_TEST(total == 3u);
}

BOOST_AUTO_TEST_CASE(image_folder_shards_by_file) {
  temp_dir tmp;
  fs::create_directories(tmp.path / "a");
  fs::create_directories(tmp.path / "b");
  for (int i = 0; i < 5; ++i) write_png(tmp.path / "a" / ("x" + std::to_string(i) + ".png"), 4, 4, i);
  for (int i = 0; i < 3; ++i) write_png(tmp.path / "b" / ("y" + std::to_string(i) + ".png"), 4, 4, 10 + i);
  const auto ds = data::image_folder(tmp.path);
  BOOST_TEST(ds.file_count() == 8u);
  // Under file sharding each worker reads its own files; together every file exactly once.
  dist::one_device_strategy<> strategy;
  std::multiset<std::uint8_t> firsts;  // pixel 0 identifies the file
  for (std::size_t w = 0; w < 3; ++w) {
    std::size_t n = 0;
    auto inputs = strategy.distribute(ds.shuffle(8, 1).batch(3),
                                      {.policy = data::shard_policy::file, .num_workers = 3, .worker_index = w});
    for (auto& per : inputs) {
      BOOST_TEST(per[0].size() == 1u);  // the global batch of 3 over 3 workers
      for (std::size_t i = 0; i < per[0].size(); ++i) firsts.insert(per[0][i][0]);
      n += per[0].size();
    }
    BOOST_TEST(n == (w < 2 ? 3u : 2u));
  }
  std::multiset<std::uint8_t> expected;
  for (int s : {0, 1, 2, 3, 4, 10, 11, 12}) expected.insert(static_cast<std::uint8_t>(s));
  BOOST_TEST(firsts == expected);
  // Fewer files than workers: a clear error; automatic falls back to data.
  BOOST_CHECK_EXCEPTION(
      strategy.distribute(ds.batch(9), {.policy = data::shard_policy::file, .num_workers = 9, .worker_index = 0}),
      std::invalid_argument, [](const std::invalid_argument& e) {
        return std::string(e.what()).find("reads 8 file(s) for 9 workers") != std::string::npos;
      });
  std::size_t n = 0;
  for (auto& per : strategy.distribute(ds.batch(9), {.num_workers = 9, .worker_index = 0})) n += per[0].size();
  BOOST_TEST(n == 1u);
  // A Fashion-MNIST-style single file cannot be sharded by file among 2 workers.
  write_mnist(tmp.path, "train", 4, true);
  BOOST_CHECK_EXCEPTION(strategy.distribute(data::mnist(data::split::train, tmp.path).batch(2),
                                            {.policy = data::shard_policy::file, .num_workers = 2, .worker_index = 0}),
                        std::invalid_argument, [](const std::invalid_argument& e) {
                          return std::string(e.what()).find("reads 1 file(s) for 2 workers") != std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(image_bad_inputs_name_the_file) {
  temp_dir tmp;
  expect_input_error([&] { data::image_folder(tmp.path / "missing"); }, tmp.path / "missing", "no such directory");
  expect_input_error([&] { data::image_folder(tmp.path); }, tmp.path, "no class sub-folders");
  fs::create_directories(tmp.path / "k");
  expect_input_error([&] { data::image_folder(tmp.path); }, tmp.path, "no .png, .jpg or .jpeg files");

  // Inconsistent sizes without resize: the odd file is named when the pass reaches it.
  write_png(tmp.path / "k" / "a.png", 8, 6, 1);
  write_png(tmp.path / "k" / "b.png", 7, 6, 1);
  const auto ds = data::image_folder(tmp.path);
  expect_input_error(
      [&] {
        for (auto& e : ds.epoch(0)) (void)e;
      },
      tmp.path / "k" / "b.png", "image is 6x7 (height x width), but");
  // With resize they are accepted.
  std::size_t n = 0;
  for (auto& e :
       data::image_folder(
           tmp.path,
           {.channels = 3, .resize = data::image_size{6, 8}, .random_crop = {}, .random_flip = false, .seed = 0})
           .epoch(0))
    n += e.image.shape[1] == 8;
  BOOST_TEST(n == 2u);
  fs::remove(tmp.path / "k" / "b.png");

  // Corrupt PNG: truncated, and with its pixel data overwritten.
  auto png = read_bytes(tmp.path / "k" / "a.png");
  write_bytes(tmp.path / "k" / "c.png",
              std::vector<std::uint8_t>(png.begin(), png.begin() + static_cast<std::ptrdiff_t>(png.size() / 2)));
  expect_input_error(
      [&] {
        for (auto& e : data::image_folder(tmp.path).epoch(0)) (void)e;
      },
      tmp.path / "k" / "c.png", "corrupt");
  fs::remove(tmp.path / "k" / "c.png");
  // Corrupt JPEG: a start-of-image marker followed by garbage; and a zero-byte file.
  std::vector<std::uint8_t> jpg{0xFF, 0xD8, 0xFF, 0xDB, 0x00, 0x05, 0x13, 0x37, 0x42, 0xFF, 0xC0, 0x00, 0x02};
  write_bytes(tmp.path / "k" / "d.jpg", jpg);
  expect_input_error(
      [&] {
        for (auto& e : data::image_folder(tmp.path).epoch(0)) (void)e;
      },
      tmp.path / "k" / "d.jpg", "corrupt");
  fs::remove(tmp.path / "k" / "d.jpg");
  write_bytes(tmp.path / "k" / "e.jpeg", {});
  expect_input_error(
      [&] {
        for (auto& e : data::image_folder(tmp.path).epoch(0)) (void)e;
      },
      tmp.path / "k" / "e.jpeg", "empty file");
  fs::remove(tmp.path / "k" / "e.jpeg");
  // Found by tests/fuzz/fuzz_image: a JPEG whose Huffman table declares more than 256 codes (stb
  // 2.27 would write past its tables) and a PNG with an empty chunk (stb memcpy's to a null pointer,
  // which the asan preset's UBSan stops at). Both must end as input_error or a clean decode.
  std::vector<std::uint8_t> dht{0xFF, 0xD8, 0xFF, 0xC4, 0x00, 0x30, 0x00};
  for (int k = 0; k < 16; ++k) dht.push_back(0xFF);
  dht.resize(dht.size() + 64, 0x11);
  write_bytes(tmp.path / "k" / "g.jpg", dht);
  expect_input_error(
      [&] {
        for (auto& e : data::image_folder(tmp.path).epoch(0)) (void)e;
      },
      tmp.path / "k" / "g.jpg", "corrupt JPEG: a Huffman table declares 4080 codes (at most 256)");
  fs::remove(tmp.path / "k" / "g.jpg");
  const fs::path corpus = fs::path(DISTRIBUTE_SOURCE_DIR) / "tests" / "fuzz" / "corpus" / "fuzz_image";
  for (const char* regress : {"regress-jpeg-dht-overflow", "regress-jpeg-dht-at-end", "regress-jpeg-fill-before-soi"})
    expect_input_error([&] { data::decode_image(read_bytes(corpus / regress), regress); }, regress,
                       "corrupt JPEG: a Huffman table declares");
  const auto empty_chunk = read_bytes(corpus / "regress-png-empty-chunk");
  BOOST_TEST_REQUIRE(empty_chunk.size() == 85u);
  try {
    const auto img = data::decode_image(empty_chunk, "regress-png-empty-chunk");
    BOOST_TEST(img.values.size() == img.shape[0] * img.shape[1] * img.shape[2]);
  } catch (const data::input_error& e) {
    BOOST_TEST(std::string(e.what()).find("regress-png-empty-chunk") != std::string::npos);
  }

  // Not an image at all, with an image's name; errors from a prefetch thread reach the consumer.
  write_bytes(tmp.path / "k" / "f.png", {'n', 'o', 't', ' ', 'a', ' ', 'p', 'n', 'g'});
  expect_input_error(
      [&] {
        for (auto& e : data::image_folder(tmp.path).prefetch(2, 2)) (void)e;
      },
      tmp.path / "k" / "f.png", "not a PNG or JPEG image");
}

BOOST_AUTO_TEST_SUITE_END()

// Fashion-MNIST itself, from Debian's dataset-fashion-mnist package (or DISTRIBUTE_FASHION_MNIST_DIR).
// Without it the test prints "SKIPPED: <reason>", which ctest reports as a skip.
namespace {
fs::path fashion_dir() {
  const char* env = std::getenv("DISTRIBUTE_FASHION_MNIST_DIR");
  return env ? fs::path(env) : fs::path(data::fashion_mnist_default_dir);
}
struct fashion_mnist_installed {
  boost::test_tools::assertion_result operator()(boost::unit_test::test_unit_id) const {
    std::error_code ec;
    const bool ok = fs::exists(fashion_dir() / "train-images-idx3-ubyte.gz", ec) ||
                    fs::exists(fashion_dir() / "train-images-idx3-ubyte", ec);
    if (!ok) {
      std::cout << "SKIPPED: Fashion-MNIST is not installed in " << fashion_dir().string()
                << " (apt-get install dataset-fashion-mnist, or set DISTRIBUTE_FASHION_MNIST_DIR)" << std::endl;
      boost::test_tools::assertion_result r(false);
      r.message() << "Fashion-MNIST not installed in " << fashion_dir().string();
      return r;
    }
    return true;
  }
};
}  // namespace

BOOST_AUTO_TEST_SUITE(fashion_mnist, *boost::unit_test::precondition(fashion_mnist_installed{}))

BOOST_AUTO_TEST_CASE(loads_both_splits_with_balanced_classes) {
  for (auto [split, total, per_class] :
       {std::tuple{data::split::train, 60000u, 6000}, std::tuple{data::split::test, 10000u, 1000}}) {
    const auto ds = data::fashion_mnist(split, fashion_dir());
    BOOST_TEST(ds.size() == total);
    BOOST_TEST(ds.rows() == 28u);
    BOOST_TEST(ds.cols() == 28u);
    std::array<int, 10> count{};
    std::size_t n = 0;
    for (auto& e : ds.epoch(0)) {
      BOOST_TEST_REQUIRE((e.label >= 0 && e.label < 10));
      ++count[static_cast<std::size_t>(e.label)];
      ++n;
    }
    BOOST_TEST(n == total);
    for (int c : count) BOOST_TEST(c == per_class);
  }
  BOOST_TEST(data::fashion_mnist_classes[9] == "Ankle boot");
}

BOOST_AUTO_TEST_CASE(distributed_epoch_covers_the_test_split) {
  dist::mirrored_strategy<> strategy{dist::cpu_replicas(3)};
  const auto ds =
      data::fashion_mnist(data::split::test, fashion_dir()).shuffle(10000, 1).batch(64).map(data::to_float{});
  std::array<int, 10> count{};
  std::size_t steps = 0;
  for (auto& per : strategy.distribute(ds, {.prefetch = 4, .prefetch_threads = 2})) {
    ++steps;
    for (auto& part : per) {
      BOOST_TEST(part.images.shape.size() == 4u);
      for (auto l : part.labels) ++count[static_cast<std::size_t>(l)];
    }
  }
  BOOST_TEST(steps == (10000u + 63) / 64);
  for (int c : count) BOOST_TEST(c == 1000);
}

BOOST_AUTO_TEST_SUITE_END()
