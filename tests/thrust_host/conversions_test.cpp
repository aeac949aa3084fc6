// The GPU's float <-> 16-bit conversions (cuda/device/half_conversions.cuh: CUDA's `_rn`
// intrinsics, whose host forms CUDA's headers provide) run through thrust::transform on the host, as
// bfloat16 gradients on the wire are narrowed and widened on a stream, against the library's own
// bfloat16 (distribute/bfloat16.hpp), which the CPU communicators reduce: the same bits for every
// float tried, NaNs included, so a value rounds alike on either side.

#include <boost/test/unit_test.hpp>

#include <distribute/bfloat16.hpp>
#include <distribute/cuda/device/half_conversions.cuh>

#include <thrust/system/cpp/execution_policy.h>
#include <thrust/transform.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace dist = distribute;

namespace {
std::uint16_t bits_of(__nv_bfloat16 h) {
  std::uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}
}  // namespace

BOOST_AUTO_TEST_SUITE(conversions)

BOOST_AUTO_TEST_CASE(cuda_bfloat16_rounding_is_ours) {
  std::mt19937 gen(5);
  std::uniform_int_distribution<std::uint32_t> any;
  std::vector<float> x;
  for (int i = 0; i < 1'000'000; ++i) x.push_back(std::bit_cast<float>(any(gen)));
  // The edges: ties both ways, overflow, infinities, zeros, NaNs of both signs, subnormals.
  for (const std::uint32_t u :
       {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0x7f7f7fffu, 0x7f800000u, 0xff800000u, 0u, 0x80000000u, 0x7fc00000u,
        0xffc00001u, 0x7fffffffu, 0x00010000u, 0x00008000u, 0x00018000u})
    x.push_back(std::bit_cast<float>(u));
  std::vector<__nv_bfloat16> narrowed(x.size());
  thrust::transform(thrust::cpp::par, x.begin(), x.end(), narrowed.begin(), dist::detail::narrow_to<__nv_bfloat16>{});
  std::size_t differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i) differ += bits_of(narrowed[i]) != dist::bfloat16(x[i]).bits();
  BOOST_TEST(differ == 0u);
  std::vector<float> widened(x.size());
  thrust::transform(thrust::cpp::par, narrowed.begin(), narrowed.end(), widened.begin(),
                    dist::detail::widen_from<__nv_bfloat16>{});
  differ = 0;
  for (std::size_t i = 0; i < x.size(); ++i)
    differ += std::bit_cast<std::uint32_t>(widened[i]) !=
              std::bit_cast<std::uint32_t>(static_cast<float>(dist::bfloat16(x[i])));
  BOOST_TEST(differ == 0u);
}

BOOST_AUTO_TEST_SUITE_END()
