#pragma once
// The GPU's conversions between float and its 16-bit types (__half, __nv_bfloat16): `narrow_to<H>`
// rounds a float to H, to nearest with ties to even (CUDA's `_rn` conversions), and `widen_from<H>`
// turns an H back into a float, exactly. They are Thrust functors, callable on the host and on the
// device (kernels' functors are namespace-scope types, which the generated launch code can name). The
// GPU engine's mixed precision (cuda/engine) and the communicators' bfloat16 gradients on the wire
// (cuda/comm) both go through these, so both round alike.

#include <distribute/config.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

namespace distribute::detail {

template <class H>
struct narrow_to {
  static_assert(std::is_same_v<H, __half> || std::is_same_v<H, __nv_bfloat16>);
  DISTRIBUTE_HOST_DEVICE H operator()(float v) const {
    if constexpr (std::is_same_v<H, __half>) return __float2half_rn(v);
    else return __float2bfloat16_rn(v);
  }
};

template <class H>
struct widen_from {
  static_assert(std::is_same_v<H, __half> || std::is_same_v<H, __nv_bfloat16>);
  DISTRIBUTE_HOST_DEVICE float operator()(H v) const {
    if constexpr (std::is_same_v<H, __half>) return __half2float(v);
    else return __bfloat162float(v);
  }
};

}  // namespace distribute::detail
