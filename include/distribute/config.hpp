#pragma once
// Feature probes and portability macros. Every backend is probed at compile time: a backend that is
// not available is simply absent (its types do not exist), never a run-time abort.

#if __has_include(<mpi.h>)
#  define DISTRIBUTE_HAS_MPI 1
#else
#  define DISTRIBUTE_HAS_MPI 0
#endif

#if defined(__CUDACC__) && __has_include(<cuda_runtime.h>)
#  define DISTRIBUTE_HAS_CUDA 1
#else
#  define DISTRIBUTE_HAS_CUDA 0
#endif

#if DISTRIBUTE_HAS_CUDA && __has_include(<nccl.h>)
#  define DISTRIBUTE_HAS_NCCL 1
#else
#  define DISTRIBUTE_HAS_NCCL 0
#endif

// cuDNN through the cudnn-frontend headers (the GPU engine's convolutions): set by the build, not
// probed, because a program that sees the headers must also link cuDNN and nvrtc. CMake's
// distribute::cuda defines DISTRIBUTE_HAS_CUDNN=1 where it found all three; otherwise, and never
// without nvcc, it is 0.
#if !defined(DISTRIBUTE_HAS_CUDNN) || !DISTRIBUTE_HAS_CUDA
#  undef DISTRIBUTE_HAS_CUDNN
#  define DISTRIBUTE_HAS_CUDNN 0
#endif

// Shared math (reductions, statistics merges) is written once in plain headers and compiled both by
// g++ for the host and by nvcc for the device.
#if defined(__CUDACC__)
#  define DISTRIBUTE_HOST_DEVICE __host__ __device__
#else
#  define DISTRIBUTE_HOST_DEVICE
#endif

#define DISTRIBUTE_VERSION_MAJOR 0
#define DISTRIBUTE_VERSION_MINOR 2
#define DISTRIBUTE_VERSION_PATCH 0
