#pragma once
// `take(n)` and `skip(n)`: the first n elements of a pass, and all but them. Neither can be sharded
// by file (n is a count over the whole dataset), so a pipeline holding one shards by data.

#include <distribute/data/dataset.hpp>

#include <optional>
#include <utility>

namespace distribute::data {

template <dataset D>
class take_dataset : public dataset_base<take_dataset<D>> {
 public:
  using element_type = element_t<D>;
  take_dataset(D input, std::size_t n) : input_(std::move(input)), n_(n) {}

  class cursor_type {
   public:
    cursor_type(cursor_t<D> in, std::size_t n) : in_(std::move(in)), left_(n) {}
    std::optional<element_type> next() {
      if (left_ == 0) return std::nullopt;
      auto e = in_.next();
      left_ = e ? left_ - 1 : 0;
      return e;
    }

   private:
    cursor_t<D> in_;
    std::size_t left_;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {input_.cursor(epoch), n_}; }
  std::int64_t cardinality() const {
    return detail::min_cardinality(input_.cardinality(), static_cast<std::int64_t>(n_));
  }

 private:
  D input_;
  std::size_t n_;
};

template <dataset D>
class skip_dataset : public dataset_base<skip_dataset<D>> {
 public:
  using element_type = element_t<D>;
  skip_dataset(D input, std::size_t n) : input_(std::move(input)), n_(n) {}

  class cursor_type {
   public:
    cursor_type(cursor_t<D> in, std::size_t n) : in_(std::move(in)), to_skip_(n) {}
    std::optional<element_type> next() {
      for (; to_skip_ > 0; --to_skip_)
        if (!in_.next()) {
          to_skip_ = 0;
          return std::nullopt;
        }
      return in_.next();
    }

   private:
    cursor_t<D> in_;
    std::size_t to_skip_;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {input_.cursor(epoch), n_}; }
  std::int64_t cardinality() const {
    const std::int64_t c = input_.cardinality();
    if (c < 0) return c;
    return c > static_cast<std::int64_t>(n_) ? c - static_cast<std::int64_t>(n_) : 0;
  }

 private:
  D input_;
  std::size_t n_;
};

}  // namespace distribute::data
