#pragma once
// A device says where a replica's data and work live. It is a small value: copying it copies a name,
// not memory.

#include <concepts>
#include <cstdint>
#include <string>

namespace distribute {

enum class device_kind : std::uint8_t { cpu, cuda };

template <class D>
concept device = std::copyable<D> && std::equality_comparable<D> && requires(const D& d) {
  { D::kind } -> std::convertible_to<device_kind>;
  { d.index() } -> std::convertible_to<int>;
  { d.name() } -> std::convertible_to<std::string>;
};

}  // namespace distribute
