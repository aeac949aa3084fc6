#pragma once
// Dropout's mask (nn/dropout.hpp), drawn from a counter-based stream.
// Functors over raw pointers that any engine runs (nn/detail/kernels.hpp): each is called with an
// element index i, or a plane (segment) s and an index i within it.

#include <distribute/config.hpp>

#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

// splitmix64's output function: element i of a stream keyed by `key` is mix64(key + (i + 1) * golden),
// the (i + 1)-th output of splitmix64 seeded with `key`. Counter-based, so any engine draws element i
// alone and the same way.
DISTRIBUTE_HOST_DEVICE constexpr std::uint64_t mix64(std::uint64_t z) noexcept {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Element i is kept when its 53-bit uniform draw is at least `threshold` (rate * 2^53): mask[i] is
// then `scale` (1 / (1 - rate)), 0 otherwise; y = x * mask.
template <class T>
struct dropout_forward {
  const T* x;
  T* y;
  T* mask;
  std::uint64_t key, threshold;
  T scale;
  DISTRIBUTE_HOST_DEVICE void operator()(index i) const {
    const std::uint64_t draw = mix64(key + 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(i + 1)) >> 11;
    const T m = draw >= threshold ? scale : T(0);
    mask[i] = m;
    y[i] = x[i] * m;
  }
};

}  // namespace distribute::nn::detail::kernels
