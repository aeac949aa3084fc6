#pragma once
// `repeat(count)` and `repeat()` (forever). Repetition i of outer epoch e reads input epoch
// e * count + i (e * 2^32 + i when forever), so a shuffle beneath draws a new order each time and a
// repeated pipeline is still a pure function of its epoch.

#include <distribute/data/dataset.hpp>

#include <optional>
#include <stdexcept>
#include <utility>

namespace distribute::data {

template <dataset D>
class repeat_dataset : public dataset_base<repeat_dataset<D>> {
 public:
  using element_type = element_t<D>;

  repeat_dataset(D input, std::int64_t count) : input_(std::move(input)), count_(count) {
    if (count < 0 && count != forever)
      throw std::invalid_argument("distribute::data: repeat count must be >= 0 or data::forever");
  }

  class cursor_type {
   public:
    cursor_type(D input, std::int64_t count, std::uint64_t epoch)
        : input_(std::move(input)), count_(count), epoch_(epoch) {
      if (count_ != 0) in_.emplace(input_.cursor(inner_epoch()));
    }
    std::optional<element_type> next() {
      while (in_) {
        if (auto e = in_->next()) {
          produced_ = true;
          return e;
        }
        // An empty pass ends a forever-repeat instead of spinning on it.
        ++pass_;
        if ((count_ != forever && pass_ >= static_cast<std::uint64_t>(count_)) || !produced_) {
          in_.reset();
          break;
        }
        produced_ = false;
        in_.emplace(input_.cursor(inner_epoch()));
      }
      return std::nullopt;
    }

   private:
    std::uint64_t inner_epoch() const noexcept {
      return count_ == forever ? (epoch_ << 32) + pass_ : epoch_ * static_cast<std::uint64_t>(count_) + pass_;
    }
    D input_;
    std::int64_t count_;
    std::uint64_t epoch_;
    std::uint64_t pass_ = 0;
    bool produced_ = false;
    std::optional<cursor_t<D>> in_;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {input_, count_, epoch}; }
  std::int64_t cardinality() const {
    const std::int64_t c = input_.cardinality();
    if (c == 0 || count_ == 0) return 0;
    if (count_ == forever) return c == unknown_cardinality ? unknown_cardinality : infinite_cardinality;
    return c < 0 ? c : c * count_;
  }

  std::size_t file_count() const
    requires file_shardable<D>
  {
    return input_.file_count();
  }
  repeat_dataset shard_files(std::size_t index, std::size_t count) const
    requires file_shardable<D>
  {
    return {input_.shard_files(index, count), count_};
  }

 private:
  D input_;
  std::int64_t count_;
};

}  // namespace distribute::data
