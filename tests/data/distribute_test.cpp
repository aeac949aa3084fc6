// strategy.distribute: the split of a global batch over replicas, uneven last batches, sharding
// across workers under every policy, distribute_from_function; for one_device_strategy and for
// mirrored_strategy with 1 to 4 replicas, and through strategy.run.

#include <distribute/distribute.hpp>
#include <distribute/data.hpp>

#include <boost/mpl/list.hpp>
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <stdexcept>
#include <vector>

namespace dist = distribute;
namespace data = distribute::data;

namespace {

struct one_device {
  static constexpr std::size_t replicas = 1;
  static dist::one_device_strategy<> make() { return {}; }
};
template <std::size_t N>
struct mirrored_n {
  static constexpr std::size_t replicas = N;
  static dist::mirrored_strategy<> make() { return dist::mirrored_strategy<>{dist::cpu_replicas(static_cast<int>(N))}; }
};
using strategies = boost::mpl::list<one_device, mirrored_n<1>, mirrored_n<2>, mirrored_n<3>, mirrored_n<4>>;

// Examples whose image holds their own index, so that a part's content says where it came from.
data::tensor_slices_dataset<float> indexed_examples(std::size_t n) {
  data::tensor<float> t{{n, 2}, {}};
  std::vector<std::int32_t> labels;
  for (std::size_t i = 0; i < n; ++i) {
    t.values.push_back(static_cast<float>(i));
    t.values.push_back(static_cast<float>(i) + 0.5f);
    labels.push_back(static_cast<std::int32_t>(i % 10));
  }
  return data::from_tensor_slices(std::move(t), std::move(labels));
}

std::vector<std::size_t> indices_of(const data::batch<float>& b) {
  std::vector<std::size_t> v;
  for (std::size_t i = 0; i < b.size(); ++i) {
    v.push_back(static_cast<std::size_t>(b[i][0]));
    BOOST_TEST(b[i][1] == b[i][0] + 0.5f);                                // rows stay whole
    BOOST_TEST(b.labels[i] == static_cast<std::int32_t>(v.back() % 10));  // labels stay with their rows
  }
  return v;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(distribute)

BOOST_AUTO_TEST_CASE_TEMPLATE(splits_each_global_batch_exactly, S, strategies) {
  auto strategy = S::make();
  const std::size_t n = S::replicas;
  for (std::size_t global : {n, 2 * n, 2 * n + 1, 4 * n + n - 1, std::size_t{5}, std::size_t{7}}) {
    const std::size_t last = global / 2;  // an uneven last batch (none for a global batch of 1)
    const std::size_t examples = 3 * global + last;
    const std::size_t batches = last ? 4 : 3;
    auto inputs = strategy.distribute(indexed_examples(examples).batch(global, data::keep_remainder));
    static_assert(dist::distributed_dataset<decltype(inputs)>);
    static_assert(std::is_same_v<dist::replica_batch_t<decltype(inputs)>, data::batch<float>>);
    BOOST_TEST(inputs.cardinality() == static_cast<std::int64_t>(batches));
    std::size_t step = 0, next_index = 0;
    for (auto& per : inputs) {
      BOOST_TEST_REQUIRE(per.size() == n);
      const std::size_t in_step = step < 3 ? global : last;
      std::vector<std::size_t> all;
      for (std::size_t r = 0; r < n; ++r) {
        const auto& part = per[r];
        const std::size_t expected = in_step / n + (r < in_step % n ? 1 : 0);
        BOOST_TEST(part.size() == expected, "global " << global << " step " << step << " replica " << r);
        BOOST_TEST(part.images.shape == (std::vector<std::size_t>{expected, 2}));  // empty parts keep the row shape
        BOOST_TEST(part.global_size == in_step);
        const auto idx = indices_of(part);
        all.insert(all.end(), idx.begin(), idx.end());
      }
      // The union, in replica order, is the global batch: nothing duplicated or lost.
      std::vector<std::size_t> want(in_step);
      std::iota(want.begin(), want.end(), next_index);
      BOOST_TEST(all == want);
      next_index += in_step;
      ++step;
    }
    BOOST_TEST(step == batches);
    BOOST_TEST(next_index == examples);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(feeds_strategy_run, S, strategies) {
  auto strategy = S::make();
  // 10 examples in global batches of 4: with several replicas the last step leaves some empty; every
  // replica still runs every step and the true counts add up to the global batch.
  auto inputs = strategy.distribute(indexed_examples(10).batch(4).map([](data::batch<float> b) { return b; }));
  int steps = 0;
  for (auto& per : inputs) {
    BOOST_TEST(per.size() == S::replicas);
    auto sums = strategy.run(
        [](dist::replica auto&, const data::batch<float>& b) {
          // A loss summed over the replica's examples, divided by the GLOBAL count.
          float s = 0;
          for (std::size_t i = 0; i < b.size(); ++i) s += b[i][0];
          return b.global_size ? s / static_cast<float>(b.global_size) : 0.0f;
        },
        per);
    const float step_mean = strategy.reduce(dist::reduce_op::sum, sums);
    const float start = static_cast<float>(4 * steps);
    const float count = steps < 2 ? 4.0f : 2.0f;
    BOOST_TEST(step_mean == start + (count - 1) / 2, boost::test_tools::tolerance(1e-5f));
    ++steps;
  }
  BOOST_TEST(steps == 3);
}

BOOST_AUTO_TEST_CASE(fewer_examples_than_replicas) {
  dist::mirrored_strategy<> strategy{dist::cpu_replicas(4)};
  auto inputs = strategy.distribute(indexed_examples(5).batch(8));
  std::vector<std::size_t> sizes;
  for (auto& per : inputs)
    for (auto& part : per) sizes.push_back(part.size());
  BOOST_TEST(sizes == (std::vector<std::size_t>{2, 1, 1, 1}));
  auto tiny = strategy.distribute(data::range(2).batch(8));  // std::vector batches
  sizes.clear();
  for (auto& per : tiny)
    for (auto& part : per) sizes.push_back(part.size());
  BOOST_TEST(sizes == (std::vector<std::size_t>{1, 1, 0, 0}));
}

BOOST_AUTO_TEST_CASE(zipped_domains_split_together) {
  dist::mirrored_strategy<> strategy{dist::cpu_replicas(3)};
  auto inputs = strategy.distribute(data::zip(indexed_examples(8), indexed_examples(20).skip(10)).batch(8));
  int steps = 0;
  for (auto& per : inputs) {
    for (std::size_t r = 0; r < 3; ++r) {
      const auto a = indices_of(per[r].first), b = indices_of(per[r].second);
      BOOST_TEST(a.size() == b.size());
      for (std::size_t i = 0; i < a.size(); ++i) BOOST_TEST(b[i] == a[i] + 10);
    }
    ++steps;
  }
  BOOST_TEST(steps == 1);
}

// Every worker, given its index, covers its share; together each example exactly once per epoch.
BOOST_AUTO_TEST_CASE(data_sharding_covers_each_example_once) {
  for (std::size_t workers : {1u, 2u, 3u, 4u}) {
    for (std::size_t replicas : {1u, 2u, 3u}) {
      dist::mirrored_strategy<> strategy{dist::cpu_replicas(static_cast<int>(replicas))};
      for (std::size_t global : {std::size_t{6}, std::size_t{7}, workers * replicas * 2}) {
        const std::size_t examples = 23;
        std::multiset<std::size_t> seen;
        std::vector<std::size_t> steps(workers, 0);
        for (std::size_t w = 0; w < workers; ++w) {
          auto inputs =
              strategy.distribute(indexed_examples(examples).shuffle(64, 11).batch(global),
                                  {.policy = data::shard_policy::data, .num_workers = workers, .worker_index = w});
          for (auto& per : inputs) {
            ++steps[w];
            for (auto& part : per)
              for (auto i : indices_of(part)) seen.insert(i);
          }
        }
        BOOST_TEST(seen.size() == examples, "workers " << workers << " replicas " << replicas << " global " << global);
        for (std::size_t i = 0; i < examples; ++i) BOOST_TEST(seen.count(i) == 1u);
        // Every worker runs the same number of steps (no worker waits for one that ran out).
        for (auto s : steps) BOOST_TEST(s == (examples + global - 1) / global);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(off_policy_gives_every_worker_everything) {
  dist::mirrored_strategy<> strategy{dist::cpu_replicas(2)};
  for (std::size_t w = 0; w < 3; ++w) {
    std::vector<std::size_t> seen;
    auto inputs = strategy.distribute(indexed_examples(9).batch(4),
                                      {.policy = data::shard_policy::off, .num_workers = 3, .worker_index = w});
    for (auto& per : inputs)
      for (auto& part : per)
        for (auto i : indices_of(part)) seen.push_back(i);
    std::vector<std::size_t> all(9);
    std::iota(all.begin(), all.end(), 0);
    BOOST_TEST(seen == all);
  }
}

BOOST_AUTO_TEST_CASE(file_policy_needs_files) {
  dist::one_device_strategy<> strategy;
  // In-memory data has no files: file sharding is an error, automatic falls back to data.
  auto ds = indexed_examples(10).batch(2);
  BOOST_CHECK_EXCEPTION(
      strategy.distribute(ds, {.policy = data::shard_policy::file, .num_workers = 2, .worker_index = 0}),
      std::invalid_argument, [](const std::invalid_argument& e) {
        return std::string(e.what()).find("cannot be sharded by file") != std::string::npos;
      });
  std::size_t n = 0;
  for (auto& per :
       strategy.distribute(ds, {.policy = data::shard_policy::automatic, .num_workers = 2, .worker_index = 1}))
    n += per[0].size();
  BOOST_TEST(n == 5u);
  // Bad worker options.
  BOOST_CHECK_THROW(strategy.distribute(ds, {.num_workers = 2, .worker_index = 2}), std::invalid_argument);
  BOOST_CHECK_THROW(strategy.distribute(ds, {.num_workers = 0}), std::invalid_argument);
  BOOST_CHECK_THROW(strategy.distribute(ds, {.prefetch = 0}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(distribute_from_function_gives_consecutive_batches_to_replicas) {
  dist::mirrored_strategy<> strategy{dist::cpu_replicas(3)};
  std::vector<data::input_context> contexts;
  auto inputs = strategy.distribute_from_function(
      [&contexts](const data::input_context& ctx) {
        contexts.push_back(ctx);
        const std::size_t per_replica = ctx.per_replica_batch_size(6);
        // Each input pipeline reads its own shard of the data.
        return indexed_examples(22)
            .filter([ctx](const data::example<float>& e) {
              return static_cast<std::size_t>(e.image.values[0]) % ctx.num_input_pipelines == ctx.input_pipeline_id;
            })
            .batch(per_replica);
      },
      {.num_workers = 2, .worker_index = 1});
  BOOST_TEST_REQUIRE(contexts.size() == 1u);
  BOOST_TEST(contexts[0].num_input_pipelines == 2u);
  BOOST_TEST(contexts[0].input_pipeline_id == 1u);
  BOOST_TEST(contexts[0].num_replicas_in_sync == 6u);
  // Worker 1 reads the 11 odd examples in batches of 1: steps of 3 replicas, the last one short.
  std::vector<std::vector<std::size_t>> steps;
  for (auto& per : inputs) {
    std::vector<std::size_t> step;
    for (auto& part : per) step.push_back(part.empty() ? 999 : indices_of(part)[0]);
    steps.push_back(step);
  }
  BOOST_TEST_REQUIRE(steps.size() == 4u);
  BOOST_TEST(steps[0] == (std::vector<std::size_t>{1, 3, 5}));
  BOOST_TEST(steps[3] == (std::vector<std::size_t>{19, 21, 999}));  // the missing replica gets an empty batch
  // A global batch that does not divide among the replicas is a clear error.
  BOOST_CHECK_EXCEPTION(strategy.distribute_from_function([](const data::input_context& ctx) {
    return indexed_examples(4).batch(ctx.per_replica_batch_size(8));
  }),
                        std::invalid_argument, [](const std::invalid_argument& e) {
                          return std::string(e.what()).find("global batch size 8 does not divide among 3 replicas") !=
                                 std::string::npos;
                        });
}

BOOST_AUTO_TEST_CASE(one_device_keeps_per_replica_in_place) {
  dist::one_device_strategy<> strategy;
  auto inputs = strategy.distribute(data::range(5).batch(2));
  static_assert(
      std::is_same_v<std::ranges::range_value_t<decltype(inputs)>, dist::per_replica<std::vector<std::int64_t>, 1>>);
  std::vector<std::int64_t> all;
  for (auto& per : inputs) all.insert(all.end(), per[0].begin(), per[0].end());
  BOOST_TEST(all == (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
}

BOOST_AUTO_TEST_CASE(parallel_prefetch_threads_give_the_same_steps) {
  dist::mirrored_strategy<> strategy{dist::cpu_replicas(2)};
  const auto pipeline = indexed_examples(101).shuffle(101, 3).batch(8).map([](data::batch<float> b) {
    for (auto& v : b.images.values) v = 2 * v + 1;
    return b;
  });
  auto collect = [&](std::size_t threads) {
    std::vector<float> out;
    auto inputs = strategy.distribute(pipeline, {.prefetch = 3, .prefetch_threads = threads});
    for (auto& per : inputs)
      for (auto& part : per) out.insert(out.end(), part.images.values.begin(), part.images.values.end());
    return out;
  };
  const auto one = collect(1);
  BOOST_TEST(one.size() == 202u);
  BOOST_TEST(collect(2) == one);
  BOOST_TEST(collect(4) == one);
}

BOOST_AUTO_TEST_SUITE_END()
