#pragma once
// `batch(n, keep_remainder | drop_remainder)`: stacks n consecutive elements (see
// detail/batching.hpp for what a batch of each element type is).

#include <distribute/data/dataset.hpp>
#include <distribute/data/detail/batching.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute::data {

template <dataset D>
class batch_dataset : public dataset_base<batch_dataset<D>> {
  using batching = detail::batching<element_t<D>>;

 public:
  using element_type = typename batching::batch_type;

  batch_dataset(D input, std::size_t n, remainder policy) : input_(std::move(input)), size_(n), policy_(policy) {
    if (n == 0) throw std::invalid_argument("distribute::data: batch size must be at least 1");
  }

  std::size_t batch_size() const noexcept { return size_; }
  remainder remainder_policy() const noexcept { return policy_; }

  class cursor_type {
   public:
    cursor_type(cursor_t<D> in, std::size_t n, remainder policy) : in_(std::move(in)), size_(n), policy_(policy) {}
    std::optional<element_type> next() {
      std::vector<element_t<D>> group;
      group.reserve(size_);
      while (group.size() < size_) {
        auto e = in_.next();
        if (!e) break;
        group.push_back(std::move(*e));
      }
      if (group.empty() || (group.size() < size_ && policy_ == remainder::drop)) return std::nullopt;
      return batching::stack(std::move(group));
    }

   private:
    cursor_t<D> in_;
    std::size_t size_;
    remainder policy_;
  };

  cursor_type cursor(std::uint64_t epoch) const { return {input_.cursor(epoch), size_, policy_}; }
  std::int64_t cardinality() const {
    const std::int64_t c = input_.cardinality();
    if (c < 0) return c;
    const auto n = static_cast<std::int64_t>(size_);
    return policy_ == remainder::drop ? c / n : (c + n - 1) / n;
  }

  // Each of `count` workers reads its own files and batches 1/count of the global batch, so that a
  // step still sees the global batch across workers.
  std::size_t file_count() const
    requires file_shardable<D>
  {
    return input_.file_count();
  }
  batch_dataset shard_files(std::size_t index, std::size_t count) const
    requires file_shardable<D>
  {
    if (size_ % count != 0)
      throw std::invalid_argument("distribute::data: sharding by file splits the global batch of " +
                                  std::to_string(size_) + " among " + std::to_string(count) +
                                  " workers; it must divide evenly");
    return {input_.shard_files(index, count), size_ / count, policy_};
  }

 private:
  D input_;
  std::size_t size_;
  remainder policy_;
};

}  // namespace distribute::data
