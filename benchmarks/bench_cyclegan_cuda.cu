// bench_cyclegan --device cuda: the same timed trainer (bench_cyclegan.hpp) on GPU replicas, compiled
// by nvcc into bench_cyclegan beside its C++ translation unit (which keeps the CPU path and oneDNN).
#include "bench_cyclegan.hpp"
#include "graphs.cuh"

#include <distribute/cuda/device/cuda.cuh>
#include <distribute/cuda/device/memory.cuh>
#include <distribute/cuda/engine/cuda.cuh>
#include <distribute/cuda/strategy/mirrored_strategy.cuh>
#include <distribute/cuda/strategy/one_device_strategy.cuh>

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace bench_cyclegan {

namespace {

// The high-water mark of the library's memory on GPU 0, where the tensors and workspaces live, plus
// that of the memory CUDA graphs own (what their captured steps allocated; 0 without --graphs): a
// bound from above where both are used, since the two peaks need not coincide. cuBLAS' own
// workspace is allocated elsewhere and not counted.
device_report report_of(const std::string& name) {
  device_report r;
  r.name = name;
  r.reset_peak = [] {
    dist::cuda_reset_memory_peaks(0);
    cuuint64_t zero = 0;
    if (cudaDeviceSetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &zero) != cudaSuccess) (void)cudaGetLastError();
  };
  r.peak_mib = [] {
    cuuint64_t graphs = 0;
    if (cudaDeviceGetGraphMemAttribute(0, cudaGraphMemAttrUsedMemHigh, &graphs) != cudaSuccess) {
      (void)cudaGetLastError();
      graphs = 0;
    }
    return static_cast<double>(dist::cuda_memory_usage(0).peak_in_use + graphs) / (1024.0 * 1024.0);
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
  const dist::compute_options engine = engine_options_for(o);
  if (o.strategy == "one_device") {
    const dist::cuda_stream stream(0);  // the legacy default stream cannot be captured (--graphs on)
    dist::one_device_strategy<dist::cuda> s{dist::cuda{0}.on(stream.get())};
    s.set_compute_options(engine);
    return run(s, o, report_of(product_name(0)));
  }
  std::vector<dist::cuda> devices;
  for (int r = 0; r < o.replicas; ++r) devices.emplace_back(r % gpus);
  dist::mirrored_strategy<dist::cuda> s{devices};
  s.set_compute_options(engine);
  return run(s, o, report_of(product_name(0) + " x" + std::to_string(o.replicas) + " replicas"));
}

}  // namespace bench_cyclegan
