#pragma once
// The `dataset` concept and what every dataset gets from `dataset_base`.
//
// A dataset is a value (cheap to copy: sources share their immutable data) that can be read any
// number of times. `d.cursor(epoch)` starts one pass and returns a cursor whose `next()` gives
// `std::optional<element_type>` until the pass ends. Transforms are lazy: `d.map(f)` stores `d` and
// `f` in a new type and does nothing until a cursor pulls, so a whole pipeline is one concrete type
// and the per-element path has no virtual calls.
//
// The epoch number is passed down to every stage so that `shuffle` draws a fresh permutation each
// epoch while staying a pure function of (seed, epoch): a resumed run can ask for epoch 7 directly
// with `d.epoch(7)`. Range-for over a dataset (`begin()`) reads the next epoch each time, as
// iterating a tf.data dataset again does.

#include <distribute/data/tensor.hpp>
#include <distribute/detail/activity.hpp>

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

namespace distribute::data {

// Cardinality: the number of elements of one pass, or one of these.
inline constexpr std::int64_t infinite_cardinality = -1;
inline constexpr std::int64_t unknown_cardinality = -2;

template <class C, class E>
concept cursor_of = std::move_constructible<C> && requires(C& c) {
  { c.next() } -> std::same_as<std::optional<E>>;
};

template <class D>
concept dataset = std::copy_constructible<D> && requires(const D& d, std::uint64_t epoch) {
  typename D::element_type;
  { d.cursor(epoch) } -> cursor_of<typename D::element_type>;
  { d.cardinality() } -> std::convertible_to<std::int64_t>;
};

template <dataset D>
using element_t = typename D::element_type;
template <dataset D>
using cursor_t = decltype(std::declval<const D&>().cursor(std::uint64_t{}));

// A dataset whose source reads files, so that workers can each read their own subset
// (shard_policy::file): `shard_files(index, count)` returns the same pipeline reading only the
// files `i` with `i % count == index`.
template <class D>
concept file_shardable = dataset<D> && requires(const D& d, std::size_t i) {
  { d.file_count() } -> std::convertible_to<std::size_t>;
  { d.shard_files(i, i) } -> std::same_as<D>;
};

enum class remainder { keep, drop };
inline constexpr remainder keep_remainder = remainder::keep;
inline constexpr remainder drop_remainder = remainder::drop;

inline constexpr std::int64_t forever = -1;

// An input iterator over one pass. It owns the cursor (behind a pointer, so the iterator stays cheap
// to move); abandoning it destroys the cursor, which is how a prefetching pass learns to stop.
template <class C, class E>
class cursor_iterator {
 public:
  using value_type = E;
  using difference_type = std::ptrdiff_t;
  using iterator_concept = std::input_iterator_tag;

  cursor_iterator() = default;
  explicit cursor_iterator(C cursor) : state_(std::make_unique<state>(std::move(cursor))) { ++*this; }

  E& operator*() const { return *state_->current; }
  E* operator->() const { return &*state_->current; }
  // The wait for the next element is the process's input wait (step_timings.hpp).
  cursor_iterator& operator++() {
    const distribute::detail::activity_scope<distribute::detail::activity::input_wait> waiting;
    state_->current = state_->cursor.next();
    return *this;
  }
  void operator++(int) { ++*this; }
  friend bool operator==(const cursor_iterator& it, std::default_sentinel_t) noexcept {
    return !it.state_ || !it.state_->current;
  }

 private:
  struct state {
    explicit state(C c) : cursor(std::move(c)) {}
    C cursor;
    std::optional<E> current;
  };
  std::unique_ptr<state> state_;
};

template <class D>
class epoch_view;

template <dataset D, class F>
class map_dataset;
template <dataset D, class P>
class filter_dataset;
template <dataset D>
class shuffle_dataset;
template <dataset D>
class batch_dataset;
template <dataset D>
class repeat_dataset;
template <dataset D>
class take_dataset;
template <dataset D>
class skip_dataset;
template <dataset D>
class cache_dataset;
template <dataset D>
class prefetch_dataset;

// The transforms as members, so that pipelines read left to right. Each returns a new dataset and
// leaves this one unchanged.
template <class Derived>
class dataset_base {
 public:
  // Applies `fn` to every element. Under prefetch(n, threads > 1), the map directly beneath the
  // prefetch runs on several threads at once, so `fn` must be safe to call concurrently.
  template <class F>
  auto map(F fn) const {
    return map_dataset<Derived, F>(self(), std::move(fn));
  }
  // Keeps the elements for which `pred` is true.
  template <class P>
  auto filter(P pred) const {
    return filter_dataset<Derived, P>(self(), std::move(pred));
  }
  // Reorders the elements through a buffer of `buffer` (a buffer at least as large as the dataset
  // gives a uniform permutation). Each epoch draws a fresh order derived from (seed, epoch).
  auto shuffle(std::size_t buffer, std::uint64_t seed) const { return shuffle_dataset<Derived>(self(), buffer, seed); }
  // Groups `n` consecutive elements; a short last group is kept or dropped.
  auto batch(std::size_t n, remainder policy = keep_remainder) const {
    return batch_dataset<Derived>(self(), n, policy);
  }
  // Reads the dataset `count` times (data::forever: without end); repetition i is epoch
  // `epoch * count + i` of the input, so a shuffle beneath reshuffles each time.
  auto repeat(std::int64_t count = forever) const { return repeat_dataset<Derived>(self(), count); }
  auto take(std::size_t n) const { return take_dataset<Derived>(self(), n); }
  auto skip(std::size_t n) const { return skip_dataset<Derived>(self(), n); }
  // Keeps the elements of the first complete pass in memory and replays them afterwards. Copies of
  // the returned dataset share the cache.
  auto cache() const { return cache_dataset<Derived>(self()); }
  // Prepares up to `buffer` elements ahead on `threads` background threads, in order.
  auto prefetch(std::size_t buffer, std::size_t threads = 1) const {
    return prefetch_dataset<Derived>(self(), buffer, threads);
  }

  // One pass, epoch `e`, as a range.
  epoch_view<Derived> epoch(std::uint64_t e) const { return epoch_view<Derived>(self(), e); }
  // Range-for reads epoch 0, then 1, ... each time it starts: every loop over the dataset is a new
  // epoch. Not thread-safe (the count is a member of this value); use epoch(e) from several threads.
  auto begin() { return make_iterator(self(), next_epoch_++); }
  std::default_sentinel_t end() const noexcept { return {}; }

  template <class D>
  static auto make_iterator(const D& d, std::uint64_t e) {
    return cursor_iterator<cursor_t<D>, element_t<D>>(d.cursor(e));
  }

 private:
  const Derived& self() const noexcept { return static_cast<const Derived&>(*this); }
  std::uint64_t next_epoch_ = 0;
};

template <class D>
class epoch_view {
 public:
  epoch_view(D d, std::uint64_t e) : d_(std::move(d)), epoch_(e) {}
  auto begin() const { return dataset_base<D>::make_iterator(d_, epoch_); }
  std::default_sentinel_t end() const noexcept { return {}; }

 private:
  D d_;
  std::uint64_t epoch_;
};

namespace detail {
// splitmix64: mixes a seed and an epoch into well-spread bits, so that nearby seeds give unrelated
// streams.
inline std::uint64_t mix(std::uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
inline std::uint64_t mix(std::uint64_t a, std::uint64_t b) noexcept { return mix(a ^ mix(b + 0x632be59bd9b4e019ull)); }

// A small, fast generator with a bounded draw that is the same on every standard library (unlike
// std::uniform_int_distribution), so a seed gives the same order everywhere.
struct rng {
  std::uint64_t state;
  std::uint64_t next() noexcept { return state = mix(state); }
  // Uniform in [0, n) for 0 < n < 2^32 (multiply-shift on the high 32 bits; no division).
  std::size_t below(std::size_t n) noexcept { return static_cast<std::size_t>(((next() >> 32) * n) >> 32); }
};

inline std::int64_t min_cardinality(std::int64_t a, std::int64_t b) noexcept {
  if (a == unknown_cardinality || b == unknown_cardinality) return unknown_cardinality;
  if (a == infinite_cardinality) return b;
  if (b == infinite_cardinality) return a;
  return a < b ? a : b;
}
}  // namespace detail

}  // namespace distribute::data

#include <distribute/data/batch.hpp>
#include <distribute/data/cache.hpp>
#include <distribute/data/map.hpp>
#include <distribute/data/prefetch.hpp>
#include <distribute/data/repeat.hpp>
#include <distribute/data/shuffle.hpp>
#include <distribute/data/take_skip.hpp>
#include <distribute/data/zip.hpp>
