// The GPU test binary. Without a CUDA device (or without an NVIDIA driver) it reports "skipped"
// (exit code 77) instead of running, unless DISTRIBUTE_REQUIRE_GPU=1; a driver that cannot be used
// is a failure.
//
// Suites here, one file each, compiled in this one translation unit: `device` (device_test.cuh: the
// cuda device, its tensor and pinned staging), `collectives` (collectives_test.cuh: every collective,
// op and element type over cuda_peer with 1-4 logical replicas on one GPU, and over NCCL with one
// rank, or every GPU where there are several) and `host` (host_test.cuh: what runs without a GPU,
// the replicas' host-side meeting and the errors of a machine without a device). The strategies'
// suites are in strategy_test.cu.
#define BOOST_TEST_MODULE distribute_gpu
#define BOOST_TEST_NO_MAIN
#ifndef BOOST_TEST_DYN_LINK
#  define BOOST_TEST_DYN_LINK
#endif
#include <boost/test/unit_test.hpp>

#include "gpu_test_support.cuh"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string_view>

namespace dist = distribute;

int main(int argc, char* argv[]) {
  // A driver that is there but unusable (one too old for this CUDA runtime) is a failure, never a
  // skip: a GPU run must not quietly test nothing.
  int gpus = 0;
  try {
    gpus = dist::cuda_device_count();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "distribute_gpu_tests: %s\n", e.what());
    return 1;
  }
  // The `host` suite (the replicas' host-side meeting, behaviour without a device) needs no GPU.
  bool host_only = false;
  for (int i = 1; i < argc; ++i) host_only = host_only || std::string_view(argv[i]) == "--run_test=host";
  if (gpus == 0 && !host_only) {
    // On the machine that is meant to test the GPU code, no GPU is a failure.
    if (const char* v = std::getenv("DISTRIBUTE_REQUIRE_GPU"); v != nullptr && std::string_view(v) == "1") {
      std::fprintf(stderr, "distribute_gpu_tests: no CUDA device is visible, and DISTRIBUTE_REQUIRE_GPU=1\n");
      return 1;
    }
    std::fprintf(stderr, "distribute_gpu_tests: no CUDA device is visible; skipped\n");
    return 77;
  }
  // Under mpiexec (the multi-worker test), each worker takes a GPU of its own.
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"}) {
    if (const char* v = std::getenv(var); v != nullptr && std::atoi(v) > gpus) {
      std::fprintf(stderr, "distribute_gpu_tests: %s workers on this node but %d GPU(s); skipped\n", v, gpus);
      return 77;
    }
  }
  return boost::unit_test::unit_test_main([] { return true; }, argc, argv);
}

// In the order they run.
#include "device_test.cuh"
#include "collectives_test.cuh"
#include "host_test.cuh"
