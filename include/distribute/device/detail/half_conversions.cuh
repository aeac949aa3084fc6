#pragma once
// float to a 16-bit type and back, as Thrust functors (kernels' functors are namespace-scope types,
// which the generated launch code can name): narrowing rounds to nearest, ties to even (CUDA's
// `_rn` conversions); widening is exact. Mixed precision's operands and bfloat16 gradients on the
// wire both go through these.

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
