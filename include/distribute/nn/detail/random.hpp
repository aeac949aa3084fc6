#pragma once
// Deterministic initialisation: the same seed gives the same weights on every platform and standard
// library (std::normal_distribution is implementation-defined, so it is not used).

#include <cmath>
#include <cstdint>
#include <numbers>
#include <span>

namespace distribute::nn::detail {

// splitmix64: tiny, fast, and every seed (0 included) gives a good stream.
class splitmix64 {
 public:
  explicit constexpr splitmix64(std::uint64_t seed) noexcept : state_{seed} {}
  constexpr std::uint64_t next() noexcept {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in (0, 1]: never 0, so that log() below is finite.
  double uniform() noexcept { return (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53; }

 private:
  std::uint64_t state_;
};

// Fills `out` with N(mean, stddev) by Box-Muller, from its own stream of `seed`.
template <class T>
void fill_normal(std::span<T> out, std::uint64_t seed, double mean, double stddev) {
  splitmix64 gen{seed};
  for (std::size_t i = 0; i < out.size(); i += 2) {
    const double r = std::sqrt(-2.0 * std::log(gen.uniform()));
    const double a = 2.0 * std::numbers::pi * gen.uniform();
    out[i] = static_cast<T>(mean + stddev * r * std::cos(a));
    if (i + 1 < out.size()) out[i + 1] = static_cast<T>(mean + stddev * r * std::sin(a));
  }
}

// A distinct seed for parameter `index` of a layer seeded with `seed`.
constexpr std::uint64_t sub_seed(std::uint64_t seed, std::uint64_t index) noexcept {
  return splitmix64{seed * 0x100000001b3ull + index}.next();
}

}  // namespace distribute::nn::detail
