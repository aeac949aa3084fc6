#pragma once
// `zip(a, b)`: pairs the i-th elements of two datasets (two unpaired domains, as a CycleGAN reads
// them). A pass ends with the shorter input.

#include <distribute/data/dataset.hpp>

#include <optional>
#include <utility>

namespace distribute::data {

template <dataset A, dataset B>
class zip_dataset : public dataset_base<zip_dataset<A, B>> {
 public:
  using element_type = std::pair<element_t<A>, element_t<B>>;
  zip_dataset(A a, B b) : a_(std::move(a)), b_(std::move(b)) {}

  class cursor_type {
   public:
    cursor_type(cursor_t<A> a, cursor_t<B> b) : a_(std::move(a)), b_(std::move(b)) {}
    std::optional<element_type> next() {
      if (done_) return std::nullopt;
      auto x = a_.next();
      if (!x) return finish();
      auto y = b_.next();
      if (!y) return finish();
      return element_type(std::move(*x), std::move(*y));
    }

   private:
    std::optional<element_type> finish() {
      done_ = true;
      return std::nullopt;
    }
    cursor_t<A> a_;
    cursor_t<B> b_;
    bool done_ = false;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {a_.cursor(epoch), b_.cursor(epoch)}; }
  std::int64_t cardinality() const { return detail::min_cardinality(a_.cardinality(), b_.cardinality()); }

 private:
  A a_;
  B b_;
};

template <dataset A, dataset B>
zip_dataset<A, B> zip(A a, B b) {
  return {std::move(a), std::move(b)};
}

}  // namespace distribute::data
