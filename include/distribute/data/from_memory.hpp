#pragma once
// Sources from memory: `from_vector(elements)`, `from_tensor_slices(tensor, labels)` (one example per
// index of the first dimension) and `range(n)`. The data is held once, immutable, and shared by
// every copy of the dataset.

#include <distribute/data/dataset.hpp>
#include <distribute/data/tensor.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute::data {

template <class E>
class vector_dataset : public dataset_base<vector_dataset<E>> {
 public:
  using element_type = E;
  explicit vector_dataset(std::vector<E> elements)
      : data_(std::make_shared<const std::vector<E>>(std::move(elements))) {}

  class cursor_type {
   public:
    explicit cursor_type(std::shared_ptr<const std::vector<E>> d) : data_(std::move(d)) {}
    std::optional<E> next() {
      if (index_ >= data_->size()) return std::nullopt;
      return (*data_)[index_++];
    }

   private:
    std::shared_ptr<const std::vector<E>> data_;
    std::size_t index_ = 0;
  };

  cursor_type cursor(std::uint64_t /*epoch*/) const { return cursor_type(data_); }
  std::int64_t cardinality() const { return static_cast<std::int64_t>(data_->size()); }

 private:
  std::shared_ptr<const std::vector<E>> data_;
};

template <class E>
vector_dataset<E> from_vector(std::vector<E> elements) {
  return vector_dataset<E>(std::move(elements));
}

// Examples from a tensor [n, ...] and n labels (or none: labels 0).
template <class T>
class tensor_slices_dataset : public dataset_base<tensor_slices_dataset<T>> {
  struct held {
    tensor<T> values;
    std::vector<std::int32_t> labels;
  };

 public:
  using element_type = example<T>;

  tensor_slices_dataset(tensor<T> t, std::vector<std::int32_t> labels) {
    if (t.shape.empty())
      throw std::invalid_argument("distribute::data: from_tensor_slices needs a tensor of rank >= 1");
    std::size_t expected = 1;
    for (auto d : t.shape) expected *= d;
    if (expected != t.values.size())
      throw std::invalid_argument("distribute::data: from_tensor_slices: shape " + shape_string(t.shape) + " needs " +
                                  std::to_string(expected) + " values, the tensor holds " +
                                  std::to_string(t.values.size()));
    if (labels.empty()) labels.assign(t.shape[0], 0);
    if (labels.size() != t.shape[0])
      throw std::invalid_argument("distribute::data: from_tensor_slices got " + std::to_string(labels.size()) +
                                  " labels for " + std::to_string(t.shape[0]) + " examples");
    data_ = std::make_shared<const held>(held{std::move(t), std::move(labels)});
  }

  class cursor_type {
   public:
    explicit cursor_type(std::shared_ptr<const held> d) : data_(std::move(d)) {}
    std::optional<example<T>> next() {
      const auto& t = data_->values;
      if (index_ >= t.shape[0]) return std::nullopt;
      example<T> e;
      e.image.shape.assign(t.shape.begin() + 1, t.shape.end());
      const std::size_t row = t.row_size();
      const auto first = t.values.begin() + static_cast<std::ptrdiff_t>(index_ * row);
      e.image.values.assign(first, first + static_cast<std::ptrdiff_t>(row));
      e.label = data_->labels[index_++];
      return e;
    }

   private:
    std::shared_ptr<const held> data_;
    std::size_t index_ = 0;
  };

  cursor_type cursor(std::uint64_t /*epoch*/) const { return cursor_type(data_); }
  std::int64_t cardinality() const { return static_cast<std::int64_t>(data_->values.shape[0]); }

  // The whole tensor and the labels, for code that wants the raw arrays.
  const tensor<T>& values() const noexcept { return data_->values; }
  std::span<const std::int32_t> labels() const noexcept { return data_->labels; }

 private:
  std::shared_ptr<const held> data_;
};

template <class T>
tensor_slices_dataset<T> from_tensor_slices(tensor<T> t, std::vector<std::int32_t> labels = {}) {
  return {std::move(t), std::move(labels)};
}

// 0, 1, ..., n - 1.
class range_dataset : public dataset_base<range_dataset> {
 public:
  using element_type = std::int64_t;
  explicit range_dataset(std::int64_t n) : n_(n < 0 ? 0 : n) {}

  class cursor_type {
   public:
    explicit cursor_type(std::int64_t n) : n_(n) {}
    std::optional<std::int64_t> next() { return i_ < n_ ? std::optional<std::int64_t>(i_++) : std::nullopt; }

   private:
    std::int64_t n_, i_ = 0;
  };

  cursor_type cursor(std::uint64_t /*epoch*/) const { return cursor_type(n_); }
  std::int64_t cardinality() const { return n_; }

 private:
  std::int64_t n_;
};

inline range_dataset range(std::int64_t n) { return range_dataset(n); }

}  // namespace distribute::data
