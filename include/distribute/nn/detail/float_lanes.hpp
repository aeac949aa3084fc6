#pragma once
// exp, log, the logistic function and softplus in float on the host, `width` values at a time, in
// vector code (libm's expf and log1pf are a call per value: a softplus over 2M values took 25 ms
// on two Zen 3 cores where PyTorch's vectorised one took 3.4; see docs/benchmarks.md).
//
// The bits of a value must not depend on where it lies: not on the thread count (the engine cuts
// its range by threads), not on the offset of a tensor in memory, not on whether it came from the
// bulk pass or from one call per element (a recorded gradient's recomputation). So every value, in
// bulk or alone, goes through the same out-of-line block function: `width` values in vectors of
// GCC's vector extension (g++ and clang), the same instructions for every lane; one value alone is
// a block with the rest zero (`one`), a short tail a block padded with zeros (`part`). Nothing
// depends on the address or on which lanes are in use. (Plain loops would not do: GCC vectorises a
// loop with selects only without -ftrapping-math, its default, and a loop it does vectorise has a
// scalar remainder whose contractions into fused multiply-adds may differ.)
//
// Accuracy: exp and log are Cephes' single-precision polynomials; softplus is
// max(z, 0) + log1p(e^-|z|) with log1p(t) = log(1 + t) * t / ((1 + t) - 1). Measured against double
// over every 4099th float (tests/nn/ops_test.cpp): exp within 1 ulp, log 0.8, the logistic
// function 2.3, softplus 2.7, subnormal inputs and results included; infinities and NaN as libm's.
// On a GPU the functions keep CUDA's own.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__GNUC__) && !defined(__clang__)
// noclone: no copy specialised for one caller's constants, so that every caller runs one code.
#  define DISTRIBUTE_LANES_FUNCTION __attribute__((noinline, noclone)) inline
#elif defined(__GNUC__)
#  define DISTRIBUTE_LANES_FUNCTION __attribute__((noinline)) inline
#else
#  define DISTRIBUTE_LANES_FUNCTION inline
#endif

// The vectors pass between inline functions only: no ABI is at stake.
#if defined(__GNUC__)
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wpsabi"
#endif

namespace distribute::nn::detail::lanes {

inline constexpr int width = 16;

#if defined(__GNUC__)
inline namespace vector_lanes {

// Floats and as many 32-bit integers, with the same arithmetic in every lane: a cast from one to
// the other, (vf)k, keeps the bits; __builtin_convertvector converts the values. The widest vector
// the target has whole instructions for (a wider one GCC takes apart lane by lane); a block is
// width / lanes_per_vector of them.
#  if defined(__AVX512F__)
inline constexpr int vector_bytes = 64;
#  elif defined(__AVX__)
inline constexpr int vector_bytes = 32;
#  else
inline constexpr int vector_bytes = 16;
#  endif
inline constexpr int lanes_per_vector = vector_bytes / static_cast<int>(sizeof(float));
using vf = float __attribute__((vector_size(vector_bytes)));
using vi = std::int32_t __attribute__((vector_size(vector_bytes)));

namespace lane {

// Each function replaces the vector it is given (passed by reference: a vector argument's ABI
// depends on the instruction set, and GCC warns of it).

// e^c for c in [-104, 89] (not NaN): n = round(c / ln 2), r = c - n ln 2 (ln 2 in two parts), e^r
// by a degree-7 polynomial, then times 2^n in two factors (2^(n/2) 2^(n - n/2)) so that results in
// the subnormal range round once.
inline void exp_in_range(vf& c) {
  const vf round = vf{} + 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const vf n = (c * 1.44269504088896341f + round) - round;
  vf r = c - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  vf p = vf{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const vf e_r = p * (r * r) + r + 1.0f;
  const vi k = __builtin_convertvector(n, vi), k1 = k >> 1, k2 = k - k1;
  c = e_r * (vf)((k1 + 127) << 23) * (vf)((k2 + 127) << 23);
}
inline void exp(vf& x) {
  const vf zero = vf{}, high = zero + 89.0f, low = zero - 104.0f;
  vf c = x > high ? high : x;  // e^89 overflows to infinity
  c = c < low ? low : c;       // and e^-104 underflows to 0
  c = x != x ? zero : c;
  exp_in_range(c);
  x = x != x ? x : c;
}

// log(m 2^e) for m - 1 in [sqrt(1/2) - 1, sqrt(2) - 1) and e as a float: a degree-9 polynomial in
// m - 1, plus e ln 2 (in two parts). On return m holds the logarithm.
inline void log_reduced(vf& m, vf e) {
  const vf z = m * m;
  vf p = vf{} + 7.0376836292e-2f;
  p = p * m - 1.1514610310e-1f;
  p = p * m + 1.1676998740e-1f;
  p = p * m - 1.2420140846e-1f;
  p = p * m + 1.4249322787e-1f;
  p = p * m - 1.6668057665e-1f;
  p = p * m + 2.0000714765e-1f;
  p = p * m - 2.4999993993e-1f;
  p = p * m + 3.3333331174e-1f;
  vf y = p * m * z;
  y = y + e * -2.12194440e-4f;
  y = y - 0.5f * z;
  m = (m + y) + e * 0.693359375f;
}
// log x: x = m 2^e with m in [sqrt(1/2), sqrt(2)). Subnormal x is scaled by 2^23 first.
inline void log(vf& x) {
  const vf zero = vf{};
  const vi subnormal = x < zero + std::numeric_limits<float>::min();
  const vf s = subnormal ? x * 8388608.0f : x;
  const vi bits = (vi)s;
  const vi e0 = ((bits >> 23) & 0xff) - 126;
  const vi e1 = subnormal ? e0 - 23 : e0;
  vf m = (vf)((bits & 0x007fffff) | 0x3f000000);  // [0.5, 1)
  const vi low = m < zero + 0.707106781186547524f;
  const vi e = low ? e1 - 1 : e1;
  m = low ? m + m - 1.0f : m - 1.0f;
  log_reduced(m, __builtin_convertvector(e, vf));
  const vf inf = zero + std::numeric_limits<float>::infinity();
  vf out = x == inf ? inf : m;
  out = x == zero ? -inf : out;
  out = x < zero ? zero + std::numeric_limits<float>::quiet_NaN() : out;
  x = x != x ? x : out;
}
// log u for u in [1, 2]: log's arithmetic for those values, without its special cases (the same
// bits).
inline void log_1_to_2(vf& u) {
  const vi high = u >= vf{} + 1.41421353816986083984375f;  // the float below sqrt(2), as log's test
  vf m = high ? u * 0.5f - 1.0f : u - 1.0f;
  log_reduced(m, high ? vf{} + 1.0f : vf{});
  u = m;
}

// 1 / (1 + e^-x), as t / (1 + t) with t = e^x for negative x (e^-x would overflow where the result
// is still subnormal). Every lane computes what either side needs: one division serves both.
inline void logistic(vf& x) {
  const vi negative = x < vf{};
  vf t = negative ? x : -x;
  exp(t);
  const vf q = 1.0f / (1.0f + t);
  x = negative ? t * q : q;
}

// log(1 + e^z) = max(z, 0) + log1p(e^-|z|), log1p(t) = log(1 + t) * t / ((1 + t) - 1) (t itself
// where 1 + t rounds to 1).
inline void softplus_of(vf& z) {
  const vf zero = vf{}, low = zero - 104.0f;
  vf t = z < zero ? z : -z;
  t = t < low ? low : t;
  t = z != z ? zero : t;
  exp_in_range(t);
  const vf u = 1.0f + t, d = u - 1.0f;
  vf l = u;
  log_1_to_2(l);
  const vf sum = (z > zero ? z : zero) + (d == zero ? t : l * (t / d));
  z = z != z ? z : sum;
}
inline void softplus(vf& x, float beta, float threshold) {
  vf z = x * beta;
  const vi past = z > vf{} + threshold;
  softplus_of(z);
  x = past ? x : z * (1.0f / beta);
}
inline void softplus_derivative(vf& x, float beta, float threshold) {
  vf z = x * beta;
  const vi past = z > vf{} + threshold;
  logistic(z);
  x = past ? vf{} + 1.0f : z;
}

}  // namespace lane

// y[l] = f(x[l]) for l < width, a vector at a time.
template <class F>
void apply(const float* x, float* y, F f) {
  for (int l = 0; l < width; l += lanes_per_vector) {
    vf v;
    std::memcpy(&v, x + l, sizeof v);
    f(v);
    std::memcpy(y + l, &v, sizeof v);
  }
}

#else
// A compiler without the extension (g++, clang, and nvcc's and clang's CUDA front ends for the host
// side all have it): libm's functions one value at a time, in a namespace of its own so that the two
// are not one function with two definitions. Its bits may differ from the vector code's by an ulp or
// two; each is the same wherever a value lies.
inline namespace scalar_lanes {
namespace lane {
inline void exp(float& x) { x = std::exp(x); }
inline void log(float& x) { x = std::log(x); }
inline void logistic(float& x) { x = 1.0f / (1.0f + std::exp(-x)); }
inline void softplus(float& x, float beta, float threshold) {
  x = beta * x > threshold ? x : std::log1p(std::exp(beta * x)) / beta;
}
inline void softplus_derivative(float& x, float beta, float threshold) {
  x = beta * x > threshold ? 1.0f : 1.0f / (1.0f + std::exp(-beta * x));
}
}  // namespace lane
template <class F>
void apply(const float* x, float* y, F f) {
  for (int l = 0; l < width; ++l) {
    float v = x[l];
    f(v);
    y[l] = v;
  }
}
#endif

// The block functions: y[l] = f(x[l]) for l < width.
DISTRIBUTE_LANES_FUNCTION void exp(const float* x, float* y) {
  apply(x, y, [](auto& v) { lane::exp(v); });
}
DISTRIBUTE_LANES_FUNCTION void log(const float* x, float* y) {
  apply(x, y, [](auto& v) { lane::log(v); });
}
DISTRIBUTE_LANES_FUNCTION void logistic(const float* x, float* y) {
  apply(x, y, [](auto& v) { lane::logistic(v); });
}
// log(1 + exp(beta x)) / beta, and x where beta x > threshold.
DISTRIBUTE_LANES_FUNCTION void softplus(const float* x, float* y, float beta, float threshold) {
  apply(x, y, [beta, threshold](auto& v) { lane::softplus(v, beta, threshold); });
}
// Its derivative: the logistic function of beta x, and 1 where beta x > threshold.
DISTRIBUTE_LANES_FUNCTION void softplus_derivative(const float* x, float* y, float beta, float threshold) {
  apply(x, y, [beta, threshold](auto& v) { lane::softplus_derivative(v, beta, threshold); });
}

}  // inline namespace

// One value through a block function (the other lanes 0): the bits it has in bulk.
template <class Block>
float one(float x, const Block& block) {
  float in[width] = {}, out[width];
  in[0] = x;
  block(in, out);
  return out[0];
}
// count <= width values at x through a block function, the rest of the block 0.
template <class Block>
void part(const float* x, float* y, int count, const Block& block) {
  float in[width] = {}, out[width];
  for (int l = 0; l < count; ++l) in[l] = x[l];
  block(in, out);
  for (int l = 0; l < count; ++l) y[l] = out[l];
}

}  // namespace distribute::nn::detail::lanes

#if defined(__GNUC__)
#  pragma GCC diagnostic pop
#endif
