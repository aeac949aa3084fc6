#pragma once
// `prefetch(buffer, threads)`: background threads prepare up to `buffer` elements ahead of the
// consumer, who receives them in the input's order.
//
// With threads > 1 the work that is spread is the `map` directly beneath the prefetch (after map
// fusion: every map stacked there; image_folder's decoding is such a map): the threads take turns pulling the map's input, one element at a
// time and in order, and then run the map function concurrently; a reorder ring hands results out in
// order. Without a map beneath, extra threads only take turns.
//
// Shutdown: destroying the cursor (an iterator abandoned early, a loop left by `break` or an
// exception) stops the threads and joins them before the cursor's state goes away. An exception
// thrown while preparing element k is rethrown by the consumer's k-th `next()`, after elements
// 0..k-1; the pass then ends.

#include <distribute/data/dataset.hpp>
#include <distribute/data/map.hpp>

#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

namespace distribute::data {

namespace detail {
struct identity {
  template <class X>
  X operator()(X&& x) const {
    return std::forward<X>(x);
  }
};

// What a prefetch pulls from and what it then runs on its threads.
template <class D>
struct prefetch_source {
  using upstream = D;
  using function = identity;
  static const D& input(const D& d) { return d; }
  static identity function_of(const D&) { return {}; }
};
// A map (map_dataset, or a source built as one, such as image_folder): its input and function.
template <class D>
concept mapped = requires(const D& d) {
  typename D::input_type;
  typename D::function_type;
  { d.input() } -> std::same_as<const typename D::input_type&>;
  { d.function() } -> std::same_as<const typename D::function_type&>;
};
template <mapped D>
struct prefetch_source<D> {
  using upstream = typename D::input_type;
  using function = typename D::function_type;
  static const upstream& input(const D& d) { return d.input(); }
  static const function& function_of(const D& d) { return d.function(); }
};
}  // namespace detail

template <dataset D>
class prefetch_dataset : public dataset_base<prefetch_dataset<D>> {
  using source = detail::prefetch_source<D>;
  using upstream = typename source::upstream;
  using function = typename source::function;

 public:
  using element_type = element_t<D>;

  prefetch_dataset(D input, std::size_t buffer, std::size_t threads)
      : input_(std::move(input)), buffer_(buffer), threads_(threads) {
    if (buffer == 0) throw std::invalid_argument("distribute::data: prefetch needs a buffer of at least 1 element");
    if (threads == 0) throw std::invalid_argument("distribute::data: prefetch needs at least 1 thread");
  }

  class cursor_type {
    static constexpr std::uint64_t none = std::numeric_limits<std::uint64_t>::max();

    struct state {
      state(cursor_t<upstream> up, std::size_t capacity) : up(std::move(up)), ring(capacity) {}

      std::mutex up_m;  // order of pulls from upstream; held while reserving a sequence number
      cursor_t<upstream> up;

      std::mutex m;  // everything below
      std::condition_variable space, ready;
      std::vector<std::optional<element_type>> ring;  // element k in slot k % size
      std::uint64_t issued = 0, consumed = 0, end = none, error_at = none;
      std::exception_ptr error;
      bool stop = false, failed = false;

      void fail(std::uint64_t seq) {
        std::lock_guard lock(m);
        if (seq < error_at) {
          error_at = seq;
          error = std::current_exception();
        }
        if (seq + 1 < end) end = seq + 1;
        ready.notify_all();
        space.notify_all();
      }

      void work(function fn) {
        for (;;) {
          std::optional<element_t<upstream>> raw;
          std::uint64_t seq = 0;
          {
            std::lock_guard up_lock(up_m);
            {
              std::unique_lock lock(m);
              space.wait(lock, [&] { return stop || issued >= end || issued < consumed + ring.size(); });
              if (stop || issued >= end) return;
              seq = issued++;
            }
            try {
              raw = up.next();
            } catch (...) {
              fail(seq);
              return;
            }
            if (!raw) {
              std::lock_guard lock(m);
              if (seq < end) end = seq;
              ready.notify_all();
              space.notify_all();
              return;
            }
          }
          try {
            element_type value(std::invoke(fn, std::move(*raw)));
            std::lock_guard lock(m);
            ring[seq % ring.size()].emplace(std::move(value));
            ready.notify_all();
          } catch (...) {
            fail(seq);
            return;
          }
        }
      }
    };

   public:
    cursor_type(cursor_t<upstream> up, function fn, std::size_t buffer, std::size_t threads)
        : state_(std::make_unique<state>(std::move(up), buffer)) {
      threads_.reserve(threads);
      try {
        for (std::size_t i = 0; i < threads; ++i) threads_.emplace_back([s = state_.get(), fn] { s->work(fn); });
      } catch (...) {
        shut_down();
        throw;
      }
    }
    cursor_type(cursor_type&&) noexcept = default;
    cursor_type& operator=(cursor_type&& other) noexcept {
      if (this != &other) {
        shut_down();
        state_ = std::move(other.state_);
        threads_ = std::move(other.threads_);
      }
      return *this;
    }
    ~cursor_type() { shut_down(); }

    std::optional<element_type> next() {
      state& s = *state_;
      std::unique_lock lock(s.m);
      if (s.failed) return std::nullopt;
      auto& slot = s.ring[s.consumed % s.ring.size()];
      s.ready.wait(lock, [&] { return slot.has_value() || s.consumed == s.error_at || s.consumed >= s.end; });
      if (slot) {
        std::optional<element_type> out(std::move(*slot));
        slot.reset();
        ++s.consumed;
        s.space.notify_all();
        return out;
      }
      if (s.consumed == s.error_at) {
        s.failed = true;
        std::rethrow_exception(s.error);
      }
      return std::nullopt;
    }

   private:
    void shut_down() noexcept {
      if (!state_) return;
      {
        std::lock_guard lock(state_->m);
        state_->stop = true;
      }
      state_->space.notify_all();
      state_->ready.notify_all();
      for (auto& t : threads_)
        if (t.joinable()) t.join();
      threads_.clear();
    }

    std::unique_ptr<state> state_;
    std::vector<std::thread> threads_;
  };

  cursor_type cursor(std::uint64_t epoch) const {
    return {source::input(input_).cursor(epoch), function(source::function_of(input_)), buffer_, threads_};
  }
  std::int64_t cardinality() const { return input_.cardinality(); }

  std::size_t file_count() const
    requires file_shardable<D>
  {
    return input_.file_count();
  }
  prefetch_dataset shard_files(std::size_t index, std::size_t count) const
    requires file_shardable<D>
  {
    return {input_.shard_files(index, count), buffer_, threads_};
  }

  std::size_t buffer() const noexcept { return buffer_; }
  std::size_t threads() const noexcept { return threads_; }

 private:
  D input_;
  std::size_t buffer_;
  std::size_t threads_;
};

}  // namespace distribute::data
