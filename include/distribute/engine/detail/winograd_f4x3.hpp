#pragma once
// Winograd's minimal filtering F(4x4, 3x3) for a 3x3 convolution at stride 1 in float32: its forward
// (and so its data gradient, which is the forward of its swapped convolution, dnnl_conv.hpp) and its
// weight gradient, for CPUs where the oneDNN loaded has no Winograd kernel. oneDNN 2.x has one for
// AVX-512 only (`jit_wino_4x3:avx512_core`) and 3.x none on x86, so on a CPU with AVX2 alone every
// convolution ran direct, at the arithmetic bound of its FMA units, where a residual block's 3x3
// convolutions are most of a CycleGAN step. This file is written here because no library at hand
// has the algorithm on those CPUs; its matrix products, which are nearly all of its arithmetic, are
// oneDNN's sgemm.
//
// The algorithm (Lavin and Gray, "Fast Algorithms for Convolutional Neural Networks", 2016): the
// output plane is cut into 4x4 tiles; tile t of output channel k is A^T [ sum_c (G w_kc G^T) .*
// (B^T d_ct B) ] A, where d_ct is the 6x6 patch of input channel c under the tile, w_kc the 3x3
// window and A, B, G the F(4, 3) matrices at the points 0, 1, -1, 1/2, -2 and infinity. Per element xi
// of the 6x6 transformed tile the sum over c is a matrix product: M_xi[k][t] = U_xi[k][c] V_xi[c][t].
// So a pass is: transform the windows (U, 36 x K x C), the input tiles (V, 36 x C x T), 36 matrix
// products, and the inverse transform of M into the output. 36 products of K x C x T against the
// direct kernel's 9 x 16 per tile: a quarter of the multiplications.
//
// The weight gradient is the same bilinear form read the other way: since <dy, A^T (U .* V) A> =
// <G^T [(A dy A^T) .* V] G, w>, the window's gradient is dw_kc = G^T [ sum_t (A dy_kt A^T) .* V_ct ] G:
// transform dy's 4x4 tiles (Z, 36 x K x T) and the input tiles (V), 36 products Z_xi V_xi^T that sum
// over the tiles, and the 6x6 -> 3x3 transform of each sum.
//
// A batch is computed one example at a time, so that the scratch (the transformed tiles, 36 values
// for every 16 outputs of a plane) is one example's; the weight gradient's products add each example's
// sums to the previous ones, in order.
//
// Bits: every value is computed by one thread in an order fixed by the geometry. The transforms are
// element-wise per tile; the products are cut into items fixed by the geometry alone (each element xi,
// and for the forward an example's tiles in blocks of `tile_block`, for the weight gradient blocks of
// `channel_block` output channels), each one sgemm call on one thread (oneDNN's sgemm runs on one
// thread inside a parallel region). So the result follows neither the thread count nor, in the
// forward and data gradient, how a batch is split. Rounding: a few 1e-6 of an output's largest
// magnitude over 256 channels (oneDNN's Winograd kernel: about 2e-5), from the points' powers of 2
// (up to 8) and the divisions by 3 and 15.

#include <distribute/bfloat16.hpp>
#include <distribute/engine/conv_geometry.hpp>
#include <distribute/engine/detail/arena.hpp>
#include <distribute/engine/detail/openmp.hpp>

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(_OPENMP)
// The loops over tiles and windows are independent: their iterations may run in SIMD lanes.
#  define DISTRIBUTE_WINOGRAD_SIMD _Pragma("omp simd")
#else
#  define DISTRIBUTE_WINOGRAD_SIMD
#endif

namespace distribute::detail {

class winograd_f4x3 {
 public:
  // The name the engine reports for passes computed here (implementation()).
  static constexpr const char* name = "winograd_f4x3:sgemm";
  // The forward's matrix products take an example's tiles in blocks of this many; the weight
  // gradient's take output channels in blocks of this many (fixed: the bits follow the geometry only).
  static constexpr std::int64_t tile_block = 256;
  static constexpr std::int64_t channel_block = 64;
  // Windows transformed together (transform_windows, add_window_gradients).
  static constexpr std::int64_t chunk = 256;

  // A 3x3 window at stride 1 with the same padding, at most 2, on every side.
  static bool applies(const conv_geometry& g) noexcept {
    return g.kernel == 3 && g.stride == 1 && g.pad <= 2 && g.out_height == g.in_height + 2 * g.pad - 2 &&
           g.out_width == g.in_width + 2 * g.pad - 2;
  }

  // y = conv(x, w) + bias (bias may be null), overwritten; with `round`, of x and w rounded to
  // bfloat16 (as oneDNN's bfloat16 kernels read them). `team`: the threads to run on.
  static void forward(const conv_geometry& g, const float* x, const float* w, const float* bias, float* y, arena& a,
                      bool round, int team) {
    require(g);
    const conv_geometry e = one_example(g);
    const tiling t = tiling::of(e);
    const std::int64_t K = g.out_channels, C = g.in_channels;
    const std::int64_t su = spaced(K * C), sv = spaced(C * t.all), sm = spaced(K * t.all);
    float* U = a.get<float>(arena::weights, static_cast<std::size_t>(36 * su));
    float* V = a.get<float>(arena::src, static_cast<std::size_t>(36 * sv));
    float* M = a.get<float>(arena::dst, static_cast<std::size_t>(36 * sm));
    transform_windows(K * C, su, w, U, round, team);
    const std::int64_t blocks = (t.all + tile_block - 1) / tile_block;
    for (std::int64_t n = 0; n < g.batch; ++n) {
      transform_input(e, t, x + n * g.in_channels * g.in_height * g.in_width, V, sv, round, team);
      parallel_items(36 * blocks, team, [&](std::int64_t item) {
        const std::int64_t xi = item / blocks, first = item % blocks * tile_block;
        const std::int64_t cols = std::min(tile_block, t.all - first);
        sgemm('N', 'N', K, cols, C, U + xi * su, C, V + xi * sv + first, t.all, 0.0f, M + xi * sm + first, t.all);
      });
      transform_output(e, t, M, sm, bias, y + n * K * g.out_height * g.out_width, team);
    }
  }

  // dw += the weight gradient for (x, dy); with `round`, of x and dy rounded to bfloat16. The bias
  // gradient is the caller's (a plain sum of dy).
  static void backward_weights(const conv_geometry& g, const float* x, const float* dy, float* dw, arena& a, bool round,
                               int team) {
    require(g);
    const conv_geometry e = one_example(g);
    const tiling t = tiling::of(e);
    const std::int64_t K = g.out_channels, C = g.in_channels;
    const std::int64_t sv = spaced(C * t.all), sz = spaced(K * t.all), ss = spaced(K * C);
    float* V = a.get<float>(arena::src, static_cast<std::size_t>(36 * sv));
    float* Z = a.get<float>(arena::dst, static_cast<std::size_t>(36 * sz));
    float* S = a.get<float>(arena::gradient, static_cast<std::size_t>(36 * ss));
    const std::int64_t blocks = (K + channel_block - 1) / channel_block;
    for (std::int64_t n = 0; n < g.batch; ++n) {  // S summed over the examples in order
      transform_input(e, t, x + n * C * g.in_height * g.in_width, V, sv, round, team);
      transform_gradient(e, t, dy + n * K * g.out_height * g.out_width, Z, sz, round, team);
      parallel_items(36 * blocks, team, [&](std::int64_t item) {
        const std::int64_t xi = item / blocks, k0 = item % blocks * channel_block;
        const std::int64_t rows = std::min(channel_block, K - k0);
        sgemm('N', 'T', rows, C, t.all, Z + xi * sz + k0 * t.all, t.all, V + xi * sv, t.all, n == 0 ? 0.0f : 1.0f,
              S + xi * ss + k0 * C, C);
      });
    }
    if (g.batch == 0) return;
    add_window_gradients(K * C, ss, S, dw, team);
  }

 private:
  struct tiling {
    std::int64_t rows = 0, cols = 0;  // tiles down and across an output plane
    std::int64_t per_example = 0, all = 0;
    static tiling of(const conv_geometry& g) noexcept {
      tiling t;
      t.rows = (g.out_height + 3) / 4;
      t.cols = (g.out_width + 3) / 4;
      t.per_example = t.rows * t.cols;
      t.all = g.batch * t.per_example;
      return t;
    }
  };

  static conv_geometry one_example(conv_geometry g) noexcept {
    g.batch = 1;
    return g;
  }
  static void require(const conv_geometry& g) {
    if (!applies(g))
      throw std::invalid_argument(
          "distribute: Winograd F(4x4, 3x3) needs a 3x3 window at stride 1 with the same "
          "padding (at most 2) on every side, not " +
          g.to_string());
  }
  // Cm = A B + beta Cm (row-major), on the calling thread: oneDNN's sgemm takes its thread count from
  // the calling thread's OpenMP count, set to one here, whatever the team the call runs in.
  static void sgemm(char ta, char tb, std::int64_t m, std::int64_t n, std::int64_t k, const float* A, std::int64_t lda,
                    const float* B, std::int64_t ldb, float beta, float* Cm, std::int64_t ldc) {
    const one_openmp_thread one;
    if (dnnl_sgemm(ta, tb, m, n, k, 1.0f, A, lda, B, ldb, beta, Cm, ldc) != dnnl_success)
      throw std::runtime_error("distribute: oneDNN's sgemm failed in a Winograd pass");
  }
  // The distance between consecutive matrices xi of n values each in the transformed tiles and
  // windows: n rounded up to 4 KiB, plus 64 bytes. A tile's 36 (or a window's) values go to the 36
  // matrices, and at a distance that is a multiple of 4 KiB (256 channels of 16x16 tiles: 256 KiB)
  // all 36 fall in one set of the L1 and L2 caches, which hold 8 to 16 lines a set: a transform then
  // waits on memory at nearly every store. 64 bytes more puts them in 36 sets. The products and
  // their bits do not change (each reads and writes its own matrices, 64-byte aligned as before).
  static constexpr std::int64_t spaced(std::int64_t n) noexcept { return (n + 1023) / 1024 * 1024 + 16; }
  static float maybe_round(float v, bool round) noexcept { return round ? static_cast<float>(bfloat16(v)) : v; }

  // The 1-D transforms of F(4, 3) at the points 0, 1, -1, 1/2, -2 and infinity (Toom-Cook: A^T's
  // columns are the points' powers, G's rows those over the products of the differences, B^T's rows
  // the coefficients of the products of (x - a) over the other points). Against the points 0, 1, -1,
  // 2, -2 usual since Lavin and Gray, a half for a power of two halves the rounding error, forward
  // and weight gradient alike (Barabasz et al., "Error analysis and improving the accuracy of
  // Winograd convolution for deep neural networks", 2020; measured here: the largest error over
  // 256-channel sums 4.6e-6 against 1.0e-5 of the largest magnitude).
  // B^T: a patch's 6 values to 6; G: a window's 3 to 6; A^T: 6 to an output tile's 4; A: a gradient
  // tile's 4 to 6; G^T: 6 to a window gradient's 3.
  static void bt(float d0, float d1, float d2, float d3, float d4, float d5, float* v, std::int64_t s) noexcept {
    v[0] = d0 - 1.5f * d1 - 2.0f * d2 + 1.5f * d3 + d4;
    v[s] = -d1 + 0.5f * d2 + 2.5f * d3 + d4;
    v[2 * s] = d1 - 2.5f * d2 + 0.5f * d3 + d4;
    v[3 * s] = 2.0f * (d3 - d1) - d2 + d4;
    v[4 * s] = 0.5f * (d1 - d3) - d2 + d4;
    v[5 * s] = d1 - 1.5f * d2 - 2.0f * d3 + 1.5f * d4 + d5;
  }
  static void gt3(float g0, float g1, float g2, float* u, std::int64_t s) noexcept {
    u[0] = g0;
    u[s] = (g0 + g1 + g2) / 3.0f;
    u[2 * s] = (g1 - g0 - g2) / 3.0f;
    u[3 * s] = -(16.0f * g0 + 8.0f * g1 + 4.0f * g2) / 15.0f;
    u[4 * s] = (g0 - 2.0f * g1 + 4.0f * g2) / 15.0f;
    u[5 * s] = g2;
  }
  static void at(float m0, float m1, float m2, float m3, float m4, float m5, float* y, std::int64_t s) noexcept {
    y[0] = m0 + m1 + m2 + m3 + m4;
    y[s] = m1 - m2 + 0.5f * m3 - 2.0f * m4;
    y[2 * s] = m1 + m2 + 0.25f * m3 + 4.0f * m4;
    y[3 * s] = m1 - m2 + 0.125f * m3 - 8.0f * m4 + m5;
  }
  static void a4(float d0, float d1, float d2, float d3, float* z, std::int64_t s) noexcept {
    z[0] = d0;
    z[s] = d0 + d1 + d2 + d3;
    z[2 * s] = d0 - d1 + d2 - d3;
    z[3 * s] = d0 + 0.5f * d1 + 0.25f * d2 + 0.125f * d3;
    z[4 * s] = d0 - 2.0f * d1 + 4.0f * d2 - 8.0f * d3;
    z[5 * s] = d3;
  }
  static void gtt(float s0, float s1, float s2, float s3, float s4, float s5, float* r, std::int64_t s) noexcept {
    r[0] = s0 + (s1 - s2) / 3.0f + (s4 - 16.0f * s3) / 15.0f;
    r[s] = (s1 + s2) / 3.0f - (8.0f * s3 + 2.0f * s4) / 15.0f;
    r[2 * s] = (s1 - s2) / 3.0f + (4.0f * s4 - 4.0f * s3) / 15.0f + s5;
  }

  // U[xi][i] = (G w_i G^T)[xi] for the n windows w_i (3x3 each, in a row). A chunk of windows at a
  // time, element by element across the chunk (loops that vectorise): its 9 values gathered, G times
  // each column, each row of that times G^T.
  static void transform_windows(std::int64_t n, std::int64_t stride, const float* w, float* U, bool round, int team) {
    parallel_items((n + chunk - 1) / chunk, team, [&](std::int64_t item) {
      const std::int64_t first = item * chunk, count = std::min(n - first, chunk);
      std::vector<float> buffer(static_cast<std::size_t>((9 + 18 + 6) * chunk));
      float* g = buffer.data();      // [9][chunk]
      float* cols = g + 9 * chunk;   // [6][3][chunk]: G times the window's columns
      float* u = cols + 18 * chunk;  // [6][chunk]
      for (std::int64_t i = 0; i < count; ++i)
        for (int q = 0; q < 9; ++q) g[q * chunk + i] = maybe_round(w[(first + i) * 9 + q], round);
      for (int b = 0; b < 3; ++b) {
        const float *g0 = g + b * chunk, *g1 = g + (3 + b) * chunk, *g2 = g + (6 + b) * chunk;
        DISTRIBUTE_WINOGRAD_SIMD
        for (std::int64_t i = 0; i < count; ++i) gt3(g0[i], g1[i], g2[i], cols + b * chunk + i, 3 * chunk);
      }
      for (int r = 0; r < 6; ++r) {
        const float* c0 = cols + r * 3 * chunk;
        DISTRIBUTE_WINOGRAD_SIMD
        for (std::int64_t i = 0; i < count; ++i) gt3(c0[i], c0[chunk + i], c0[2 * chunk + i], u + i, chunk);
        for (int c = 0; c < 6; ++c) std::copy_n(u + c * chunk, count, U + (r * 6 + c) * stride + first);
      }
    });
  }

  // V[xi][c][t] = (B^T d B)[xi] for each input plane (n, c) and output tile t of example n: the 6x6
  // patch at rows 4 ty - pad.., columns 4 tx - pad.., zero outside the plane.
  static void transform_input(const conv_geometry& g, const tiling& t, const float* x, float* V, std::int64_t stride,
                              bool round, int team) {
    transform_tiles<6>(g.batch, g.in_channels, g.in_height, g.in_width, g.pad, t, x, V, stride, round, team,
                       [](const float* d, std::int64_t ds, float* o, std::int64_t s) {
                         bt(d[0], d[ds], d[2 * ds], d[3 * ds], d[4 * ds], d[5 * ds], o, s);
                       });
  }
  // Z[xi][k][t] = (A dy_t A^T)[xi] for each gradient plane (n, k) and its 4x4 tiles, zero past the plane.
  static void transform_gradient(const conv_geometry& g, const tiling& t, const float* dy, float* Z,
                                 std::int64_t stride, bool round, int team) {
    transform_tiles<4>(
        g.batch, g.out_channels, g.out_height, g.out_width, 0, t, dy, Z, stride, round, team,
        [](const float* d, std::int64_t ds, float* o, std::int64_t s) { a4(d[0], d[ds], d[2 * ds], d[3 * ds], o, s); });
  }
  // out[xi][plane][t] for each of the batch x planes planes (h x w) of `in` and each tile t (4 rows and
  // columns apart): the 1-D transform `f` (R values to 6) down the columns, then along the rows, of
  // the R x R block at rows 4 ty - pad.., columns 4 tx - pad.., zero outside the plane. A plane's
  // band of R rows is gathered (rounded with `round`) and transformed down its columns in loops that
  // vectorise; then each tile's rows, across the tiles.
  template <int R, class F>
  static void transform_tiles(std::int64_t batch, std::int64_t planes, std::int64_t h, std::int64_t w, std::int64_t pad,
                              const tiling& t, const float* in, float* out, std::int64_t stride, bool round, int team,
                              F f) {
    const std::int64_t width = 4 * t.cols + R - 4;  // stride: out's distance between elements xi
    parallel_items(batch * planes, team, [&](std::int64_t item) {
      const std::int64_t n = item / planes, c = item % planes;
      std::vector<float> rows(static_cast<std::size_t>(R * width)), cols(static_cast<std::size_t>(6 * width));
      const float* plane = in + item * h * w;
      for (std::int64_t ty = 0; ty < t.rows; ++ty) {
        for (std::int64_t r = 0; r < R; ++r) {
          float* row = rows.data() + r * width;
          const std::int64_t ih = 4 * ty - pad + r;
          std::fill(row, row + width, 0.0f);
          if (ih < 0 || ih >= h) continue;
          const float* src = plane + ih * w;  // row[q] holds column q - pad
          for (std::int64_t q = pad, to = std::min(width, w + pad); q < to; ++q)
            row[q] = maybe_round(src[q - pad], round);
        }
        const float* r0 = rows.data();
        DISTRIBUTE_WINOGRAD_SIMD
        for (std::int64_t q = 0; q < width; ++q) f(r0 + q, width, cols.data() + q, width);
        float* o = out + c * t.all + n * t.per_example + ty * t.cols;
        for (std::int64_t i = 0; i < 6; ++i) {
          const float* s = cols.data() + i * width;
          float* oi = o + i * 6 * stride;
          DISTRIBUTE_WINOGRAD_SIMD
          for (std::int64_t tx = 0; tx < t.cols; ++tx) f(s + 4 * tx, 1, oi + tx, stride);
        }
      }
    });
  }

  // y's plane (n, k), tile by tile: A^T m A from M[xi][k][t] (`plane` apart between elements xi), plus
  // the bias, clipped to the plane.
  static void transform_output(const conv_geometry& g, const tiling& t, const float* M, std::int64_t plane,
                               const float* bias, float* y, int team) {
    const std::int64_t K = g.out_channels, P = g.out_height, Q = g.out_width, width = 4 * t.cols;
    parallel_items(g.batch * K, team, [&](std::int64_t item) {
      const std::int64_t n = item / K, k = item % K;
      const float b = bias ? bias[k] : 0.0f;
      std::vector<float> half(static_cast<std::size_t>(6 * 4 * t.cols)), rows(static_cast<std::size_t>(4 * width));
      float* out = y + item * P * Q;
      for (std::int64_t ty = 0; ty < t.rows; ++ty) {
        const float* m = M + k * t.all + n * t.per_example + ty * t.cols;
        for (std::int64_t i = 0; i < 6; ++i) {  // each row of m times A: half[i][j][tx], j < 4
          const float* mi = m + i * 6 * plane;
          float* h = half.data() + i * 4 * t.cols;
          DISTRIBUTE_WINOGRAD_SIMD
          for (std::int64_t tx = 0; tx < t.cols; ++tx)
            at(mi[tx], mi[plane + tx], mi[2 * plane + tx], mi[3 * plane + tx], mi[4 * plane + tx], mi[5 * plane + tx],
               h + tx, t.cols);
        }
        for (std::int64_t j = 0; j < 4; ++j) {  // then A^T times each column: rows[r][4 tx + j]
          const float* h = half.data() + j * t.cols;
          const std::int64_t s = 4 * t.cols;  // half's stride between rows i
          float* o = rows.data() + j;
          DISTRIBUTE_WINOGRAD_SIMD
          for (std::int64_t tx = 0; tx < t.cols; ++tx) {
            float v[4];
            at(h[tx], h[s + tx], h[2 * s + tx], h[3 * s + tx], h[4 * s + tx], h[5 * s + tx], v, 1);
            for (int r = 0; r < 4; ++r) o[r * width + 4 * tx] = v[r] + b;
          }
        }
        for (std::int64_t r = 0; r < 4 && 4 * ty + r < P; ++r)
          std::copy(rows.data() + r * width, rows.data() + r * width + Q, out + (4 * ty + r) * Q);
      }
    });
  }

  // dw[i] += G^T S_i G for the n windows, S_i = S[xi][i]: a chunk at a time, as transform_windows.
  static void add_window_gradients(std::int64_t n, std::int64_t stride, const float* S, float* dw, int team) {
    parallel_items((n + chunk - 1) / chunk, team, [&](std::int64_t item) {
      const std::int64_t first = item * chunk, count = std::min(n - first, chunk);
      std::vector<float> buffer(static_cast<std::size_t>((18 + 9) * chunk));
      float* rows = buffer.data();   // [3][6][chunk]: G^T times S's columns
      float* r = rows + 18 * chunk;  // [3][3][chunk]
      for (int c = 0; c < 6; ++c) {
        const float* s0 = S + c * stride + first;  // S[q * 6 + c] for q = 0..5, 6 strides apart
        const std::int64_t s6 = 6 * stride;
        DISTRIBUTE_WINOGRAD_SIMD
        for (std::int64_t i = 0; i < count; ++i)
          gtt(s0[i], s0[s6 + i], s0[2 * s6 + i], s0[3 * s6 + i], s0[4 * s6 + i], s0[5 * s6 + i], rows + c * chunk + i,
              6 * chunk);
      }
      for (int a = 0; a < 3; ++a) {
        const float* q = rows + a * 6 * chunk;
        DISTRIBUTE_WINOGRAD_SIMD
        for (std::int64_t i = 0; i < count; ++i)
          gtt(q[i], q[chunk + i], q[2 * chunk + i], q[3 * chunk + i], q[4 * chunk + i], q[5 * chunk + i],
              r + a * 3 * chunk + i, chunk);
      }
      for (std::int64_t i = 0; i < count; ++i)
        for (int q = 0; q < 9; ++q) dw[(first + i) * 9 + q] += r[q * chunk + i];
    });
  }
};

}  // namespace distribute::detail
