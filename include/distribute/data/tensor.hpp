#pragma once
// The values the input pipeline moves: a dense row-major buffer with a shape (`tensor`), one labelled
// example, and a batch of them. Deliberately minimal: a model's own tensor type takes `data()` and
// `shape()` (or moves `values` out) and owns the maths.
//
// A batch's first dimension is its example count. A batch may be empty (shape [0, ...]): that is how
// a replica without data in an uneven last step receives "nothing" while still knowing the shape.

#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace distribute::data {

template <class T>
struct tensor {
  using value_type = T;

  std::vector<std::size_t> shape;
  std::vector<T> values;  // row-major, product(shape) elements

  T* data() noexcept { return values.data(); }
  const T* data() const noexcept { return values.data(); }
  std::size_t size() const noexcept { return values.size(); }
  std::size_t rank() const noexcept { return shape.size(); }
  // Elements per index of the first dimension (one example's size for a batch).
  std::size_t row_size() const noexcept {
    return shape.empty() ? 1 : std::accumulate(shape.begin() + 1, shape.end(), std::size_t{1}, std::multiplies<>{});
  }
  friend bool operator==(const tensor&, const tensor&) = default;
};

inline std::string shape_string(std::span<const std::size_t> shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// One example: an image (or any feature tensor, without a batch dimension; images are [h, w, c])
// and its class.
template <class T>
struct example {
  using value_type = T;
  tensor<T> image;
  std::int32_t label = 0;
  friend bool operator==(const example&, const example&) = default;
};

// A batch of examples: images [n, ...] and n labels. `global_size` is the number of examples in the
// global batch this one was split from (0 when it was not split): a replica divides its summed loss
// by it, so that a short or empty last batch is weighted by its true count.
template <class T>
struct batch {
  using value_type = T;
  tensor<T> images;
  std::vector<std::int32_t> labels;
  std::size_t global_size = 0;

  std::size_t size() const noexcept { return labels.size(); }
  bool empty() const noexcept { return labels.empty(); }
  T* data() noexcept { return images.data(); }
  const T* data() const noexcept { return images.data(); }
  const std::vector<std::size_t>& shape() const noexcept { return images.shape; }
  // One example's values.
  std::span<const T> operator[](std::size_t i) const {
    const std::size_t row = images.row_size();
    return {images.values.data() + i * row, row};
  }
  friend bool operator==(const batch&, const batch&) = default;
};

}  // namespace distribute::data
