#pragma once
// GCC 12's AVX-512 intrinsics make their "undefined" vectors by initialising them from themselves
// (`__m512 __Y = __Y;`), which GCC 12 then reports as maybe used uninitialized wherever those
// intrinsics are inlined (GCC bug 105593, fixed in GCC 13 by pragmas inside that header): under
// -march=native on an AVX-512 machine, a clean build of a program using the CPU engine printed
// hundreds of warnings about a system header, through Eigen's GEMM kernels. Where that can happen
// (GCC 12 targeting AVX-512), the library includes <immintrin.h> first, under the same pragma, for
// that header's lines alone: its include guard keeps every later inclusion to those lines, so a
// program's own code keeps the warning. It works where the library is the first to include it.
// Elsewhere this includes nothing (the header is ~45,000 preprocessed lines).
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ == 12 && \
    defined(__AVX512F__)
#  pragma GCC diagnostic push
#  pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#  include <immintrin.h>
#  pragma GCC diagnostic pop
#endif
