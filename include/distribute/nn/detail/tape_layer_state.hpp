#pragma once
// What nn::tape keeps around a layer call: the states of finished calls, reused by the next calls of
// the same layer, and a frozen call's parameter gradients, set aside and put back.

#include <distribute/nn/detail/tensor_op_kernels.hpp>
#include <distribute/tensor/tensor.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

namespace distribute::nn::detail {

// The states of finished calls, kept for the next calls of the same layer on this thread: a new
// state allocates its buffers anew at every step (fresh pages, a fault for each), where the
// stateful pair reuses its own; measured, that tripled the cost of a small U-Net's step. A forward
// overwrites every field it reads back, so a state left by a layer since destroyed is only memory.
// The tape uses it on the CPU only: device memory comes from a caching pool already, and is freed on
// a stream, which a state kept past its strategy would outlive.
template <class S>
std::vector<std::unique_ptr<S>>& spare_states(const void* layer) {
  thread_local std::unordered_map<const void*, std::vector<std::unique_ptr<S>>> spares;
  if (spares.size() > 256 && !spares.contains(layer)) spares.clear();
  return spares[layer];
}

// A frozen call's parameter gradients, copied aside by the engine before its backward...
template <class T, class E, class L, class D>
std::vector<tensor<T, D>> set_aside_gradients(E& e, L& layer, const D& device) {
  std::vector<tensor<T, D>> kept;
  layer.for_each_parameter([&](std::span<T>, std::span<T> grad) {
    tensor<T, D>& k = kept.emplace_back(shape{static_cast<std::int64_t>(grad.size())}, device, uninitialized);
    e.for_each(static_cast<std::int64_t>(grad.size()), kernels::copy<T>{grad.data(), k.data()});
  });
  return kept;
}
// ... and put back after it.
template <class T, class E, class L, class D>
void put_back_gradients(E& e, L& layer, const std::vector<tensor<T, D>>& kept) {
  std::size_t i = 0;
  layer.for_each_parameter([&](std::span<T>, std::span<T> grad) {
    e.for_each(static_cast<std::int64_t>(grad.size()), kernels::copy<T>{kept[i++].data(), grad.data()});
  });
}

}  // namespace distribute::nn::detail
