#pragma once
// The shape and layout vocabulary that every tensor adapter shares (the Eigen one here, a cuDNN one
// beside it later), so that layers and tests speak of shapes without naming a device.
//
// One layout, NCHW (batch, channels, height, width; width fastest), for three reasons: im2col of one
// example gives a [C*k*k, H*W] matrix and the convolution's GEMM W[Cout, C*k*k] x col writes that
// example's output [Cout, H*W] already in NCHW, with no transpose; the per-channel statistics of batch
// and instance norm are sums over contiguous H*W planes; and cuDNN's and PyTorch's default is NCHW, so
// the GPU adapter and reference weights (CycleGAN's) need no reordering.

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <ostream>
#include <span>
#include <stdexcept>
#include <string>

namespace distribute {

enum class layout : std::uint8_t { nchw };

// Asks a tensor constructor for storage whose values are left unset: for outputs that a computation
// overwrites in full, where zero-filling first would be a wasted pass over memory.
struct uninitialized_t {
  explicit constexpr uninitialized_t() = default;
};
inline constexpr uninitialized_t uninitialized{};

// Up to four extents, outermost first. A rank-4 shape is (N, C, H, W) in the NCHW layout.
class shape {
 public:
  static constexpr std::size_t max_rank = 4;

  constexpr shape() noexcept = default;
  shape(std::initializer_list<std::int64_t> extents) {
    if (extents.size() > max_rank) throw std::invalid_argument("distribute: a shape has at most 4 extents");
    for (auto e : extents) {
      if (e < 0) throw std::invalid_argument("distribute: negative extent " + std::to_string(e) + " in a shape");
      extents_[rank_++] = e;
    }
  }
  static shape nchw(std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) { return {n, c, h, w}; }
  // The shape of extents computed at run time (an operation's result).
  static shape from_extents(std::span<const std::int64_t> extents) {
    if (extents.size() > max_rank)
      throw std::invalid_argument("distribute: a shape has at most 4 extents, not " + std::to_string(extents.size()));
    shape s;
    for (auto e : extents) {
      if (e < 0) throw std::invalid_argument("distribute: negative extent " + std::to_string(e) + " in a shape");
      s.extents_[s.rank_++] = e;
    }
    return s;
  }

  constexpr std::size_t rank() const noexcept { return rank_; }
  constexpr std::int64_t operator[](std::size_t i) const noexcept { return extents_[i]; }
  std::int64_t at(std::size_t i) const {
    if (i >= rank_)
      throw std::out_of_range("distribute: axis " + std::to_string(i) + " of a rank-" + std::to_string(rank_) +
                              " shape");
    return extents_[i];
  }
  // Elements in all.
  constexpr std::int64_t numel() const noexcept {
    std::int64_t n = 1;
    for (std::size_t i = 0; i < rank_; ++i) n *= extents_[i];
    return n;
  }
  // The NCHW names; only meaningful for rank 4.
  constexpr std::int64_t n() const noexcept { return extents_[0]; }
  constexpr std::int64_t c() const noexcept { return extents_[1]; }
  constexpr std::int64_t h() const noexcept { return extents_[2]; }
  constexpr std::int64_t w() const noexcept { return extents_[3]; }
  // The same shape with the outermost (batch) extent replaced: a replica's share of a batch.
  shape with_batch(std::int64_t n) const {
    shape s = *this;
    s.extents_[0] = n;
    return s;
  }

  friend constexpr bool operator==(const shape& a, const shape& b) noexcept {
    if (a.rank_ != b.rank_) return false;
    for (std::size_t i = 0; i < a.rank_; ++i)
      if (a.extents_[i] != b.extents_[i]) return false;
    return true;
  }

  std::string to_string() const {
    std::string s = "(";
    for (std::size_t i = 0; i < rank_; ++i) s += (i ? ", " : "") + std::to_string(extents_[i]);
    return s + ")";
  }
  friend std::ostream& operator<<(std::ostream& os, const shape& s) { return os << s.to_string(); }

 private:
  std::array<std::int64_t, max_rank> extents_{};
  std::size_t rank_ = 0;
};

}  // namespace distribute
