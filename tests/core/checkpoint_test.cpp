// Checkpoints: the archive's typed sections, the file format (round trip, atomic replacement, every
// kind of damage refused with a clear error) and the rotating directory.

#include "test_support.hpp"

#include <boost/test/unit_test.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

namespace dist = distribute;
namespace ckpt = distribute::checkpoint;
namespace fs = std::filesystem;

namespace {

// A model as checkpoints see it, without the nn layer: two parameters and a running statistic.
struct tiny_model {
  using scalar_type = float;
  std::vector<float> w, w_grad, b, b_grad;
  std::vector<double> running;
  template <class F>
  void for_each_parameter(F&& f) {
    f(std::span<float>(w), std::span<float>(w_grad));
    f(std::span<float>(b), std::span<float>(b_grad));
  }
  template <class F>
  void for_each_buffer(F&& f) {
    f(std::span<double>(running));
  }
};

tiny_model make_model(std::size_t nw, std::size_t nb, float start) {
  tiny_model m{
      std::vector<float>(nw), std::vector<float>(nw), std::vector<float>(nb), std::vector<float>(nb), {0.5, 1.5}};
  for (std::size_t i = 0; i < nw; ++i) m.w[i] = start + static_cast<float>(i) * 0.25f;
  for (std::size_t i = 0; i < nb; ++i) m.b[i] = -start - static_cast<float>(i);
  return m;
}

struct double_model {
  using scalar_type = double;
  std::vector<double> w = std::vector<double>(5), g = std::vector<double>(5);
  template <class F>
  void for_each_parameter(F&& f) {
    f(std::span<double>(w), std::span<double>(g));
  }
};

// An object with its own save/load, as the optimisers have.
struct counter_state {
  std::int64_t count = 0;
  void save(std::ostream& os) const { os.write(reinterpret_cast<const char*>(&count), sizeof count); }
  void load(std::istream& is) {
    if (!is.read(reinterpret_cast<char*>(&count), sizeof count)) throw std::runtime_error("truncated counter");
  }
};

struct temp_dir {
  fs::path path;
  temp_dir() {
    static int n = 0;
    path =
        fs::temp_directory_path() / ("distribute-ckpt-test-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~temp_dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

ckpt::archive sample_archive() {
  ckpt::archive a;
  a.put("step", std::int64_t{1234});
  a.put("lr", 2e-4);
  a.put_vector("order", std::vector<std::int32_t>{3, 1, 2});
  auto m = make_model(5, 2, 1.0f);
  a.put_model("model", m);
  a.put_state("opt", counter_state{42});
  std::mt19937_64 rng(99);
  rng.discard(17);
  a.put_text("rng", rng);
  return a;
}

std::vector<char> read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}
void write_file(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ckpt::checkpoint_error& e) {
    return e.what();
  }
  return "no error";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// What `f` writes to stderr (file descriptor 2).
template <class F>
std::string stderr_of(F&& f) {
  const fs::path file = fs::temp_directory_path() / ("distribute-ckpt-stderr-" + std::to_string(::getpid()));
  std::fflush(stderr);
  const int saved = ::dup(2);
  std::FILE* capture = std::fopen(file.c_str(), "w");
  BOOST_TEST_REQUIRE((saved >= 0 && capture != nullptr));
  ::dup2(::fileno(capture), 2);
  struct restore {
    int saved;
    std::FILE* capture;
    ~restore() {
      std::fflush(stderr);
      ::dup2(saved, 2);
      ::close(saved);
      std::fclose(capture);
    }
  };
  {
    const restore r{saved, capture};
    f();
  }
  const auto bytes = read_file(file);
  fs::remove(file);
  return {bytes.begin(), bytes.end()};
}

}  // namespace

BOOST_AUTO_TEST_SUITE(checkpoint)

BOOST_AUTO_TEST_CASE(crc32_matches_the_standard_check_value) {
  const std::string text = "123456789";
  BOOST_TEST(ckpt::detail::crc32(std::as_bytes(std::span(text.data(), text.size()))) == 0xCBF43926u);
  // Chainable.
  const auto a = std::as_bytes(std::span(text.data(), 4)), b = std::as_bytes(std::span(text.data() + 4, 5));
  BOOST_TEST(ckpt::detail::crc32(b, ckpt::detail::crc32(a)) == 0xCBF43926u);
}

BOOST_AUTO_TEST_CASE(typed_sections_round_trip) {
  const auto a = sample_archive();
  BOOST_TEST(a.get<std::int64_t>("step") == 1234);
  BOOST_TEST(a.get<double>("lr") == 2e-4);
  BOOST_TEST((a.get_vector<std::int32_t>("order") == std::vector<std::int32_t>{3, 1, 2}));
  auto m = make_model(5, 2, 0.0f);
  m.running = {0, 0};
  a.get_model("model", m);
  const auto expected = make_model(5, 2, 1.0f);
  BOOST_TEST(m.w == expected.w);
  BOOST_TEST(m.b == expected.b);
  BOOST_TEST((m.running == std::vector<double>{0.5, 1.5}));
  counter_state c;
  a.get_state("opt", c);
  BOOST_TEST(c.count == 42);
  std::mt19937_64 rng, want(99);
  want.discard(17);
  a.get_text("rng", rng);
  BOOST_TEST((rng == want));
  BOOST_TEST((a.names() == std::vector<std::string>{"step", "lr", "order", "model", "opt", "rng"}));
}

BOOST_AUTO_TEST_CASE(misuse_of_sections_is_named) {
  auto a = sample_archive();
  BOOST_CHECK_THROW(a.put("step", 1), std::invalid_argument);
  BOOST_TEST(contains(error_of([&] { (void)a.get<std::int64_t>("epoch"); }), "no section 'epoch'"));
  BOOST_TEST(contains(error_of([&] { (void)a.get<std::int32_t>("step"); }), "holds 8 bytes"));
  BOOST_TEST(contains(error_of([&] { (void)a.get_vector<std::int64_t>("order"); }), "not a whole number"));
  std::mt19937_64 rng;
  BOOST_TEST(contains(error_of([&] { a.get_text("step", rng); }), "not a valid saved value"));
  counter_state c;
  BOOST_TEST(contains(error_of([&] { a.get_state("order", c); }), "bytes left"));
  BOOST_TEST(contains(error_of([&] { a.get_state("lr", c); }), "bytes left") == false);
}

BOOST_AUTO_TEST_CASE(a_model_that_does_not_fit_is_refused_untouched) {
  const auto a = sample_archive();
  auto wrong_size = make_model(6, 2, 7.0f);
  BOOST_TEST(contains(error_of([&] { a.get_model("model", wrong_size); }), "5 values for parameter 0"));
  BOOST_TEST(wrong_size.w[0] == 7.0f);  // nothing written
  BOOST_TEST(wrong_size.b[0] == -7.0f);
  auto wrong_bias = make_model(5, 3, 7.0f);
  BOOST_TEST(contains(error_of([&] { a.get_model("model", wrong_bias); }), "parameter 1"));
  BOOST_TEST(wrong_bias.w[0] == 7.0f);  // parameter 0 fitted, but nothing is written before all fit
  auto no_buffer = make_model(5, 2, 7.0f);
  no_buffer.running.push_back(3.0);
  BOOST_TEST(contains(error_of([&] { a.get_model("model", no_buffer); }), "buffer 0"));
  double_model dm;
  BOOST_TEST(contains(error_of([&] { a.get_model("model", dm); }), "4-byte parameters"));
}

BOOST_AUTO_TEST_CASE(file_round_trip_and_atomic_replacement) {
  temp_dir dir;
  const auto file = dir.path / "state.dck";
  const auto a = sample_archive();
  ckpt::save(file, a);
  BOOST_TEST((ckpt::load(file) == a));
  // Replacing leaves only the new file: no temporary files behind.
  ckpt::archive b;
  b.put("step", std::int64_t{7});
  ckpt::save(file, b);
  BOOST_TEST(ckpt::load(file).get<std::int64_t>("step") == 7);
  BOOST_TEST(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator{}) == 1);
  // A save that cannot happen leaves the previous file as it was.
  BOOST_TEST(contains(error_of([&] { ckpt::save(dir.path / "missing" / "x.dck", a); }), "cannot create"));
  BOOST_TEST(ckpt::load(file).get<std::int64_t>("step") == 7);
  BOOST_TEST(contains(error_of([&] { (void)ckpt::load(dir.path / "absent.dck"); }), "cannot open"));
}

BOOST_AUTO_TEST_CASE(every_kind_of_damage_is_refused) {
  temp_dir dir;
  const auto file = dir.path / "state.dck";
  ckpt::save(file, sample_archive());
  const auto good = read_file(file);
  auto load_bytes = [&](const std::vector<char>& bytes) {
    write_file(file, bytes);
    return error_of([&] { (void)ckpt::load(file); });
  };
  // Every single flipped bit is caught (by the magic, version, byte-order or checksum check).
  for (std::size_t i = 0; i < good.size(); ++i) {
    auto bad = good;
    bad[i] = static_cast<char>(bad[i] ^ (1 << (i % 8)));
    const auto e = load_bytes(bad);
    BOOST_TEST_REQUIRE(e != "no error", "flipping a bit of byte " << i << " went unnoticed");
  }
  // Every truncation is caught.
  for (std::size_t n = 0; n < good.size(); n += 1 + n / 8) {
    const auto e = load_bytes(std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)));
    BOOST_TEST_REQUIRE(e != "no error", "a file cut to " << n << " bytes went unnoticed");
  }
  BOOST_TEST(contains(load_bytes({'n', 'o', 't', ' ', 'a', ' ', 'c', 'k', 'p', 't', '!', '!'}), "bad magic"));
  BOOST_TEST(contains(load_bytes(std::vector<char>(good.begin(), good.end() - 1)), "checksum"));
  auto later = good;
  later[8] = 2;  // version 2
  BOOST_TEST(contains(load_bytes(later), "version 2"));
}

BOOST_AUTO_TEST_CASE(checksummed_but_inconsistent_bytes_are_refused) {
  // A file whose checksum is right but whose lengths lie (a writer bug, or crafted input) is refused
  // by the bounds checks, not read past its end.
  auto bytes = ckpt::serialize(sample_archive());
  auto reseal = [](std::vector<std::byte> b) {
    b.resize(b.size() - 4);
    const auto crc = ckpt::detail::crc32(b);
    const auto* c = reinterpret_cast<const std::byte*>(&crc);
    b.insert(b.end(), c, c + 4);
    return b;
  };
  auto huge_count = bytes;
  huge_count[16] = std::byte{0xff};  // section count
  BOOST_TEST(contains(error_of([&] { (void)ckpt::parse(reseal(huge_count), "crafted"); }), "truncated"));
  auto extra = bytes;
  extra.insert(extra.end() - 4, std::byte{0});
  BOOST_TEST(contains(error_of([&] { (void)ckpt::parse(reseal(extra), "crafted"); }), "after its last section"));
}

BOOST_AUTO_TEST_CASE(directory_keeps_the_newest_and_skips_a_torn_one) {
  temp_dir dir;
  ckpt::directory d{dir.path / "run", 2};
  BOOST_TEST(!d.latest().has_value());
  BOOST_TEST(!d.load_latest().has_value());
  for (std::int64_t step : {10, 20, 30}) {
    ckpt::archive a;
    a.put("step", step);
    d.save(step, a);
  }
  const auto steps = d.steps();
  BOOST_TEST_REQUIRE(steps.size() == 2u);  // keep = 2
  BOOST_TEST(steps[0].first == 30);
  BOOST_TEST(steps[1].first == 20);
  BOOST_TEST(d.latest()->filename().string() == "ckpt-0000000030.dck");
  // The newest torn by a crash mid-copy: the one before is used.
  auto bytes = read_file(steps[0].second);
  bytes.resize(bytes.size() / 2);
  write_file(steps[0].second, bytes);
  std::vector<ckpt::skipped_file> skipped;
  BOOST_TEST(d.load_latest(&skipped)->get<std::int64_t>("step") == 20);
  BOOST_TEST_REQUIRE(skipped.size() == 1u);
  BOOST_TEST(skipped[0].file == steps[0].second);
  // Files that are not checkpoints are ignored.
  write_file(dir.path / "run" / "notes.txt", {'x'});
  write_file(dir.path / "run" / "ckpt-abc.dck", {'x'});
  BOOST_TEST(d.steps().size() == 2u);
  BOOST_CHECK_THROW(ckpt::directory(dir.path, 0), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(corrupt_checkpoints_never_displace_new_ones) {
  temp_dir dir;
  ckpt::directory d{dir.path, 2};
  // Every checkpoint corrupt, at higher steps than the run restarted from 0 will write.
  for (std::int64_t step : {100, 200, 300})
    write_file(dir.path / ckpt::directory::file_name(step), {'D', 'C', 'K', 'x'});
  std::vector<ckpt::directory::skipped_file> skipped;
  BOOST_CHECK_THROW(d.load_latest_with_path(&skipped), ckpt::no_loadable_checkpoint);
  BOOST_TEST(skipped.size() == 3u);
  BOOST_TEST(contains(skipped[0].reason, "ckpt-0000000300.dck"));
  for (std::int64_t step : {10, 20, 30}) {
    ckpt::archive a;
    a.put("step", step);
    d.save(step, a);
    BOOST_TEST(d.load_latest()->get<std::int64_t>("step") == step);  // the new one is kept, and is the latest
  }
  const auto steps = d.steps();
  BOOST_TEST_REQUIRE(steps.size() == 2u);  // the corrupt ones removed, the newest 2 kept
  BOOST_TEST(steps[0].first == 30);
  BOOST_TEST(steps[1].first == 20);
  // An intact checkpoint of a later step (another history) is left alone and not counted.
  ckpt::archive later;
  later.put("step", std::int64_t{500});
  ckpt::save(dir.path / ckpt::directory::file_name(500), later);
  ckpt::archive a;
  a.put("step", std::int64_t{40});
  d.save(40, a);
  BOOST_TEST(d.steps().size() == 3u);  // 500, 40, 30
  BOOST_TEST(fs::exists(dir.path / ckpt::directory::file_name(30)));
  BOOST_TEST(!fs::exists(dir.path / ckpt::directory::file_name(20)));
}

BOOST_AUTO_TEST_CASE(a_directory_of_only_corrupt_checkpoints_is_an_error_not_a_fresh_start) {
  temp_dir dir;
  ckpt::directory d{dir.path / "run"};
  auto file = [&](std::int64_t step) { return d.path() / ckpt::directory::file_name(step); };
  // No directory, an empty one, one without checkpoint files: nothing to resume, a fresh start.
  BOOST_TEST(!d.load_latest().has_value());
  fs::create_directories(d.path());
  BOOST_TEST(!d.load_latest().has_value());
  write_file(d.path() / "notes.txt", {'x'});
  BOOST_TEST(!d.latest().has_value());
  // Two checkpoints, both damaged: one torn mid-write, one that is not a checkpoint at all.
  ckpt::archive a;
  a.put("step", std::int64_t{10});
  d.save(10, a);
  auto bytes = read_file(file(10));
  bytes.resize(bytes.size() - 3);
  write_file(file(10), bytes);
  write_file(file(20), {'n', 'o', 'p', 'e'});
  try {
    (void)d.load_latest();
    BOOST_FAIL("load_latest started over from a directory of damaged checkpoints");
  } catch (const ckpt::no_loadable_checkpoint& e) {
    const std::string what = e.what();
    BOOST_TEST(contains(what, "no checkpoint in " + d.path().string() + " loads (2 files)"), what);
    BOOST_TEST(contains(what, "\n  " + file(20).string() + ": not a distribute checkpoint (bad magic)"), what);
    BOOST_TEST(contains(what, "\n  " + file(10).string() + ": checksum mismatch"), what);
    BOOST_TEST(e.dir == d.path());
    BOOST_TEST_REQUIRE(e.files.size() == 2u);
    BOOST_TEST(e.files[0].file == file(20));  // newest first
    BOOST_TEST(e.files[1].file == file(10));
  }
  // Every entry point refuses, as a checkpoint_error; the caller's list gets the files too.
  std::vector<ckpt::skipped_file> skipped;
  BOOST_CHECK_THROW(d.latest(&skipped), ckpt::checkpoint_error);
  BOOST_TEST(skipped.size() == 2u);
  BOOST_CHECK_THROW(d.load_latest_with_path(), ckpt::no_loadable_checkpoint);
  // An intact older checkpoint is what a resume takes, past both.
  ckpt::archive older;
  older.put("step", std::int64_t{5});
  ckpt::save(file(5), older);
  skipped.clear();
  BOOST_TEST(d.load_latest(&skipped)->get<std::int64_t>("step") == 5);
  BOOST_TEST(skipped.size() == 2u);
}

BOOST_AUTO_TEST_CASE(skipped_checkpoints_are_reported_on_stderr_unless_the_caller_takes_them) {
  temp_dir dir;
  ckpt::directory d{dir.path};
  ckpt::archive a;
  a.put("step", std::int64_t{10});
  d.save(10, a);
  write_file(dir.path / ckpt::directory::file_name(20), {'n', 'o', 'p', 'e'});
  std::optional<ckpt::archive> found;
  const std::string printed = stderr_of([&] { found = d.load_latest(); });
  BOOST_TEST_REQUIRE(found.has_value());
  BOOST_TEST(found->get<std::int64_t>("step") == 10);
  BOOST_TEST(contains(printed, "distribute: warning: skipped a checkpoint that does not load (" +
                                   (dir.path / ckpt::directory::file_name(20)).string() +
                                   ": not a distribute checkpoint (bad magic)); loaded " +
                                   (dir.path / ckpt::directory::file_name(10)).string() + " instead\n"),
             printed);
  // Given a list, the files go there and nothing is printed.
  std::vector<ckpt::skipped_file> skipped;
  const std::string quiet = stderr_of([&] { found = d.load_latest(&skipped); });
  BOOST_TEST(quiet.empty(), quiet);
  BOOST_TEST(found->get<std::int64_t>("step") == 10);
  BOOST_TEST_REQUIRE(skipped.size() == 1u);
  BOOST_TEST(skipped[0].file == dir.path / ckpt::directory::file_name(20));
  BOOST_TEST(contains(skipped[0].reason, "bad magic"));
  // Nothing skipped, nothing printed.
  fs::remove(dir.path / ckpt::directory::file_name(20));
  BOOST_TEST(stderr_of([&] { found = d.load_latest(); }).empty());
}

BOOST_AUTO_TEST_CASE(temporaries_of_killed_writers_are_removed) {
  temp_dir dir;
  // A process that has exited: its pid is free (until reused, which only keeps its file).
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status = 0;
  ::waitpid(child, &status, 0);
  const auto dead = dir.path / ("ckpt-0000000010.dck.tmp-" + std::to_string(child) + "-0");
  const auto mine = dir.path / ("ckpt-0000000020.dck.tmp-" + std::to_string(::getpid()) + "-7");
  const auto alive = dir.path / ("losses.csv.tmp-" + std::to_string(::getppid()) + "-1");
  const auto other = dir.path / "notes.tmp-x-1";
  for (const auto& p : {dead, mine, alive, other}) write_file(p, {'x'});
  ckpt::directory d{dir.path};
  const auto removed = d.remove_stale_temporaries();
  BOOST_TEST_REQUIRE(removed.size() == 1u);
  BOOST_TEST(removed[0] == dead);
  BOOST_TEST(!fs::exists(dead));
  BOOST_TEST(fs::exists(mine));   // this process may be writing it
  BOOST_TEST(fs::exists(alive));  // a running process may be writing it
  BOOST_TEST(fs::exists(other));  // not a temporary's name
  // save cleans up too.
  write_file(dead, {'x'});
  ckpt::archive a;
  a.put("step", std::int64_t{1});
  d.save(1, a);
  BOOST_TEST(!fs::exists(dead));
}

BOOST_AUTO_TEST_CASE(many_sections_load_in_linear_time) {
  // 200,000 sections: with a linear scan per name this took minutes.
  ckpt::archive a;
  for (int i = 0; i < 200'000; ++i) a.put(std::string("s").append(std::to_string(i)), static_cast<std::uint8_t>(i));
  const auto bytes = ckpt::serialize(a);
  const auto t0 = std::chrono::steady_clock::now();
  const auto b = ckpt::parse(bytes, "many");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST((b == a));
  BOOST_TEST(b.get<std::uint8_t>("s199999") == static_cast<std::uint8_t>(199999));
  BOOST_TEST(seconds < 10.0);
  std::printf("parsed %zu sections (%zu bytes) in %.3f s\n", b.sections().size(), bytes.size(), seconds);
}

BOOST_AUTO_TEST_CASE(load_reads_only_regular_files_within_the_limit) {
  temp_dir dir;
  ckpt::save(dir.path / "a.dck", sample_archive());
  const auto size = fs::file_size(dir.path / "a.dck");
  BOOST_TEST(contains(error_of([&] { (void)ckpt::load(dir.path / "a.dck", size - 1); }), "more than the limit of"));
  BOOST_TEST((ckpt::load(dir.path / "a.dck", size) == sample_archive()));
  BOOST_TEST(contains(error_of([&] { (void)ckpt::load("/dev/zero"); }), "not a regular file"));
  BOOST_TEST(contains(error_of([&] { (void)ckpt::load(dir.path); }), "not a regular file"));
  // write_atomically leaves the whole file and no temporary.
  ckpt::write_atomically(dir.path / "log.csv", std::string_view("a,b\n1,2\n"));
  BOOST_TEST(read_file(dir.path / "log.csv").size() == 8u);
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir.path)) ++files;
  BOOST_TEST(files == 2u);
}

BOOST_AUTO_TEST_SUITE_END()
