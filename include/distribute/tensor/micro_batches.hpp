#pragma once
// How a batch is cut into micro-batches along its first axis (pipelines, gradient accumulation), and
// how outputs are put back together.

#include <distribute/device/cpu.hpp>
#include <distribute/tensor/tensor.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace distribute {

// The sizes of min(m, n) micro-batches of n examples, as even as possible: the first n % m get one
// more. No micro-batch is empty; a batch of none has no micro-batches.
inline std::vector<std::int64_t> micro_batch_sizes(std::int64_t n, int m) {
  if (m < 1)
    throw std::invalid_argument("distribute: a batch is cut into at least one micro-batch, got " + std::to_string(m));
  const std::int64_t k = std::min<std::int64_t>(m, n);
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(k), k ? n / k : 0);
  for (std::int64_t i = 0; i < (k ? n % k : 0); ++i) ++sizes[static_cast<std::size_t>(i)];
  return sizes;
}

// The shape of `s` with `n` on the first axis.
inline shape with_batch(const shape& s, std::int64_t n) {
  switch (s.rank()) {
    case 1: return shape{n};
    case 2: return shape{n, s[1]};
    case 3: return shape{n, s[1], s[2]};
    case 4: return shape{n, s[1], s[2], s[3]};
    default:
      throw std::invalid_argument(
          "distribute: micro-batches are cut along the first axis of a batch, which has none: " + s.to_string());
  }
}

// Examples [begin, begin + count) of `t`.
template <class T>
tensor<T, cpu> batch_slice(const tensor<T, cpu>& t, std::int64_t begin, std::int64_t count) {
  const std::int64_t n = t.shape().rank() ? t.shape()[0] : 0;
  if (begin < 0 || count < 0 || begin + count > n)
    throw std::invalid_argument("distribute: examples [" + std::to_string(begin) + ", " +
                                std::to_string(begin + count) + ") of a batch of shape " + t.shape().to_string());
  const std::size_t per = n ? t.size() / static_cast<std::size_t>(n) : 0;
  tensor<T, cpu> out{with_batch(t.shape(), count), cpu{}, uninitialized};
  if (count) std::memcpy(out.data(), t.data() + static_cast<std::size_t>(begin) * per, out.size() * sizeof(T));
  return out;
}

// The micro-batches' tensors one after the other along the first axis.
template <class T>
tensor<T, cpu> concatenate(const std::vector<tensor<T, cpu>>& parts) {
  if (parts.empty()) return {};
  std::int64_t n = 0;
  for (const auto& p : parts) n += p.shape()[0];
  tensor<T, cpu> out{with_batch(parts.front().shape(), n), cpu{}, uninitialized};
  std::size_t at = 0;
  for (const auto& p : parts) {
    if (with_batch(p.shape(), 0) != with_batch(parts.front().shape(), 0))
      throw std::invalid_argument("distribute: micro-batch outputs of shapes " + parts.front().shape().to_string() +
                                  " and " + p.shape().to_string() + " cannot be put together");
    std::memcpy(out.data() + at, p.data(), p.size() * sizeof(T));
    at += p.size();
  }
  return out;
}

}  // namespace distribute
