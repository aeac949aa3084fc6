#pragma once
// How elements stack into a batch and how a batch splits into parts, per element type:
//   example<T>        -> batch<T> (images [n, ...], n labels); every example must have one shape
//   std::pair<A, B>   -> std::pair<batch of A, batch of B> (what zip then batch gives)
//   anything else E   -> std::vector<E>
// Splitting takes rows [offset, offset + count) of a batch; an empty part keeps the row shape;
// `whole` hands over a batch that is one part by itself, and `head` its first rows, without copying.

#include <distribute/data/tensor.hpp>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace distribute::data::detail {

template <class E>
struct batching {
  using batch_type = std::vector<E>;
  static batch_type stack(std::vector<E>&& elements) { return std::move(elements); }
};

template <class T>
struct batching<example<T>> {
  using batch_type = batch<T>;
  static batch_type stack(std::vector<example<T>>&& elements) {
    batch_type b;
    if (elements.empty()) return b;
    const auto& shape = elements.front().image.shape;
    const std::size_t row = elements.front().image.size();
    b.images.shape.reserve(shape.size() + 1);
    b.images.shape.push_back(elements.size());
    b.images.shape.insert(b.images.shape.end(), shape.begin(), shape.end());
    b.images.values.resize(row * elements.size());
    b.labels.reserve(elements.size());
    for (std::size_t i = 0; i < elements.size(); ++i) {
      const auto& e = elements[i];
      if (e.image.shape != shape || e.image.size() != row)
        throw std::invalid_argument("distribute::data: batch: element " + std::to_string(i) + " has shape " +
                                    shape_string(e.image.shape) + ", element 0 has " + shape_string(shape) +
                                    " (resize the images or batch elements of one shape)");
      std::copy(e.image.values.begin(), e.image.values.end(),
                b.images.values.begin() + static_cast<std::ptrdiff_t>(i * row));
      b.labels.push_back(e.label);
    }
    return b;
  }
};

template <class A, class B>
struct batching<std::pair<A, B>> {
  using batch_type = std::pair<typename batching<A>::batch_type, typename batching<B>::batch_type>;
  static batch_type stack(std::vector<std::pair<A, B>>&& elements) {
    std::vector<A> a;
    std::vector<B> b;
    a.reserve(elements.size());
    b.reserve(elements.size());
    for (auto& e : elements) {
      a.push_back(std::move(e.first));
      b.push_back(std::move(e.second));
    }
    return {batching<A>::stack(std::move(a)), batching<B>::stack(std::move(b))};
  }
};

// Splitting, for the batch types above (and any std::vector).
template <class B>
struct splitting;

template <class E>
struct splitting<std::vector<E>> {
  static std::size_t count(const std::vector<E>& b) noexcept { return b.size(); }
  static std::vector<E> slice(const std::vector<E>& b, std::size_t offset, std::size_t n, std::size_t /*global*/) {
    return {b.begin() + static_cast<std::ptrdiff_t>(offset), b.begin() + static_cast<std::ptrdiff_t>(offset + n)};
  }
  static std::vector<E> whole(std::vector<E>&& b, std::size_t /*global*/) { return std::move(b); }
  static std::vector<E> head(std::vector<E>&& b, std::size_t n, std::size_t /*global*/) {
    b.erase(b.begin() + static_cast<std::ptrdiff_t>(n), b.end());
    return std::move(b);
  }
};

template <class T>
struct splitting<batch<T>> {
  static std::size_t count(const batch<T>& b) noexcept { return b.size(); }
  static batch<T> slice(const batch<T>& b, std::size_t offset, std::size_t n, std::size_t global) {
    batch<T> part;
    part.images.shape = b.images.shape;
    if (part.images.shape.empty()) part.images.shape.push_back(0);
    part.images.shape[0] = n;
    const std::size_t row = b.images.row_size();
    const auto first = b.images.values.begin() + static_cast<std::ptrdiff_t>(offset * row);
    part.images.values.assign(first, first + static_cast<std::ptrdiff_t>(n * row));
    part.labels.assign(b.labels.begin() + static_cast<std::ptrdiff_t>(offset),
                       b.labels.begin() + static_cast<std::ptrdiff_t>(offset + n));
    part.global_size = global;
    return part;
  }
  static batch<T> whole(batch<T>&& b, std::size_t global) {
    b.global_size = global;
    return std::move(b);
  }
  static batch<T> head(batch<T>&& b, std::size_t n, std::size_t global) {
    const std::size_t row = b.images.row_size();
    if (b.images.shape.empty()) b.images.shape.push_back(0);
    b.images.shape[0] = n;
    b.images.values.resize(n * row);
    b.labels.resize(n);
    b.global_size = global;
    return std::move(b);
  }
};

template <class A, class B>
struct splitting<std::pair<A, B>> {
  static std::size_t count(const std::pair<A, B>& b) {
    const std::size_t n = splitting<A>::count(b.first);
    if (splitting<B>::count(b.second) != n)
      throw std::invalid_argument("distribute::data: cannot split a pair of batches of " + std::to_string(n) + " and " +
                                  std::to_string(splitting<B>::count(b.second)) + " examples into replica parts");
    return n;
  }
  static std::pair<A, B> slice(const std::pair<A, B>& b, std::size_t offset, std::size_t n, std::size_t global) {
    return {splitting<A>::slice(b.first, offset, n, global), splitting<B>::slice(b.second, offset, n, global)};
  }
  static std::pair<A, B> whole(std::pair<A, B>&& b, std::size_t global) {
    count(b);
    return {splitting<A>::whole(std::move(b.first), global), splitting<B>::whole(std::move(b.second), global)};
  }
  static std::pair<A, B> head(std::pair<A, B>&& b, std::size_t n, std::size_t global) {
    return {splitting<A>::head(std::move(b.first), n, global), splitting<B>::head(std::move(b.second), n, global)};
  }
};

template <class B>
concept splittable = requires(const B& b) {
  { splitting<B>::count(b) } -> std::same_as<std::size_t>;
  { splitting<B>::slice(b, std::size_t{}, std::size_t{}, std::size_t{}) } -> std::same_as<B>;
  { splitting<B>::whole(std::declval<B&&>(), std::size_t{}) } -> std::same_as<B>;
  { splitting<B>::head(std::declval<B&&>(), std::size_t{}, std::size_t{}) } -> std::same_as<B>;
};

}  // namespace distribute::data::detail
