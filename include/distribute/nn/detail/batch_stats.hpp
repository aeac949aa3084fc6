#pragma once
// Per-channel moments (count, mean, M2 = sum of squared deviations) and their exact merge by Chan's
// parallel formula: merging the moments of two disjoint sets gives the moments of their union, for
// any counts, zero included. Shared math, so it compiles for host and device alike.

#include <distribute/config.hpp>

namespace distribute::nn::detail {

struct moments {
  double count = 0;
  double mean = 0;
  double m2 = 0;
};

DISTRIBUTE_HOST_DEVICE constexpr moments merge(const moments& a, const moments& b) noexcept {
  const double n = a.count + b.count;
  if (n == 0) return {};
  const double delta = b.mean - a.mean;
  return {n, a.mean + delta * (b.count / n), a.m2 + b.m2 + delta * delta * (a.count * b.count / n)};
}

// The moments of channel `c` of an NCHW batch of `n` examples, `channels` planes of `plane` values:
// two passes (mean, then squared deviations), in index order, accumulated in double.
template <class T>
moments channel_moments(const T* x, long long n, long long channels, long long plane, long long c) {
  const double count = static_cast<double>(n * plane);
  if (count == 0) return {};
  double s = 0;
  for (long long e = 0; e < n; ++e) {
    const T* p = x + (e * channels + c) * plane;
    for (long long i = 0; i < plane; ++i) s += static_cast<double>(p[i]);
  }
  const double mean = s / count;
  double m2 = 0;
  for (long long e = 0; e < n; ++e) {
    const T* p = x + (e * channels + c) * plane;
    for (long long i = 0; i < plane; ++i) {
      const double d = static_cast<double>(p[i]) - mean;
      m2 += d * d;
    }
  }
  return {count, mean, m2};
}

// The input gradient of a normalisation over one plane of `n` values starting at `off`:
// dx = k (dy - mean(dy) - xhat mean(dy xhat)), with k = gamma * invstd. Batch norm and instance norm
// differ only in which values the means run over.
template <class Out, class In, class T>
void normalized_input_gradient(Out& dx, const In& dy, const In& xhat, long long off, long long n, T k, T mean_dy,
                               T mean_dyx) noexcept {
  for (long long i = 0; i < n; ++i) {
    const auto j = static_cast<unsigned long long>(off + i);
    dx[j] = k * (dy[j] - mean_dy - xhat[j] * mean_dyx);
  }
}

}  // namespace distribute::nn::detail
