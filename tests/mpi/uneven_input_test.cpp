// Workers whose input runs out at different steps (files sharded over workers, 2W - 1 files for W
// workers: the last worker has one file fewer). The workers agree before every step, so none leaves
// the loop alone and its post-loop `strategy.reduce` never pairs with another worker's step; with
// `join` the short workers take part with empty batches until every worker is out, with
// `end_together` every worker stops at the first step one of them has nothing for. Under every shard
// policy, with one and two replicas per worker.

#include "mpi_test_support.hpp"

#include <distribute/data.hpp>

#include <boost/test/unit_test.hpp>

#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

namespace dist = distribute;
namespace data = distribute::data;
using strategy_type = dist::multi_worker_mirrored_strategy<dist::cpu, dist::mpi>;

namespace {

// This worker's own copy of the files (every worker writes the same ones): file i is a 4x4 RGB image
// whose every value is i + 1, so a pixel names its file.
struct image_files {
  std::filesystem::path dir;
  explicit image_files(int count) {
    dir = std::filesystem::temp_directory_path() /
          ("distribute_uneven_" + std::to_string(::getpid()) + "_" + std::to_string(dist::test::world_rank()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir / "a");
    for (int i = 0; i < count; ++i) {
      const std::vector<std::uint8_t> px(4 * 4 * 3, static_cast<std::uint8_t>(i + 1));
      char name[32];
      std::snprintf(name, sizeof name, "%03d.png", i);
      BOOST_TEST_REQUIRE(stbi_write_png((dir / "a" / name).string().c_str(), 4, 4, 3, px.data(), 4 * 3) != 0);
    }
  }
  ~image_files() { std::filesystem::remove_all(dir); }
  image_files(const image_files&) = delete;
  image_files& operator=(const image_files&) = delete;
};

strategy_type& with_replicas(int local) {
  auto make = [](int n) {
    return std::make_unique<strategy_type>(
        dist::multi_worker_options{.local_replicas = n, .mpi = dist::test::test_mpi_options()});
  };
  static const auto one = make(1);  // made in the same order on every worker
  static const auto two = make(2);
  return local == 1 ? *one : *two;
}

struct outcome {
  std::int64_t steps = 0;     // this worker's
  std::int64_t examples = 0;  // the job's, through strategy.reduce after the loop
  std::int64_t min_steps = 0, max_steps = 0;
  bool global_sizes_right = true;        // every part's global_size is the step's count across the job
  std::vector<std::int64_t> files_seen;  // the job's examples, by file (strategy.gather), sorted
};

outcome train_over(strategy_type& s, const std::filesystem::path& dir, data::shard_policy policy,
                   data::uneven_input mode) {
  const auto global = static_cast<std::size_t>(s.num_workers() * s.num_local_replicas());
  const auto ds = data::image_folder(dir.string()).batch(global);
  outcome o;
  std::vector<std::int64_t> mine;  // this worker's examples, by file
  for (auto& per : s.distribute(ds, {.policy = policy, .uneven = mode})) {
    ++o.steps;
    // A step of training: every replica all-reduces its example count (as gradients would be), and
    // the sum is what every part's global_size must say.
    const auto checks = s.run(
        [](dist::replica auto& r, const data::batch<std::uint8_t>& b) {
          std::vector<float> count{static_cast<float>(b.size())};
          {
            const dist::collective_label label("test step");
            r.all_reduce(dist::reduce_op::sum, count);
          }
          return static_cast<int>(b.global_size == static_cast<std::size_t>(count[0]));
        },
        per);
    for (int ok : checks) o.global_sizes_right = o.global_sizes_right && ok == 1;
    for (const auto& part : per)
      for (std::size_t i = 0; i < part.size(); ++i) mine.push_back(static_cast<std::int64_t>(part[i][0]));
  }
  // After the loop, as a program reports its epoch: these pair with each other, never with a step.
  const int first = s.first_replica_id();
  const auto counts = s.values_from_function(
      [&](int id) { return id == first ? static_cast<std::int64_t>(mine.size()) : std::int64_t{0}; });
  o.examples = s.reduce(dist::reduce_op::sum, counts);
  const auto steps = s.values_from_function([&](int) { return o.steps; });
  o.min_steps = s.reduce(dist::reduce_op::min, steps);
  o.max_steps = s.reduce(dist::reduce_op::max, steps);
  const auto seen = s.values_from_function([&](int id) { return id == first ? mine : std::vector<std::int64_t>{}; });
  o.files_seen = s.gather(seen);
  std::sort(o.files_seen.begin(), o.files_seen.end());
  return o;
}

constexpr data::shard_policy policies[] = {data::shard_policy::off, data::shard_policy::data, data::shard_policy::file,
                                           data::shard_policy::automatic};
const char* name_of(data::shard_policy p) {
  switch (p) {
    case data::shard_policy::off: return "off";
    case data::shard_policy::data: return "data";
    case data::shard_policy::file: return "file";
    case data::shard_policy::automatic: return "automatic";
  }
  return "?";
}

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

}  // namespace

BOOST_AUTO_TEST_SUITE(uneven_input)

BOOST_AUTO_TEST_CASE(workers_end_their_loops_together_under_every_policy) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int local : {1, 2}) {
    auto& s = with_replicas(local);
    const std::int64_t workers = s.num_workers(), L = local;
    // W * (L + 1) - 1 files: sharded by file, the last worker gets L files (one step of L examples),
    // the others L + 1 (two steps): the last worker runs out first.
    const std::int64_t files = workers * (L + 1) - 1;
    const image_files images(static_cast<int>(files));
    for (const auto policy : policies) {
      for (const auto mode : {data::uneven_input::join, data::uneven_input::end_together}) {
        BOOST_TEST_CONTEXT(workers << " workers x " << local << " replica(s), shard_policy::" << name_of(policy) << ", "
                                   << (mode == data::uneven_input::join ? "join" : "end_together")) {
          const outcome o = train_over(s, images.dir, policy, mode);
          // What each policy must give: steps on every worker, and examples across the job.
          std::int64_t want_steps = 0, want_examples = 0;
          if (policy == data::shard_policy::file || policy == data::shard_policy::automatic) {
            std::int64_t most = 0, least = files;
            for (std::int64_t w = 0; w < workers; ++w) {
              const std::int64_t mine = (files - w + workers - 1) / workers;  // files i with i % W == w
              most = std::max(most, ceil_div(mine, L));
              least = std::min(least, ceil_div(mine, L));
            }
            BOOST_TEST_REQUIRE(least < most);  // the case under test: uneven steps
            want_steps = mode == data::uneven_input::join ? most : least;
            want_examples = 0;
            for (std::int64_t w = 0; w < workers; ++w)
              want_examples += std::min((files - w + workers - 1) / workers, want_steps * L);
          } else {
            want_steps = ceil_div(files, workers * L);
            want_examples = policy == data::shard_policy::off ? workers * files : files;
          }
          BOOST_TEST(o.min_steps == o.max_steps);
          BOOST_TEST(o.steps == want_steps);
          BOOST_TEST(o.examples == want_examples);
          BOOST_TEST(o.global_sizes_right);
          BOOST_TEST(o.files_seen.size() == static_cast<std::size_t>(want_examples));
          if (mode == data::uneven_input::join && policy != data::shard_policy::off) {
            std::vector<std::int64_t> every(static_cast<std::size_t>(files));
            for (std::int64_t i = 0; i < files; ++i) every[static_cast<std::size_t>(i)] = i + 1;
            BOOST_TEST(o.files_seen == every, boost::test_tools::per_element());  // every file exactly once
          }
        }
      }
    }
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  BOOST_TEST(seconds < 30.0, "took " << seconds << " s");
}

BOOST_AUTO_TEST_SUITE_END()
