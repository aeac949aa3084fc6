#pragma once
// The CPU engine's dense matrix product: one Eigen product over row-major maps. Which kernel Eigen
// runs (its blocked GEMM, a matrix-vector product, or a coefficient-wise product for small sizes) and
// where it starts its vector loops depend on the sizes, the thread count and the operands' addresses
// modulo the vector width; the engine calls it with 64-byte aligned operands, so that the bits depend
// on the sizes and the thread count alone.

#include <distribute/engine/gemm_geometry.hpp>

// A program built on the fast path (DISTRIBUTE_PRECOMPILED, src/precompiled.cpp) sees only the
// declaration: the float and double instantiations, and the Eigen kernels under them, come from the
// precompiled unit, so its files do not parse Eigen at all.
#if defined(DISTRIBUTE_PRECOMPILED) && !defined(DISTRIBUTE_PRECOMPILED_UNIT)

namespace distribute::detail {

// c = op(a) op(b) for `g`, overwriting c (g.accumulate is the caller's business). float and double.
template <class T>
void eigen_gemm(const gemm_geometry& g, const T* a, const T* b, T* c);

extern template void eigen_gemm<float>(const gemm_geometry&, const float*, const float*, float*);
extern template void eigen_gemm<double>(const gemm_geometry&, const double*, const double*, double*);

}  // namespace distribute::detail

#else

#include <distribute/detail/eigen_core.hpp>

namespace distribute::detail {

// c = op(a) op(b) for `g`, overwriting c (g.accumulate is the caller's business).
template <class T>
void eigen_gemm(const gemm_geometry& g, const T* a, const T* b, T* c) {
  using matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using cmap = Eigen::Map<const matrix>;
  const cmap am(a, g.transpose_a ? g.k : g.m, g.transpose_a ? g.m : g.k);
  const cmap bm(b, g.transpose_b ? g.n : g.k, g.transpose_b ? g.k : g.n);
  Eigen::Map<matrix> cm(c, g.m, g.n);
  if (g.transpose_a && g.transpose_b) cm.noalias() = am.transpose() * bm.transpose();
  else if (g.transpose_a) cm.noalias() = am.transpose() * bm;
  else if (g.transpose_b) cm.noalias() = am * bm.transpose();
  else cm.noalias() = am * bm;
}

}  // namespace distribute::detail

#endif
