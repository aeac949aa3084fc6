#pragma once
// FNV-1a over bytes: the digest that mirrored-state checks compare across replicas. Chainable, so a
// state made of several buffers digests them in turn.

#include <distribute/concepts/device.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace distribute::detail {

inline constexpr std::uint64_t fnv1a_basis = 1469598103934665603ull;

inline std::uint64_t fnv1a(const void* data, std::size_t n, std::uint64_t h = fnv1a_basis) noexcept {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

// A model's state as mirrored copies must agree on it, digested in two parts so that a check can say
// which part differs: its parameters' values (`for_each_parameter`) and its buffers
// (`for_each_buffer`: batch norm's running statistics and any other state that is not trained but
// must stay identical), each in enumeration order. Buffers are host memory; the parameters of a
// model on another device are read through the host (copy_parameter_values below).
struct model_digest {
  std::uint64_t parameters = fnv1a_basis;
  std::uint64_t buffers = fnv1a_basis;
  // Both parts in one value.
  std::uint64_t state() const noexcept { return fnv1a(&buffers, sizeof buffers, parameters); }
};

// Copies n elements between memory of device D and any other memory the process can address (the
// host, or another device of the same kind), in either direction; returns once they are there.
// Specialised by each device's header (cuda/device/cuda.cuh).
template <class D>
struct device_memory;

// Whether a model's parameters are host memory: a model without a device, or on a CPU.
template <class M>
concept host_parameters = !requires { typename M::device_type; } || device_traits<typename M::device_type>::host_memory;

// Copies n of model M's parameter values, where either side may be memory of M's device.
template <class M, class T>
void copy_parameter_values(const T* src, std::size_t n, T* dst) {
  if (n == 0) return;
  if constexpr (host_parameters<M>) {
    std::memcpy(dst, src, n * sizeof(T));
  } else {
    device_memory<typename M::device_type>::copy(src, n, dst);
  }
}

template <class M>
model_digest digest_model(M& model) {
  model_digest d;
  model.for_each_parameter([&](auto value, auto) {
    if constexpr (host_parameters<M>) {
      d.parameters = fnv1a(value.data(), value.size_bytes(), d.parameters);
    } else {
      using T = std::remove_cv_t<typename decltype(value)::element_type>;
      std::vector<T> host(value.size());
      copy_parameter_values<M>(value.data(), value.size(), host.data());
      d.parameters = fnv1a(host.data(), value.size_bytes(), d.parameters);
    }
  });
  if constexpr (requires { model.for_each_buffer([](std::span<double>) {}); })
    model.for_each_buffer([&](std::span<double> b) { d.buffers = fnv1a(b.data(), b.size_bytes(), d.buffers); });
  return d;
}

}  // namespace distribute::detail
