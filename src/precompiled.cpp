// The precompiled unit: the library's common heavy instantiations, compiled once.
//
// A program compiled with DISTRIBUTE_PRECOMPILED defined sees explicit instantiation declarations
// (`extern template`) of what is instantiated below, so it does not compile them again: the CPU
// engine's Eigen matrix products and its im2col convolutions, in float and double, with the Eigen
// kernels under them. Link this file's object into the program (CMake: the target
// distribute::precompiled; by hand: compile it once with the program's own flags). docs/compile_time.md
// has the recipes and the measurements.
#ifndef DISTRIBUTE_PRECOMPILED
#  define DISTRIBUTE_PRECOMPILED 1
#endif
// This file holds the definitions the fast path's programs only see declared.
#define DISTRIBUTE_PRECOMPILED_UNIT 1

#include <distribute/engine/cpu.hpp>

namespace distribute::detail {

template void eigen_gemm<float>(const gemm_geometry&, const float*, std::int64_t, const float*, std::int64_t, float*, std::int64_t);
template void eigen_gemm<double>(const gemm_geometry&, const double*, std::int64_t, const double*, std::int64_t, double*,
                                 std::int64_t);
template class reference_conv<float>;
template class reference_conv<double>;

}  // namespace distribute::detail
