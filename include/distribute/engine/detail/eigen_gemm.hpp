#pragma once
// The CPU engine's dense matrix product: Eigen products over row-major maps, each on one thread.
// Which kernel Eigen runs (its blocked GEMM, a matrix-vector product, or a coefficient-wise product
// for small sizes), how it blocks the sum over k, and where it starts its vector loops depend on the
// sizes, the thread count and the operands' addresses modulo the vector width. So a product is split
// into a fixed number of parts (gemm_parts: from the sizes and the engine's configured thread count),
// blocks of rows or columns of c, each an Eigen product on one thread; the parts run on the threads in
// use now (gemm_in_parts). The engine passes 64-byte aligned operands: the bits then depend on the
// sizes and the configured count alone, not on how many threads run the parts.

#include <distribute/engine/detail/openmp.hpp>
#include <distribute/engine/gemm_geometry.hpp>

#include <algorithm>
#include <cstdint>

// A program built on the fast path (DISTRIBUTE_PRECOMPILED, src/precompiled.cpp) sees only the
// declaration: the float and double instantiations, and the Eigen kernels under them, come from the
// precompiled unit, so its files do not parse Eigen at all.
#if defined(DISTRIBUTE_PRECOMPILED) && !defined(DISTRIBUTE_PRECOMPILED_UNIT)

namespace distribute::detail {

// c = op(a) op(b) for `g` (c += with g.accumulate) on the calling thread, rows of a, b and c lda,
// ldb and ldc values apart. float and double.
template <class T>
void eigen_gemm(const gemm_geometry& g, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T* c,
                std::int64_t ldc);

extern template void eigen_gemm<float>(const gemm_geometry&, const float*, std::int64_t, const float*, std::int64_t,
                                       float*, std::int64_t);
extern template void eigen_gemm<double>(const gemm_geometry&, const double*, std::int64_t, const double*, std::int64_t,
                                        double*, std::int64_t);

}  // namespace distribute::detail

#else

#  include <distribute/detail/eigen_core.hpp>

namespace distribute::detail {

// c = op(a) op(b) for `g` (c += with g.accumulate) on the calling thread, rows of a, b and c lda,
// ldb and ldc values apart. Eigen runs it on one thread where the calling thread's OpenMP count is
// one or it is inside a parallel region (gemm_in_parts sees to both).
template <class T>
void eigen_gemm(const gemm_geometry& g, const T* a, std::int64_t lda, const T* b, std::int64_t ldb, T* c,
                std::int64_t ldc) {
  using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using stride = Eigen::OuterStride<>;
  using cmap = Eigen::Map<const matrix, 0, stride>;
  const cmap am(a, g.transpose_a ? g.k : g.m, g.transpose_a ? g.m : g.k, stride(lda));
  const cmap bm(b, g.transpose_b ? g.n : g.k, g.transpose_b ? g.k : g.n, stride(ldb));
  Eigen::Map<matrix, 0, stride> cm(c, g.m, g.n, stride(ldc));
  const auto product = [&](const auto& op_a, const auto& op_b) {
    if (g.accumulate) cm.noalias() += op_a * op_b;
    else cm.noalias() = op_a * op_b;
  };
  if (g.transpose_a && g.transpose_b) product(am.transpose(), bm.transpose());
  else if (g.transpose_a) product(am.transpose(), bm);
  else if (g.transpose_b) product(am, bm.transpose());
  else product(am, bm);
}

}  // namespace distribute::detail

#endif

namespace distribute::detail {

// How many parts a product of `g` is computed in for an engine configured with `threads` threads:
// one per thread where the product has at least 2^17 multiply-adds a part and 8 rows (or columns)
// of c a part, fewer otherwise. It reads the sizes and the configured count only. (Built without
// OpenMP an engine runs one thread whatever its count: one part.)
inline int gemm_parts(const gemm_geometry& g, int threads) noexcept {
#if !defined(_OPENMP)
  threads = 1;
#endif
  const std::int64_t work = g.m * g.n * g.k, side = std::max(g.m, g.n);
  const std::int64_t parts = std::min<std::int64_t>({threads, work >> 17, side / 8});
  return static_cast<int>(std::max<std::int64_t>(parts, 1));
}

// c = op(a) op(b) for `g` (c += with g.accumulate), row-major and dense, as `parts` products (blocks
// of c's rows where it has at least as many rows as columns, of its columns otherwise), each on one
// thread, run on up to `threads` OpenMP threads. The bits depend on g and `parts`, not on `threads`.
template <class T>
void gemm_in_parts(const gemm_geometry& g, const T* a, const T* b, T* c, int parts, int threads) {
  const std::int64_t lda = g.transpose_a ? g.m : g.k, ldb = g.transpose_b ? g.k : g.n, ldc = g.n;
  const bool by_rows = g.m >= g.n;
  const std::int64_t side = by_rows ? g.m : g.n;
  parts = static_cast<int>(std::clamp<std::int64_t>(parts, 1, std::max<std::int64_t>(side, 1)));
  const auto part = [&](int p) {
    const std::int64_t from = side * p / parts, to = side * (p + 1) / parts;
    gemm_geometry piece = g;
    if (by_rows) {
      piece.m = to - from;
      eigen_gemm(piece, g.transpose_a ? a + from : a + from * lda, lda, b, ldb, c + from * ldc, ldc);
    } else {
      piece.n = to - from;
      eigen_gemm(piece, a, lda, g.transpose_b ? b + from * ldb : b + from, ldb, c + from, ldc);
    }
  };
#if defined(_OPENMP)
  const int team = std::min(threads, parts);
  if (team > 1) {
    // Inside the region Eigen runs each part on its own thread.
    parallel_items(parts, team, [&](std::int64_t p) { part(static_cast<int>(p)); });
    return;
  }
#else
  (void)threads;
#endif
  // On this thread alone: Eigen takes its thread count from OpenMP's.
  const one_openmp_thread alone;
  for (int p = 0; p < parts; ++p) part(p);
}

}  // namespace distribute::detail
