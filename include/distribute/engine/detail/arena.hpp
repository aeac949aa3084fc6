#pragma once
// One replica's scratch memory: a few slots, each a 64-byte aligned buffer that grows to the largest
// request it has seen and is reused by every layer after. Layers hold no scratch of their own between
// calls; what a pass needs only while it runs (reordered tensors, a library's workspace, im2col
// columns) comes from here, so the scratch of a whole model is that of its largest layer.

#include <array>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>
#include <string>

namespace distribute::detail {

class arena {
 public:
  // rounded_a, rounded_b, rounded_c: copies of a convolution's inputs rounded to bfloat16 where it computes in float32
  // on them (dnnl_conv.hpp's `round`: Winograd in bfloat16), beside the slots its library uses.
  // swapped: a window turned for a swapped convolution's pass, or its weight gradient (dnnl_conv.hpp).
  enum slot : std::size_t {
    src,
    weights,
    dst,
    workspace,
    gradient,
    bias_gradient,
    columns,
    rounded_a,
    rounded_b,
    rounded_c,
    swapped,
    count
  };

  // At least `n` elements of T in slot `s`: valid until the next request for the same slot. Contents
  // are unspecified.
  template <class T>
  T* get(slot s, std::size_t n) {
    block& b = slots_[s];
    const std::size_t bytes = n * sizeof(T);
    if (bytes > b.size) {
      const std::size_t rounded = (bytes + 63) / 64 * 64;
      void* p = std::aligned_alloc(64, rounded);
      if (!p) throw std::bad_alloc();
      b.data.reset(static_cast<std::byte*>(p));
      b.size = rounded;
    }
    return reinterpret_cast<T*>(b.data.get());
  }

  // Bytes held, all slots together.
  std::size_t bytes() const noexcept {
    std::size_t n = 0;
    for (const auto& b : slots_) n += b.size;
    return n;
  }
  void release() noexcept {
    for (auto& b : slots_) {
      b.data.reset();
      b.size = 0;
    }
  }

 private:
  struct free_deleter {
    void operator()(std::byte* p) const noexcept { std::free(p); }
  };
  struct block {
    std::unique_ptr<std::byte[], free_deleter> data;
    std::size_t size = 0;
  };
  std::array<block, count> slots_{};
};

}  // namespace distribute::detail
