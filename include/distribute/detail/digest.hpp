#pragma once
// FNV-1a over bytes: the digest that mirrored-state checks compare across replicas. Chainable, so a
// state made of several buffers digests them in turn.

#include <distribute/concepts/device.hpp>

#include <cstddef>
#include <cstdint>
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
// model whose `device_type` is not a CPU are copied to the host first (device_to_host<D>, which the
// device's header defines: device/cuda.cuh).
struct model_digest {
  std::uint64_t parameters = fnv1a_basis;
  std::uint64_t buffers = fnv1a_basis;
  // Both parts in one value.
  std::uint64_t state() const noexcept { return fnv1a(&buffers, sizeof buffers, parameters); }
};

// Copies n elements from the memory of device D to the host (specialised per device).
template <class D>
struct device_to_host;

template <class M>
model_digest digest_model(M& model) {
  model_digest d;
  model.for_each_parameter([&](auto value, auto) {
    if constexpr (requires { M::device_type::kind; }) {
      if constexpr (M::device_type::kind != device_kind::cpu) {
        using T = std::remove_cv_t<typename decltype(value)::element_type>;
        std::vector<T> host(value.size());
        device_to_host<typename M::device_type>::copy(value.data(), value.size(), host.data());
        d.parameters = fnv1a(host.data(), value.size_bytes(), d.parameters);
        return;
      }
    }
    d.parameters = fnv1a(value.data(), value.size_bytes(), d.parameters);
  });
  if constexpr (requires { model.for_each_buffer([](std::span<double>) {}); })
    model.for_each_buffer([&](std::span<double> b) { d.buffers = fnv1a(b.data(), b.size_bytes(), d.buffers); });
  return d;
}

}  // namespace distribute::detail
