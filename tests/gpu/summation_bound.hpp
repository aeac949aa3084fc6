#pragma once
// How far apart two float32 computations of the same sums of products may be: the bound the GPU
// tests hold cuDNN's convolutions to against the CPU engine's float32 reference.
//
// An output that sums K products p_i = a_i * b_i in float32, in any order, is off from the exact sum
// by at most gamma * sum |p_i|: each p_i passes through its own rounding and at most K - 1
// additions, K roundings of relative size u = 2^-24 or less, whatever the order (Higham, Accuracy
// and Stability of Numerical Algorithms, 2nd ed., section 3.1). Two bounds on gamma:
//
//   every rounding at its worst:             gamma_K = K u / (1 - K u)
//   roundings independent with mean zero:    gamma~_K = exp(lambda sqrt(K) u + K u^2 / (1 - u)) - 1,
//     which holds with probability at least 1 - 2K exp(-lambda^2 (1 - u)^2 / 2) per output, again
//     for any order (Higham and Mary, "A new approach to probabilistic rounding error analysis",
//     SIAM J. Sci. Comput. 41(5), 2019, the bound for inner products).
//
// The orders are unknown (cuDNN picks its kernels; the CPU reference is a blocked Eigen product), so
// each side gets the bound of any order, and a sequential one (a thread accumulating along a GEMM's
// K, as implicit-GEMM kernels do) must be admitted: a pairwise order's log2(K) would be no bound.
// Two computations then differ by at most the sum of their bounds, 2 gamma sum |p_i|, where
// sum |p_i| is the same convolution of |a| and |b| computed in double (its own rounding, 2^29 times
// smaller than float32's, is left out).
//
// The worst case alone is no test of long sums. At K = 65,536 (the 7x7 weight gradient over a
// 256x256 image) 2 gamma_K is 0.8% of sum |p_i|, about 128 for inputs uniform in [-1, 1), whose
// outputs are about 85 (root mean square): most outputs would pass as zeros. The probabilistic
// bound is sqrt(K) / lambda times smaller; lambda = 10 makes it fail with probability 2K e^-50 per
// output (2.5e-17 at K = 65,536), below 1e-9 over the 14 million outputs the GPU test compares, and
// puts 2 gamma~ at 3.1e-4 of sum |p_i| there (about 5, 6% of a typical output). Each side takes the
// smaller of the two: the worst case for sums shorter than lambda^2 = 100 terms, the probabilistic
// bound beyond. tests/launch_shape/summation_bound_test.cpp checks both on simulated orders: every
// order within 1% of the bound, and wrong results caught (a term left out; on most outputs, an error
// of 1%, or 10% in the 65,536-term sums).
//
// Plain C++ (compiled by the C++ compiler in the CPU tests and by nvcc in the GPU tests).

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

namespace distribute::test::summation_bound {

inline constexpr double float32_roundoff = 0x1p-24;
// lambda of the probabilistic bound (above).
inline constexpr double confidence = 10;

// gamma_n: n roundings of unit roundoff u, each at its worst (infinite where n u >= 1).
inline double worst_case(std::int64_t n, double u = float32_roundoff) {
  const double nu = static_cast<double>(n) * u;
  return nu < 1 ? nu / (1 - nu) : std::numeric_limits<double>::infinity();
}

// gamma~_n(lambda): n roundings of unit roundoff u, independent with mean zero.
inline double probable(std::int64_t n, double u = float32_roundoff, double lambda = confidence) {
  const double nd = static_cast<double>(n);
  return std::expm1(lambda * std::sqrt(nd) * u + nd * u * u / (1 - u));
}

// The bound of one side, relative to sum |p_i|, for outputs of at most `terms` products.
inline double factor(std::int64_t terms, double u = float32_roundoff, double lambda = confidence) {
  const std::int64_t n = std::max<std::int64_t>(terms, 1);
  return std::min(worst_case(n, u), probable(n, u, lambda));
}

// Two float32 computations of the same outputs, each within its own bound: their difference's.
inline double between(std::int64_t terms) { return 2 * factor(terms); }

// The outcome of a comparison: how many elements are beyond `bound_factor * absolute_sums[i]`, and
// the worst of them (the largest ratio of the difference to its bound; a NaN counts as infinite).
struct verdict {
  std::size_t elements = 0;  // of `want`
  std::size_t exceeding = 0;
  bool sizes_differ = false;
  std::size_t got_elements = 0, sums_elements = 0;
  double bound_factor = 0;
  std::size_t worst_at = 0;
  double worst_ratio = 0;
  double worst_got = 0, worst_want = 0, worst_bound = 0;

  bool within() const noexcept { return !sizes_differ && exceeding == 0; }
  std::string describe() const {
    std::ostringstream s;
    if (sizes_differ) {
      s << "sizes differ: " << got_elements << " elements against " << elements << " (with " << sums_elements
        << " sums)";
      return s.str();
    }
    s << exceeding << " of " << elements << " elements beyond " << bound_factor << " * sum|p_i|; worst: element "
      << worst_at << ", " << worst_got << " against " << worst_want << ", off by " << std::abs(worst_got - worst_want)
      << " = " << worst_ratio << " x its bound " << worst_bound;
    return s.str();
  }
};

// `got` against `want`, element i within bound_factor * absolute_sums[i] (absolute_sums: sum |p_i|
// of each output).
template <class Got, class Want>
verdict compare(const std::vector<Got>& got, const std::vector<Want>& want, const std::vector<double>& absolute_sums,
                double bound_factor) {
  verdict v;
  v.bound_factor = bound_factor;
  v.elements = want.size();
  v.got_elements = got.size();
  v.sums_elements = absolute_sums.size();
  if (got.size() != want.size() || absolute_sums.size() != want.size()) {
    v.sizes_differ = true;
    return v;
  }
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double diff = std::abs(g - w), bound = bound_factor * absolute_sums[i];
    double ratio = diff / bound;
    if (diff == 0) ratio = 0;
    if (std::isnan(ratio)) ratio = std::numeric_limits<double>::infinity();
    if (!(diff <= bound)) ++v.exceeding;
    if (i == 0 || ratio > v.worst_ratio) {
      v.worst_ratio = ratio;
      v.worst_at = i;
      v.worst_got = g;
      v.worst_want = w;
      v.worst_bound = bound;
    }
  }
  return v;
}

}  // namespace distribute::test::summation_bound
