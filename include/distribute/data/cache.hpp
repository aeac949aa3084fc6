#pragma once
// `cache()`: the first pass that reaches its end is kept in memory; every later pass (any epoch,
// any copy of the dataset) replays it. A pass abandoned early caches nothing. Put it before
// `shuffle` so that each epoch still draws a new order.

#include <distribute/data/dataset.hpp>

#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

namespace distribute::data {

template <dataset D>
class cache_dataset : public dataset_base<cache_dataset<D>> {
 public:
  using element_type = element_t<D>;
  using stored = std::vector<element_type>;

 private:
  // Passes may run on several threads (prefetch, or copies used concurrently).
  struct shared {
    std::shared_ptr<const stored> get() {
      std::lock_guard lock(m);
      return data;
    }
    void put(std::shared_ptr<const stored> d) {
      std::lock_guard lock(m);
      if (!data) data = std::move(d);
    }
    std::mutex m;
    std::shared_ptr<const stored> data;
  };

 public:
  explicit cache_dataset(D input) : input_(std::move(input)), shared_(std::make_shared<shared>()) {}

  class cursor_type {
   public:
    cursor_type(const D& input, std::uint64_t epoch, std::shared_ptr<shared> s) : shared_(std::move(s)) {
      replay_ = shared_->get();
      if (!replay_) in_.emplace(input.cursor(epoch));
    }
    std::optional<element_type> next() {
      if (replay_) {
        if (index_ < replay_->size()) return (*replay_)[index_++];
        return std::nullopt;
      }
      if (!in_) return std::nullopt;
      if (auto e = in_->next()) {
        recording_.push_back(*e);
        return e;
      }
      in_.reset();
      shared_->put(std::make_shared<const stored>(std::move(recording_)));
      return std::nullopt;
    }

   private:
    std::shared_ptr<shared> shared_;
    std::shared_ptr<const stored> replay_;
    std::size_t index_ = 0;
    std::optional<cursor_t<D>> in_;
    stored recording_;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {input_, epoch, shared_}; }
  std::int64_t cardinality() const { return input_.cardinality(); }

  std::size_t file_count() const
    requires file_shardable<D>
  {
    return input_.file_count();
  }
  cache_dataset shard_files(std::size_t index, std::size_t count) const
    requires file_shardable<D>
  {
    return cache_dataset(input_.shard_files(index, count));
  }

  // Whether a complete pass is held.
  bool filled() const { return shared_->get() != nullptr; }

 private:
  D input_;
  std::shared_ptr<shared> shared_;
};

}  // namespace distribute::data
