#pragma once
// The losses (nn/losses.hpp, nn/classification_losses.hpp): per-element values and gradients,
// softmax cross-entropy, and a loss's value from its per-example sums.
// Functors over raw pointers that any engine runs (nn/detail/kernels.hpp): each is called with an
// element index i, or a plane (segment) s and an index i within it.

#include <distribute/config.hpp>

#include <cmath>
#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

// Per example s of `per` elements: the loss's per-element value (for the segmented sum) and its
// gradient d/dpred written alongside, scaled by `scale` (1 / (per * global batch)). `Loss` gives
// value(d) and derivative(d) of the difference d = pred - target.
template <class T, class Loss>
struct elementwise_loss {
  const T* pred;
  const T* target;
  T* grad;
  double scale;
  index per;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    const index j = s * per + i;
    const double d = static_cast<double>(pred[j]) - static_cast<double>(target[j]);
    grad[j] = static_cast<T>(Loss::derivative(d) * scale);
    return Loss::value(d);
  }
};
struct squared {
  DISTRIBUTE_HOST_DEVICE static double value(double d) { return d * d; }
  DISTRIBUTE_HOST_DEVICE static double derivative(double d) { return 2 * d; }
};
// The derivative at 0 is 0.
struct absolute {
  DISTRIBUTE_HOST_DEVICE static double value(double d) { return d < 0 ? -d : d; }
  DISTRIBUTE_HOST_DEVICE static double derivative(double d) { return d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0); }
};
template <class T>
using squared_error = elementwise_loss<T, squared>;
template <class T>
using absolute_error = elementwise_loss<T, absolute>;

// Binary cross-entropy of a logit x and a target t, per element, in the form that neither overflows
// nor loses the small terms: max(x, 0) - x t + log1p(exp(-|x|)); its derivative sigmoid(x) - t
// (scaled like elementwise_loss's).
template <class T>
struct sigmoid_cross_entropy {
  const T* pred;
  const T* target;
  T* grad;
  double scale;
  index per;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    const index j = s * per + i;
    const double x = static_cast<double>(pred[j]), t = static_cast<double>(target[j]);
    const double e = std::exp(x < 0 ? x : -x);  // exp(-|x|), in (0, 1]
    const double sigmoid = x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
    grad[j] = static_cast<T>((sigmoid - t) * scale);
    return (x > 0 ? x : 0.0) - x * t + std::log1p(e);
  }
};

// Softmax cross-entropy over the rows of [rows, length] logits, in three passes: each row's maximum
// (`row_max`), the sum of exp(x - max) (`shifted_exp`, a segmented sum), then the value and the
// gradient. Everything past the logits is in double.
template <class T>
struct row_max {
  const T* x;
  double* max;
  index length;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const {
    const T* row = x + s * length;
    double m = length > 0 ? static_cast<double>(row[0]) : 0.0;
    for (index i = 1; i < length; ++i)
      if (static_cast<double>(row[i]) > m) m = static_cast<double>(row[i]);
    max[s] = m;
  }
};
template <class T>
struct shifted_exp {
  const T* x;
  const double* shift;
  index length;
  DISTRIBUTE_HOST_DEVICE double operator()(index s, index i) const {
    return std::exp(static_cast<double>(x[s * length + i]) - shift[s]);
  }
};
// Row s's loss: log(sum exp(x - max)) - (x[label] - max), the log-sum-exp less the label's logit.
template <class T>
struct softmax_cross_entropy_value {
  const T* x;
  const std::int32_t* labels;
  const double* shift;
  const double* denominator;
  double* loss;
  index length;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const {
    loss[s] = std::log(denominator[s]) - (static_cast<double>(x[s * length + labels[s]]) - shift[s]);
  }
};
// Element j (row j / length): (softmax - one_hot(label)) * scale.
template <class T>
struct softmax_cross_entropy_gradient {
  const T* x;
  const std::int32_t* labels;
  const double* shift;
  const double* denominator;
  T* grad;
  double scale;
  index length;
  DISTRIBUTE_HOST_DEVICE void operator()(index j) const {
    const index s = j / length, i = j - s * length;
    const double p = std::exp(static_cast<double>(x[j]) - shift[s]) / denominator[s];
    grad[j] = static_cast<T>((p - (i == labels[s] ? 1.0 : 0.0)) * scale);
  }
};
// The index of row s's largest element; the first of equal ones (torch.argmax's choice).
template <class T>
struct row_argmax {
  const T* x;
  std::int32_t* argmax;
  index length;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const {
    const T* row = x + s * length;
    index best = 0;
    for (index i = 1; i < length; ++i)
      if (row[i] > row[best]) best = i;
    argmax[s] = static_cast<std::int32_t>(best);
  }
};
// A loss's value from its per-example sums (n examples of `per` elements), as the host computes it
// (nn::compute_average_loss): each example's mean rounded to T, summed in index order in double,
// divided by the global batch size. One call (i = 0): n is a batch.
template <class T>
struct average_of_example_means {
  const double* sums;
  T* out;
  index n, per, global_batch_size;
  DISTRIBUTE_HOST_DEVICE void operator()(index) const {
    double s = 0;
    for (index e = 0; e < n; ++e) s += static_cast<double>(static_cast<T>(sums[e] / static_cast<double>(per)));
    *out = static_cast<T>(s / static_cast<double>(global_batch_size));
  }
};

}  // namespace distribute::nn::detail::kernels
