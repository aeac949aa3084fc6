// Element order and content of every transform on small synthetic data; shuffle's permutation,
// determinism and epochs; prefetch order, errors and early abandonment.

#include <distribute/data.hpp>

#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace data = distribute::data;

namespace {

template <class D>
auto collect(const D& d, std::uint64_t epoch = 0) {
  std::vector<data::element_t<D>> out;
  for (auto& e : d.epoch(epoch)) out.push_back(e);
  return out;
}

std::vector<std::int64_t> iota(std::int64_t from, std::int64_t to) {
  std::vector<std::int64_t> v;
  for (auto i = from; i < to; ++i) v.push_back(i);
  return v;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(transforms)

BOOST_AUTO_TEST_CASE(sources_from_memory) {
  BOOST_TEST(collect(data::range(5)) == iota(0, 5));
  BOOST_TEST(data::range(5).cardinality() == 5);
  BOOST_TEST(collect(data::range(0)).empty());
  const std::vector<int> v{7, 3, 9};
  BOOST_TEST(collect(data::from_vector(v)) == v);

  data::tensor<float> t{{3, 2}, {0, 1, 10, 11, 20, 21}};
  auto slices = collect(data::from_tensor_slices(t, {5, 6, 7}));
  BOOST_TEST_REQUIRE(slices.size() == 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    BOOST_TEST(slices[i].image.shape == std::vector<std::size_t>{2});
    BOOST_TEST(slices[i].image.values == (std::vector<float>{float(10 * i), float(10 * i + 1)}));
    BOOST_TEST(slices[i].label == static_cast<int>(5 + i));
  }
  BOOST_CHECK_THROW(data::from_tensor_slices(t, {1, 2}), std::invalid_argument);
  BOOST_CHECK_THROW(data::from_tensor_slices(data::tensor<float>{{2, 2}, {1, 2, 3}}), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(map_filter_take_skip) {
  auto sq = data::range(6).map([](std::int64_t x) { return x * x; });
  BOOST_TEST(collect(sq) == (std::vector<std::int64_t>{0, 1, 4, 9, 16, 25}));
  BOOST_TEST(sq.cardinality() == 6);
  // map of a map fuses into one stage, with the same result.
  auto twice = sq.map([](std::int64_t x) { return x + 1; });
  static_assert(data::is_map_dataset_v<decltype(twice)>);
  static_assert(std::is_same_v<decltype(twice.input()), const data::range_dataset&>);
  BOOST_TEST(collect(twice) == (std::vector<std::int64_t>{1, 2, 5, 10, 17, 26}));

  auto odd = data::range(10).filter([](std::int64_t x) { return x % 2 == 1; });
  BOOST_TEST(collect(odd) == (std::vector<std::int64_t>{1, 3, 5, 7, 9}));
  BOOST_TEST(odd.cardinality() == data::unknown_cardinality);

  BOOST_TEST(collect(data::range(10).take(3)) == iota(0, 3));
  BOOST_TEST(collect(data::range(10).skip(7)) == iota(7, 10));
  BOOST_TEST(collect(data::range(3).take(10)) == iota(0, 3));
  BOOST_TEST(collect(data::range(3).skip(10)).empty());
  BOOST_TEST(data::range(10).take(3).cardinality() == 3);
  BOOST_TEST(data::range(10).skip(7).cardinality() == 3);
  BOOST_TEST(data::range(3).skip(10).cardinality() == 0);
  BOOST_TEST(collect(data::range(10).skip(2).take(3)) == iota(2, 5));
}

BOOST_AUTO_TEST_CASE(batch_keep_and_drop) {
  auto keep = collect(data::range(7).batch(3));
  BOOST_TEST_REQUIRE(keep.size() == 3u);
  BOOST_TEST(keep[0] == iota(0, 3));
  BOOST_TEST(keep[1] == iota(3, 6));
  BOOST_TEST(keep[2] == iota(6, 7));
  BOOST_TEST(data::range(7).batch(3).cardinality() == 3);

  auto drop = collect(data::range(7).batch(3, data::drop_remainder));
  BOOST_TEST_REQUIRE(drop.size() == 2u);
  BOOST_TEST(drop[1] == iota(3, 6));
  BOOST_TEST(data::range(7).batch(3, data::drop_remainder).cardinality() == 2);
  BOOST_CHECK_THROW(data::range(7).batch(0), std::invalid_argument);

  // Examples stack into data::batch: images [n, ...] and labels in order.
  data::tensor<std::uint8_t> t{{5, 2, 1}, {}};
  for (int i = 0; i < 10; ++i) t.values.push_back(static_cast<std::uint8_t>(i));
  auto b = collect(data::from_tensor_slices(t, {0, 1, 2, 3, 4}).batch(2));
  BOOST_TEST_REQUIRE(b.size() == 3u);
  BOOST_TEST(b[0].images.shape == (std::vector<std::size_t>{2, 2, 1}));
  BOOST_TEST(b[0].images.values == (std::vector<std::uint8_t>{0, 1, 2, 3}));
  BOOST_TEST(b[1].labels == (std::vector<std::int32_t>{2, 3}));
  BOOST_TEST(b[2].images.shape == (std::vector<std::size_t>{1, 2, 1}));
  BOOST_TEST(b[2].size() == 1u);
  BOOST_TEST(b[2][0][1] == 9);

  // Examples of different shapes cannot be stacked.
  auto mixed = data::from_vector(std::vector<data::example<float>>{{{{2}, {1, 2}}, 0}, {{{3}, {1, 2, 3}}, 1}});
  BOOST_CHECK_THROW(collect(mixed.batch(2)), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(repeat_and_zip) {
  auto r = collect(data::range(3).repeat(3));
  BOOST_TEST(r == (std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 0, 1, 2}));
  BOOST_TEST(data::range(3).repeat(3).cardinality() == 9);
  BOOST_TEST(collect(data::range(3).repeat(0)).empty());
  BOOST_TEST(data::range(3).repeat().cardinality() == data::infinite_cardinality);
  auto forever = collect(data::range(3).repeat().take(8));
  BOOST_TEST(forever == (std::vector<std::int64_t>{0, 1, 2, 0, 1, 2, 0, 1}));
  // An empty dataset repeated forever ends instead of spinning.
  BOOST_TEST(collect(data::range(0).repeat()).empty());

  auto z = collect(data::zip(data::range(4), data::range(10).map([](std::int64_t x) { return x * 10; })));
  BOOST_TEST_REQUIRE(z.size() == 4u);
  for (std::int64_t i = 0; i < 4; ++i) {
    BOOST_TEST(z[static_cast<std::size_t>(i)].first == i);
    BOOST_TEST(z[static_cast<std::size_t>(i)].second == 10 * i);
  }
  BOOST_TEST(data::zip(data::range(4), data::range(10)).cardinality() == 4);
  BOOST_TEST(data::zip(data::range(4), data::range(2).repeat()).cardinality() == 4);
  // zip then batch gives a pair of batches.
  auto zb = collect(data::zip(data::range(5), data::range(5)).batch(2));
  BOOST_TEST_REQUIRE(zb.size() == 3u);
  BOOST_TEST(zb[1].first == iota(2, 4));
  BOOST_TEST(zb[2].second == iota(4, 5));
}

BOOST_AUTO_TEST_CASE(shuffle_is_a_deterministic_permutation_that_changes_each_epoch) {
  const auto ds = data::range(100).shuffle(100, 42);
  const auto e0 = collect(ds, 0), e1 = collect(ds, 1);
  auto sorted = e0;
  std::sort(sorted.begin(), sorted.end());
  BOOST_TEST(sorted == iota(0, 100));  // a permutation: nothing lost or duplicated
  BOOST_TEST(e0 != iota(0, 100));
  BOOST_TEST(collect(ds, 0) == e0);                                 // same seed and epoch, same order
  BOOST_TEST(collect(data::range(100).shuffle(100, 42), 0) == e0);  // from a fresh copy too
  BOOST_TEST(e1 != e0);                                             // a new order each epoch
  auto s1 = e1;
  std::sort(s1.begin(), s1.end());
  BOOST_TEST(s1 == iota(0, 100));
  BOOST_TEST(collect(data::range(100).shuffle(100, 43), 0) != e0);  // another seed, another order

  // Range-for reads a new epoch each time.
  auto looped = ds;
  std::vector<std::int64_t> first, second;
  for (auto x : looped) first.push_back(x);
  for (auto x : looped) second.push_back(x);
  BOOST_TEST(first == e0);
  BOOST_TEST(second == e1);

  // A small buffer still permutes, and keeps elements near their place (at most buffer-1 early).
  const auto local = collect(data::range(50).shuffle(4, 7));
  auto ls = local;
  std::sort(ls.begin(), ls.end());
  BOOST_TEST(ls == iota(0, 50));
  for (std::size_t i = 0; i < local.size(); ++i) BOOST_TEST(local[i] <= static_cast<std::int64_t>(i) + 3);

  // repeat beneath: each repetition of a shuffled dataset is a new order.
  const auto rep = collect(data::range(20).shuffle(20, 1).repeat(2));
  BOOST_TEST_REQUIRE(rep.size() == 40u);
  BOOST_TEST(!std::equal(rep.begin(), rep.begin() + 20, rep.begin() + 20));
  BOOST_CHECK_THROW(data::range(3).shuffle(0, 1), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(shuffle_is_roughly_uniform) {
  // Where element 0 lands over many epochs: every position about equally often.
  std::vector<int> where(10, 0);
  const auto ds = data::range(10).shuffle(10, 5);
  for (std::uint64_t e = 0; e < 5000; ++e) {
    const auto v = collect(ds, e);
    where[static_cast<std::size_t>(std::find(v.begin(), v.end(), 0) - v.begin())]++;
  }
  for (int n : where) BOOST_TEST((n > 380 && n < 620), "position count " << n << " of 5000 (expected about 500)");
}

BOOST_AUTO_TEST_CASE(cache_replays_the_first_complete_pass) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto cached = data::range(5)
                    .map([calls](std::int64_t x) {
                      ++*calls;
                      return x * 3;
                    })
                    .cache();
  BOOST_TEST(!cached.filled());
  // An abandoned pass caches nothing.
  for (auto x : cached.epoch(0)) {
    (void)x;
    break;
  }
  BOOST_TEST(!cached.filled());
  const auto first = collect(cached);
  BOOST_TEST(cached.filled());
  const int after_first = calls->load();
  const auto copy = cached;  // copies share the cache
  BOOST_TEST(collect(copy, 3) == first);
  BOOST_TEST(collect(cached, 1) == (std::vector<std::int64_t>{0, 3, 6, 9, 12}));
  BOOST_TEST(calls->load() == after_first);  // replayed, not recomputed
  // cache then shuffle: the cached elements in a new order each epoch.
  auto cs = cached.shuffle(5, 9);
  BOOST_TEST(collect(cs, 0) != collect(cs, 1));
}

BOOST_AUTO_TEST_CASE(prefetch_keeps_order_and_content) {
  for (std::size_t threads : {1u, 2u, 4u}) {
    for (std::size_t buffer : {1u, 3u, 16u}) {
      // A map with uneven cost, so that parallel threads finish out of order.
      auto ds = data::range(200)
                    .map([](std::int64_t x) {
                      if (x % 7 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
                      return x * 2;
                    })
                    .prefetch(buffer, threads);
      std::vector<std::int64_t> expected;
      for (std::int64_t i = 0; i < 200; ++i) expected.push_back(2 * i);
      BOOST_TEST(collect(ds) == expected, "threads " << threads << " buffer " << buffer);
      BOOST_TEST(ds.cardinality() == 200);
    }
  }
  // Without a map beneath, and over a shuffled, batched pipeline: the same as without prefetch.
  const auto plain = data::range(57).shuffle(20, 3).batch(4);
  BOOST_TEST(collect(plain.prefetch(2, 3), 4) == collect(plain, 4));
  BOOST_TEST(collect(data::range(0).prefetch(2)).empty());
  BOOST_CHECK_THROW(data::range(1).prefetch(0), std::invalid_argument);
  BOOST_CHECK_THROW(data::range(1).prefetch(1, 0), std::invalid_argument);
}

BOOST_AUTO_TEST_CASE(prefetch_rethrows_in_order) {
  for (std::size_t threads : {1u, 3u}) {
    auto ds = data::range(100)
                  .map([](std::int64_t x) {
                    if (x == 37) throw std::runtime_error("bad element 37");
                    return x;
                  })
                  .prefetch(8, threads);
    std::vector<std::int64_t> got;
    auto it = ds.epoch(0).begin();
    bool threw = false;
    try {
      for (; it != std::default_sentinel; ++it) got.push_back(*it);
    } catch (const std::runtime_error& e) {
      threw = std::string(e.what()) == "bad element 37";
    }
    BOOST_TEST(threw);
    BOOST_TEST(got == iota(0, 37));  // every element before the failing one, in order
  }
}

BOOST_AUTO_TEST_CASE(prefetch_abandoned_early_shuts_down) {
  // An endless, slow-ish source: the threads are busy or blocked on a full buffer when the consumer
  // walks away; destroying the iterator must stop and join them (TSan checks the hand-over).
  auto produced = std::make_shared<std::atomic<long>>(0);
  const auto endless = data::range(1000).repeat().map([produced](std::int64_t x) {
    produced->fetch_add(1);
    return x;
  });
  for (std::size_t threads : {1u, 2u}) {
    for (int trial = 0; trial < 20; ++trial) {
      auto ds = endless.prefetch(4, threads);
      int seen = 0;
      for (auto x : ds) {
        (void)x;
        if (++seen >= trial) break;
      }
      BOOST_TEST(seen == std::max(trial, 1));
    }
  }
  // After every iterator is gone nothing runs any more: the count stays still.
  const long settled = produced->load();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  BOOST_TEST(produced->load() == settled);
  // Iterators that are only created and dropped, or moved from.
  {
    auto ds = endless.prefetch(2, 2);
    auto a = ds.epoch(0).begin();
    auto b = std::move(a);
    BOOST_TEST(*b == 0);
  }
  BOOST_TEST(true);
}

BOOST_AUTO_TEST_SUITE_END()
