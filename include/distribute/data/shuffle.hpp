#pragma once
// `shuffle(buffer, seed)`: tf.data's buffered shuffle. The buffer is filled from the input; each
// output is a uniformly chosen buffer element, whose place the next input element takes. With a
// buffer at least as large as the dataset this is a uniform permutation (a Fisher-Yates draw).

#include <distribute/data/dataset.hpp>

#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

namespace distribute::data {

template <dataset D>
class shuffle_dataset : public dataset_base<shuffle_dataset<D>> {
 public:
  using element_type = element_t<D>;

  shuffle_dataset(D input, std::size_t buffer, std::uint64_t seed)
      : input_(std::move(input)), buffer_(buffer), seed_(seed) {
    if (buffer == 0) throw std::invalid_argument("distribute::data: shuffle needs a buffer of at least 1 element");
  }

  class cursor_type {
   public:
    cursor_type(cursor_t<D> in, std::size_t buffer, std::uint64_t seed)
        : in_(std::move(in)), capacity_(buffer), rng_{seed} {}
    std::optional<element_type> next() {
      while (!exhausted_ && buffer_.size() < capacity_) {
        if (auto e = in_.next()) {
          buffer_.push_back(std::move(*e));
        } else {
          exhausted_ = true;
        }
      }
      if (buffer_.empty()) return std::nullopt;
      const std::size_t i = rng_.below(buffer_.size());
      std::optional<element_type> out(std::move(buffer_[i]));
      if (i + 1 != buffer_.size()) buffer_[i] = std::move(buffer_.back());
      buffer_.pop_back();
      return out;
    }

   private:
    cursor_t<D> in_;
    std::size_t capacity_;
    detail::rng rng_;
    std::vector<element_type> buffer_;
    bool exhausted_ = false;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {input_.cursor(epoch), buffer_, detail::mix(seed_, epoch)}; }
  std::int64_t cardinality() const { return input_.cardinality(); }

  std::size_t file_count() const
    requires file_shardable<D>
  {
    return input_.file_count();
  }
  shuffle_dataset shard_files(std::size_t index, std::size_t count) const
    requires file_shardable<D>
  {
    return {input_.shard_files(index, count), buffer_, seed_};
  }

 private:
  D input_;
  std::size_t buffer_;
  std::uint64_t seed_;
};

}  // namespace distribute::data
