#pragma once
// A tensor's values on the host and back, for the files that carry a model elsewhere
// (nn/safetensors.hpp, nn/onnx.hpp): a CPU tensor is copied directly, a device tensor through the
// copies its type offers (copy_to_host, copy_from_host).

#include <distribute/device/cpu.hpp>
#include <distribute/engine/pass_observer.hpp>
#include <distribute/tensor/tensor.hpp>

#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace distribute::nn::detail {

template <class T, class D>
std::vector<T> host_copy(const tensor<T, D>& t) {
  distribute::detail::record_host_read(t.size() * sizeof(T));
  if constexpr (std::is_same_v<D, cpu>) {
    return std::vector<T>(t.values().begin(), t.values().end());
  } else {
    std::vector<T> out(t.size());
    t.copy_to_host(std::span<T>(out));
    return out;
  }
}

template <class T, class D>
void assign_from_host(tensor<T, D>& t, std::span<const T> values) {
  if constexpr (std::is_same_v<D, cpu>) {
    if (!values.empty()) std::memcpy(t.data(), values.data(), values.size_bytes());
  } else {
    t.copy_from_host(values);
  }
}

}  // namespace distribute::nn::detail
