#pragma once
// <immintrin.h>, as every header of the library that needs x86 intrinsics (directly, or through
// Eigen's vector kernels) includes it. GCC 12's AVX-512 intrinsics make their "undefined" vectors by
// initialising them from themselves (`__m512 __Y = __Y;`), which GCC 12 then reports as maybe used
// uninitialized wherever those intrinsics are inlined (GCC bug 105593, fixed in GCC 13 by pragmas
// inside that header): under -march=native on an AVX-512 machine, a clean build of a program using
// the CPU engine printed hundreds of warnings about a system header, through Eigen's GEMM kernels.
// The same pragma is applied here to that header's lines alone: it is included between push and
// pop, and its include guard keeps every later inclusion to those lines, so a program's own code
// keeps the warning. It works where the library is the first to include <immintrin.h>.
#if defined(__x86_64__) || defined(__i386__)
#  if defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12
#    pragma GCC diagnostic push
#    pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#    include <immintrin.h>
#    pragma GCC diagnostic pop
#  elif defined(__GNUC__) || defined(__clang__)
#    include <immintrin.h>
#  endif
#endif
