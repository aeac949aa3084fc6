#pragma once
// A device says where a replica's data and work live. It is a small value: copying it copies a name,
// not memory.
//
// A device type D has:
//   index(), name()        which device of its kind ("cpu:0", "cuda:1")
//   D::host_memory         true where a replica's data on D lie in memory the host reads and writes
//                          in place (the CPU), false where they must be copied first (a GPU)
// Code asks through `device_traits<D>`, which reads those members; a device type that cannot carry
// them (one from another library) specialises `device_traits` instead. A new device adds its type, its
// engine and its device policy (docs/architecture.md, "Adding a device"); nothing here names it.

#include <concepts>
#include <string>

namespace distribute {

template <class D>
struct device_traits {};  // not a device
template <class D>
  requires requires { bool{D::host_memory}; }
struct device_traits<D> {
  static constexpr bool host_memory = D::host_memory;
};

template <class D>
concept device = std::copyable<D> && std::equality_comparable<D> && requires(const D& d) {
  { device_traits<D>::host_memory } -> std::convertible_to<bool>;
  { d.index() } -> std::convertible_to<int>;
  { d.name() } -> std::convertible_to<std::string>;
};

// Whether the data of a replica on D are host memory (device_traits<D>::host_memory).
template <device D>
inline constexpr bool host_memory_v = device_traits<D>::host_memory;

}  // namespace distribute
