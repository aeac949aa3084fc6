#pragma once
// FNV-1a over bytes: the digest that mirrored-state checks compare across replicas. Chainable, so a
// state made of several buffers digests them in turn.

#include <cstddef>
#include <cstdint>

namespace distribute::detail {

inline constexpr std::uint64_t fnv1a_basis = 1469598103934665603ull;

inline std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = fnv1a_basis) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace distribute::detail
