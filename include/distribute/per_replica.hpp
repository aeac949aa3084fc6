#pragma once
// Values that exist once per replica.
//
// `per_replica<T>` holds values that differ between replicas (a replica's slice of a batch, its loss).
// `mirrored<T>` holds copies that must stay identical (model weights, optimiser state). They share a
// storage shape but are distinct types, so that code cannot pass one where the other is meant.
//
// `Extent` is the replica count when it is known at compile time (1 under `one_device_strategy`, where
// the storage is an in-place array and no allocation happens); otherwise it is `std::dynamic_extent`.

#include <algorithm>
#include <array>
#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace distribute {

namespace detail {

// std::vector<bool> packs bits and hands out proxies, not bool&: a per-replica flag (a step that
// returns bool) is stored one bool per replica instead.
class bool_storage {
 public:
  bool_storage() = default;
  bool_storage(const std::vector<bool>& v) : size_{v.size()}, values_{std::make_unique<bool[]>(v.size())} {
    std::copy(v.begin(), v.end(), values_.get());
  }
  bool_storage(const bool_storage& o) : size_{o.size_}, values_{std::make_unique<bool[]>(o.size_)} {
    std::copy(o.begin(), o.end(), values_.get());
  }
  bool_storage(bool_storage&&) noexcept = default;
  bool_storage& operator=(bool_storage o) noexcept {
    size_ = o.size_;
    values_ = std::move(o.values_);
    return *this;
  }

  std::size_t size() const noexcept { return size_; }
  bool* data() noexcept { return values_.get(); }
  const bool* data() const noexcept { return values_.get(); }
  bool& operator[](std::size_t i) noexcept { return values_[i]; }
  const bool& operator[](std::size_t i) const noexcept { return values_[i]; }
  bool* begin() noexcept { return data(); }
  bool* end() noexcept { return data() + size_; }
  const bool* begin() const noexcept { return data(); }
  const bool* end() const noexcept { return data() + size_; }

 private:
  std::size_t size_ = 0;
  std::unique_ptr<bool[]> values_;
};

template <class T, std::size_t Extent>
class replica_values {
  using dynamic_storage = std::conditional_t<std::is_same_v<T, bool>, bool_storage, std::vector<T>>;
  using storage = std::conditional_t<Extent == std::dynamic_extent, dynamic_storage, std::array<T, Extent>>;

 public:
  using value_type = T;
  static constexpr std::size_t extent = Extent;

  replica_values() = default;
  explicit replica_values(storage values) : values_(std::move(values)) {}

  std::size_t size() const noexcept { return values_.size(); }
  T& operator[](std::size_t replica) { return values_[replica]; }
  const T& operator[](std::size_t replica) const { return values_[replica]; }
  T& at(std::size_t replica) {
    check(replica);
    return values_[replica];
  }
  const T& at(std::size_t replica) const {
    check(replica);
    return values_[replica];
  }
  // The value of the primary replica (replica 0).
  T& primary() { return values_[0]; }
  const T& primary() const { return values_[0]; }

  auto begin() noexcept { return values_.begin(); }
  auto end() noexcept { return values_.end(); }
  auto begin() const noexcept { return values_.begin(); }
  auto end() const noexcept { return values_.end(); }
  std::span<T, Extent> values() noexcept { return std::span<T, Extent>(values_); }
  std::span<const T, Extent> values() const noexcept { return std::span<const T, Extent>(values_); }

 private:
  void check(std::size_t replica) const {
    if (replica >= values_.size())
      throw std::out_of_range("distribute: replica " + std::to_string(replica) + " out of range for " +
                              std::to_string(values_.size()) + " replicas");
  }
  storage values_;
};

}  // namespace detail

template <class T, std::size_t Extent = std::dynamic_extent>
class per_replica : public detail::replica_values<T, Extent> {
  using detail::replica_values<T, Extent>::replica_values;
};

template <class T, std::size_t Extent = std::dynamic_extent>
class mirrored : public detail::replica_values<T, Extent> {
  using detail::replica_values<T, Extent>::replica_values;
};

template <class V>
inline constexpr bool is_per_replica_v = false;
template <class T, std::size_t E>
inline constexpr bool is_per_replica_v<per_replica<T, E>> = true;

template <class V>
inline constexpr bool is_mirrored_v = false;
template <class T, std::size_t E>
inline constexpr bool is_mirrored_v<mirrored<T, E>> = true;

// Either kind of replica-indexed value: what `run` unwraps to each replica's own element.
template <class V>
concept replica_indexed = is_per_replica_v<std::remove_cvref_t<V>> || is_mirrored_v<std::remove_cvref_t<V>>;

namespace detail {

// Builds a replica-indexed value `V` (a per_replica or mirrored) for `n` replicas from
// `make_one(replica)`, called in replica order. A compile-time extent lives in place.
template <class V, class F>
V make_replica_values(std::size_t n, F&& make_one) {
  using T = typename V::value_type;
  if constexpr (V::extent == std::dynamic_extent) {
    std::vector<T> values;
    values.reserve(n);
    for (std::size_t r = 0; r < n; ++r) values.push_back(make_one(r));
    return V(std::move(values));
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return V(std::array<T, V::extent>{make_one(I)...});
    }(std::make_index_sequence<V::extent>{});
  }
}

// How a batch of `b` examples splits over `n` parts: as evenly as possible, the first `b % n` parts
// one example more. `share_of` is part k's count, `share_offset` where it starts.
inline std::size_t share_of(std::size_t b, std::size_t n, std::size_t k) noexcept {
  return b / n + (k < b % n ? 1 : 0);
}
inline std::size_t share_offset(std::size_t b, std::size_t n, std::size_t k) noexcept {
  return k * (b / n) + (k < b % n ? k : b % n);
}

// The argument a replica sees: its own element of a replica-indexed value, anything else unchanged.
// Always an lvalue: every replica sees the same non-indexed argument, so none may move from it.
template <class A>
decltype(auto) unwrap_for(A& a, std::size_t replica) {
  if constexpr (replica_indexed<A>) {
    return (a[replica]);
  } else {
    return (a);
  }
}

}  // namespace detail
}  // namespace distribute
