#pragma once
// Helpers shared by the GPU tests: the strategies the typed tests run under, half-precision test
// values, and moving replica data between host vectors and device tensors. The element values, the
// serial reference and the bit comparison are the core tests' (tests/core/test_support.hpp).

#include "../core/test_support.hpp"

#include <distribute/config.hpp>
#include <distribute/cuda/comm/cuda_peer.cuh>
#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/strategy/mirrored_strategy.cuh>
#include <distribute/cuda/strategy/one_device_strategy.cuh>
#include <distribute/cuda/tensor/tensor.cuh>
#if DISTRIBUTE_HAS_NCCL
#  include <distribute/cuda/comm/nccl.cuh>
#endif
#if DISTRIBUTE_HAS_NCCL && DISTRIBUTE_HAS_MPI
#  include <distribute/cuda/strategy/multi_worker_mirrored_strategy.cuh>
#endif

#include <boost/mpl/list.hpp>
#include <boost/test/unit_test.hpp>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace distribute::test {

// Strategy makers for the typed tests: each names a strategy and its replica count.
struct one_gpu {
  static constexpr int replicas = 1;
  static constexpr const char* name = "one_device_strategy<cuda>";
  static one_device_strategy<cuda> make(collective_options = {}) { return one_device_strategy<cuda>{cuda{0}}; }
};
// One GPU on a stream of its own: CUDA graphs cannot be captured on the legacy default stream.
struct one_gpu_own_stream {
  static constexpr int replicas = 1;
  static constexpr const char* name = "one_device_strategy<cuda> on a stream of its own";
  static one_device_strategy<cuda> make(collective_options = {}) {
    static cuda_stream* const stream = new cuda_stream(0);  // kept for the process: strategies made here use it
    return one_device_strategy<cuda>{cuda{0}.on(stream->get())};
  }
};
// N logical replicas on cuda:0, reduced by the cuda_peer kernels.
template <int N>
struct peer_n {
  static constexpr int replicas = N;
  static constexpr const char* name = "mirrored_strategy<cuda> on cuda_peer";
  static mirrored_strategy<cuda> make(collective_options o = {}) {
    mirrored_strategy<cuda> s{cuda_replicas(N), o};
    BOOST_REQUIRE(s.collective_engine() == cuda_collective_engine::cuda_peer);
    return s;
  }
};
// cuda:0 alone, through NCCL (a group of one rank).
struct nccl_1 {
  static constexpr int replicas = 1;
  static constexpr const char* name = "mirrored_strategy<cuda> on NCCL";
  static mirrored_strategy<cuda> make(collective_options o = {}) {
    return mirrored_strategy<cuda>{{cuda{0}}, o, cuda_collective_engine::nccl};
  }
};

#if DISTRIBUTE_HAS_NCCL
using gpu_strategies = boost::mpl::list<one_gpu, peer_n<1>, peer_n<2>, peer_n<3>, peer_n<4>, nccl_1>;
using mirrored_gpu_strategies = boost::mpl::list<peer_n<1>, peer_n<2>, peer_n<3>, peer_n<4>, nccl_1>;
#else
using gpu_strategies = boost::mpl::list<one_gpu, peer_n<1>, peer_n<2>, peer_n<3>, peer_n<4>>;
using mirrored_gpu_strategies = boost::mpl::list<peer_n<1>, peer_n<2>, peer_n<3>, peer_n<4>>;
#endif

// A test that needs several GPUs is skipped (reported so) on a machine with fewer.
inline boost::test_tools::assertion_result at_least_two_gpus(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result r(cuda_device_count() >= 2);
  r.message() << "needs two or more CUDA devices";
  return r;
}

// Half-precision values chosen so that sums and products of up to four replicas stay exact in
// float16 and bfloat16 alike (small integers; products of powers of two), so that every engine must
// produce exactly the serial reference.
template <class T>
std::vector<T> half_values_for(int rank, std::size_t n, reduce_op op, std::uint32_t seed = 11) {
  std::mt19937 gen(seed * 31u + static_cast<std::uint32_t>(rank) * 7919u + static_cast<std::uint32_t>(n));
  std::vector<T> v(n);
  for (auto& x : v) {
    float f = 0;
    if (op == reduce_op::prod) {
      const float choices[] = {-2.0f, -1.0f, 0.5f, 1.0f, 2.0f};
      f = choices[std::uniform_int_distribution<int>(0, 4)(gen)];
    } else {
      f = static_cast<float>(std::uniform_int_distribution<int>(-16, 16)(gen));
    }
    x = static_cast<T>(f);
  }
  return v;
}

template <class T>
std::vector<float> as_floats(const std::vector<T>& v) {
  std::vector<float> out;
  out.reserve(v.size());
  for (const auto& x : v) out.push_back(static_cast<float>(x));
  return out;
}

inline bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Kernels that keep a stream busy, for tests of what waits for the device and what does not. In an
// unnamed namespace: each test unit that uses them has its own.
namespace {

// Keeps the GPU busy on its stream for about `ns` nanoseconds (the global timer, whatever the clocks).
__global__ void spin_kernel(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

__global__ void spin_then_fill(float* p, std::size_t n, float value, unsigned long long ns) {
  if (threadIdx.x == 0) {
    unsigned long long start = 0, now = 0;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
  }
  __syncthreads();
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x)
    p[i] = value;
}

__global__ void noop_kernel() {}

void spin(cudaStream_t stream, std::chrono::milliseconds ms) {
  spin_kernel<<<1, 1, 0, stream>>>(static_cast<unsigned long long>(ms.count()) * 1000000ull);
  detail::cuda_check(cudaGetLastError(), "launching spin_kernel");
}

}  // namespace

}  // namespace distribute::test
