#pragma once
// The lookups of nn::embedding (nn/embedding.hpp): rows of the weight gathered for the indices, and
// the gradient of the rows the indices picked. Functors over raw pointers that any engine runs
// (nn/detail/kernels.hpp): each is called with an element index.

#include <distribute/config.hpp>

#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

// Element d of example i's output: element d of the weight's row indices[i] (an integral value of
// T, checked on the host before this runs). One call per output element.
template <class T>
struct embedding_gather {
  const T* indices;
  const T* weight;
  T* y;
  index dim;
  DISTRIBUTE_HOST_DEVICE void operator()(index j) const {
    const index i = j / dim, d = j - i * dim;
    y[j] = weight[static_cast<index>(indices[i]) * dim + d];
  }
};

// The weight gradient as a gather: element d of the u-th row that the batch used (rows[u]) adds
// dy[e, d] of every example e that picked the row, in example order (examples[offsets[u]] to
// examples[offsets[u + 1] - 1], ascending), each added to the gradient in T as it comes. One call per
// element of a used row: no two calls write the same element, so no atomics, and the order of the
// additions is fixed, so the bits do not depend on the device or the thread count; a batch split into
// parts and accumulated gives the bits of the whole batch.
template <class T>
struct embedding_row_gradient {
  const T* dy;
  const index* rows;
  const index* offsets;
  const index* examples;
  T* grad;
  index dim;
  DISTRIBUTE_HOST_DEVICE void operator()(index j) const {
    const index u = j / dim, d = j - u * dim;
    T* g = grad + rows[u] * dim + d;
    T sum = *g;
    for (index p = offsets[u]; p < offsets[u + 1]; ++p) sum += dy[examples[p] * dim + d];
    *g = sum;
  }
};

}  // namespace distribute::nn::detail::kernels
