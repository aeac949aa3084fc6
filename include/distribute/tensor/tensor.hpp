#pragma once
// An owning tensor: a shape and contiguous storage on one device. The device is a template parameter
// so that `tensor<float, cuda>` (a later adapter) sits beside `tensor<float, cpu>` with the same shape
// vocabulary; only the CPU specialisation exists here. The math goes through zero-copy Eigen views
// (tensor/eigen.hpp), never through this type's own members.

#include <distribute/device/cpu.hpp>
#include <distribute/tensor/shape.hpp>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <type_traits>
#include <memory>
#include <new>
#include <vector>

namespace distribute {

namespace detail {
// An allocator whose resize leaves new elements default-initialised (unset, for arithmetic types).
template <class T>
struct default_init_allocator : std::allocator<T> {
  template <class U>
  struct rebind {
    using other = default_init_allocator<U>;
  };
  default_init_allocator() = default;
  template <class U>
  constexpr default_init_allocator(const default_init_allocator<U>&) noexcept {}
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};
// Refuses a range [offset, offset + count) that does not lie within `size` elements.
inline void check_fill_range(std::size_t offset, std::size_t count, std::size_t size) {
  if (offset > size || count > size - offset)
    throw std::out_of_range("distribute: a tensor fill of elements [" + std::to_string(offset) + ", " +
                            std::to_string(offset) + " + " + std::to_string(count) + ") outside its " +
                            std::to_string(size) + " elements");
}
}  // namespace detail

template <class T, device D = cpu>
class tensor;  // one specialisation per device

// NCHW, dense, row-major (the last extent is contiguous), in host memory.
template <class T>
class tensor<T, cpu> {
 public:
  using value_type = T;
  using device_type = cpu;
  static constexpr distribute::layout layout = distribute::layout::nchw;

  tensor() = default;
  // Zero-filled.
  explicit tensor(distribute::shape s) : shape_{s}, data_(static_cast<std::size_t>(s.numel()), T(0)) {}
  // The device-generic spelling (layers write `tensor<T, D>{shape, device}` for every device).
  tensor(distribute::shape s, const cpu&) : tensor(s) {}
  // Values left unset, for an output that is about to be overwritten in full.
  tensor(distribute::shape s, const cpu&, uninitialized_t) : shape_{s}, data_(static_cast<std::size_t>(s.numel())) {}
  // A copy of host values; for the CPU the same as the constructor below.
  static tensor from_host(distribute::shape s, std::span<const T> values, const cpu& = {}) {
    return tensor(s, std::vector<T>(values.begin(), values.end()));
  }
  tensor(distribute::shape s, const std::vector<T>& values) : shape_{s}, data_(values.begin(), values.end()) {
    if (static_cast<std::int64_t>(data_.size()) != shape_.numel())
      throw std::invalid_argument("distribute: tensor of shape " + shape_.to_string() + " needs " +
                                  std::to_string(shape_.numel()) + " values, got " + std::to_string(data_.size()));
  }

  const distribute::shape& shape() const noexcept { return shape_; }
  cpu device() const noexcept { return {}; }
  std::size_t size() const noexcept { return data_.size(); }
  bool empty() const noexcept { return data_.empty(); }
  T* data() noexcept { return data_.data(); }
  const T* data() const noexcept { return data_.data(); }
  std::span<T> values() noexcept { return data_; }
  std::span<const T> values() const noexcept { return data_; }
  T& operator[](std::size_t i) noexcept { return data_[i]; }
  const T& operator[](std::size_t i) const noexcept { return data_[i]; }
  auto begin() noexcept { return data_.begin(); }
  auto end() noexcept { return data_.end(); }
  auto begin() const noexcept { return data_.begin(); }
  auto end() const noexcept { return data_.end(); }

  // Element (n, c, h, w) of a rank-4 tensor.
  T& operator()(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) noexcept {
    return data_[static_cast<std::size_t>(((n * shape_[1] + c) * shape_[2] + h) * shape_[3] + w)];
  }
  const T& operator()(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) const noexcept {
    return data_[static_cast<std::size_t>(((n * shape_[1] + c) * shape_[2] + h) * shape_[3] + w)];
  }

  void fill(T v) { std::fill(data_.begin(), data_.end(), v); }
  // Elements [offset, offset + count) set to `v` (the device tensors' form; std::out_of_range past the end).
  void fill(T v, std::size_t offset, std::size_t count) {
    detail::check_fill_range(offset, count, size());
    std::fill_n(data_.begin() + static_cast<std::ptrdiff_t>(offset), count, v);
  }
  // Keeps the storage when the element count allows (no reallocation in steady-state training).
  void resize(distribute::shape s) {
    shape_ = s;
    data_.resize(static_cast<std::size_t>(s.numel()));
  }
  // The same values under another shape of as many elements.
  tensor reshaped(distribute::shape s) const& {
    tensor t{*this};
    t.reshape(s);
    return t;
  }
  void reshape(distribute::shape s) {
    if (static_cast<std::size_t>(s.numel()) != size())
      throw std::invalid_argument("distribute: cannot reshape " + shape_.to_string() + " to " + s.to_string());
    shape_ = s;
  }

  friend bool operator==(const tensor& a, const tensor& b) { return a.shape_ == b.shape_ && a.data_ == b.data_; }

 private:
  distribute::shape shape_{};
  std::vector<T, detail::default_init_allocator<T>> data_;
};

}  // namespace distribute
