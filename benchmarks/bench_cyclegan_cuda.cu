// bench_cyclegan --device cuda: the same timed trainer (bench_cyclegan.hpp) on GPU replicas, compiled
// by nvcc into bench_cyclegan beside its C++ translation unit (which keeps the CPU path and oneDNN).
#include "bench_cyclegan.hpp"
#include "graphs.cuh"

#include <distribute/device/cuda.cuh>
#include <distribute/engine/cuda.cuh>
#include <distribute/strategy/mirrored_strategy_cuda.cuh>
#include <distribute/strategy/one_device_strategy_cuda.cuh>

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace bench_cyclegan {

namespace {

// The high-water mark of the stream-ordered pool of GPU 0, where the tensors live (cuBLAS' and
// cuDNN's own workspaces are allocated elsewhere and not counted).
device_report report_of(const std::string& name) {
  device_report r;
  r.name = name;
  r.reset_peak = [] {
    cudaMemPool_t pool{};
    if (cudaDeviceGetDefaultMemPool(&pool, 0) != cudaSuccess) return;
    cuuint64_t zero = 0;
    (void)cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero);
  };
  r.peak_mib = [] {
    cudaMemPool_t pool{};
    cuuint64_t high = 0;
    if (cudaDeviceGetDefaultMemPool(&pool, 0) != cudaSuccess ||
        cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &high) != cudaSuccess)
      return -1.0;
    return static_cast<double>(high) / (1024.0 * 1024.0);
  };
  return r;
}

}  // namespace

// The GPU's product name, as the peer reports it.
std::string product_name(int ordinal) {
  cudaDeviceProp p{};
  return cudaGetDeviceProperties(&p, ordinal) == cudaSuccess ? std::string(p.name) : "cuda:" + std::to_string(ordinal);
}

int run_on_cuda(const options& o) {
  const int gpus = dist::cuda_device_count();
  if (gpus == 0) throw std::runtime_error("--device cuda: no CUDA device is visible");
  const dist::engine_options engine = engine_options_for(o);
  if (o.strategy == "one_device") {
    dist::one_device_strategy<dist::cuda> s{dist::cuda{0}};
    s.set_engine_options(engine);
    return run(s, o, report_of(product_name(0)));
  }
  std::vector<dist::cuda> devices;
  for (int r = 0; r < o.replicas; ++r) devices.emplace_back(r % gpus);
  dist::mirrored_strategy<dist::cuda> s{devices};
  s.set_engine_options(engine);
  return run(s, o, report_of(product_name(0) + " x" + std::to_string(o.replicas) + " replicas"));
}

}  // namespace bench_cyclegan
