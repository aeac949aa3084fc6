#pragma once
// Reflection padding (nn/conv2d.hpp's padding mode), forward and backward.
// Functors over raw pointers that any engine runs (nn/detail/kernels.hpp): each is called with an
// element index i, or a plane (segment) s and an index i within it.

#include <distribute/config.hpp>

#include <cstdint>

namespace distribute::nn::detail::kernels {

using index = std::int64_t;

// Reflection ("mirror without repeating the edge", PyTorch ReflectionPad2d): padded index i in
// [-p, n+p) reads source index |i| for i < 0 and 2(n-1) - i for i >= n. Needs p < n.
DISTRIBUTE_HOST_DEVICE constexpr index reflect(index i, index n) noexcept {
  return i < 0 ? -i : (i >= n ? 2 * (n - 1) - i : i);
}
// Plane s of H x W into plane s of (H+2p) x (W+2p); one call per padded row (i: its index). The
// CPU's form of reflect_pad (below).
template <class T>
struct reflect_pad_rows {
  const T* x;
  T* y;
  index height, width, pad;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index ph = height + 2 * pad, pw = width + 2 * pad;
    const T* line = x + (s * height + reflect(i - pad, height)) * width;
    T* out = y + (s * ph + i) * pw;
    for (index j = 0; j < pad; ++j) out[j] = line[pad - j];
    for (index j = 0; j < width; ++j) out[pad + j] = line[j];
    for (index j = 0; j < pad; ++j) out[pad + width + j] = line[width - 2 - j];
  }
};
// The padded indices that reflect onto source index r of n (at most three: the mirror before the
// start, r itself, the mirror past the end), ascending, into `out`; returns how many.
DISTRIBUTE_HOST_DEVICE constexpr int reflected_from(index r, index n, index pad, index* out) noexcept {
  int k = 0;
  if (r >= 1 && r <= pad) out[k++] = pad - r;
  out[k++] = pad + r;
  if (r <= n - 2 && r >= n - 1 - pad) out[k++] = pad + 2 * (n - 1) - r;
  return k;
}
// The adjoint, one call per plane: every padded position's gradient goes to the source position it
// copied, in a fixed order. The CPU's form of reflect_pad_backward (below).
template <class T>
struct reflect_pad_backward_plane {
  const T* dy;
  T* dx;
  index height, width, pad;
  DISTRIBUTE_HOST_DEVICE void operator()(index s) const {
    const index ph = height + 2 * pad, pw = width + 2 * pad;
    T* plane = dx + s * height * width;
    for (index k = 0; k < height * width; ++k) plane[k] = T(0);
    // Row by row, and within a row the left border, the interior, the right border: j in increasing
    // order for every source position, as one loop over j with reflect() would add them, but with a
    // contiguous (vectorised) interior.
    for (index i = 0; i < ph; ++i) {
      T* line = plane + reflect(i - pad, height) * width;
      const T* in = dy + (s * ph + i) * pw;
      for (index j = 0; j < pad; ++j) line[pad - j] += in[j];
      for (index j = 0; j < width; ++j) line[j] += in[pad + j];
      for (index j = 0; j < pad; ++j) line[width - 2 - j] += in[pad + width + j];
    }
  }
};

// The passes the layers launch (engine::for_each_in_segments over planes x elements): one work item
// per element, so that a GPU runs them on as many threads as there are elements. A plane per work
// item, as the CPU wants it, ran one GPU thread per plane: the first H100 run spent 74% of a
// paper-size CycleGAN step in reflect_pad_backward_plane on one block of 256 threads. The CPU engine
// runs a plane at a time through whole_segment: the loops above, which vectorise, with the same bits.

// Element i of padded plane s copies its reflected source.
template <class T>
struct reflect_pad {
  const T* x;
  T* y;
  index height, width, pad;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index i) const {
    const index pw = width + 2 * pad, r = i / pw, c = i - r * pw;
    y[s * (height + 2 * pad) * pw + i] = x[(s * height + reflect(r - pad, height)) * width + reflect(c - pad, width)];
  }
  void whole_segment(index s) const {
    const reflect_pad_rows<T> rows{x, y, height, width, pad};
    for (index i = 0; i < height + 2 * pad; ++i) rows(s, i);
  }
};
// Element k of plane s of the input gradient gathers the (at most nine, usually one) padded
// positions that copied it, padded rows ascending and positions ascending within a row, onto a
// zero: the order in which reflect_pad_backward_plane adds them, so the bits are the same, and a
// gather needs no atomics.
template <class T>
struct reflect_pad_backward {
  const T* dy;
  T* dx;
  index height, width, pad;
  DISTRIBUTE_HOST_DEVICE void operator()(index s, index k) const {
    const index pw = width + 2 * pad, r = k / width, c = k - r * width;
    index rows[3], cols[3];
    const int nr = reflected_from(r, height, pad, rows), nc = reflected_from(c, width, pad, cols);
    const T* plane = dy + s * (height + 2 * pad) * pw;
    T sum = T(0);
    for (int a = 0; a < nr; ++a)
      for (int b = 0; b < nc; ++b) sum += plane[rows[a] * pw + cols[b]];
    dx[s * height * width + k] = sum;
  }
  void whole_segment(index s) const { reflect_pad_backward_plane<T>{dy, dx, height, width, pad}(s); }
};

}  // namespace distribute::nn::detail::kernels
