// The peer figure of bench_allreduce: MPI_Allreduce (MPI_SUM, MPI_FLOAT, in place) across the
// processes of one mpiexec launch, timed the same way bench_allreduce times its own all-reduce.
//
//   mpiexec -np N bench_allreduce_mpi --sizes 4096,65536 --min-seconds 0.05 --repetitions 5
//
// Rank 0 prints one JSON line per size, {"bytes":B,"seconds_per_iter":S}, which bench_allreduce
// parses. It is not meant to be run by hand, but it can be.

// Only the C API is used: skip the deprecated C++ bindings (and their warnings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace {

struct options {
  std::vector<std::size_t> sizes;  // bytes per process
  double min_seconds = 0.05;       // each timed repetition runs at least this long
  int repetitions = 5;             // timed repetitions; the median is reported
};

std::vector<std::size_t> parse_sizes(std::string_view list) {
  std::vector<std::size_t> sizes;
  while (!list.empty()) {
    const auto comma = list.find(',');
    const std::string item(list.substr(0, comma));
    std::size_t used = 0;
    const auto bytes = std::stoull(item, &used);
    if (used != item.size() || bytes == 0 || bytes % sizeof(float) != 0)
      throw std::invalid_argument("size '" + item + "' is not a positive multiple of 4 bytes");
    if (bytes / sizeof(float) > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      throw std::invalid_argument("size '" + item + "' has more elements than an MPI count can hold");
    sizes.push_back(bytes);
    list = comma == std::string_view::npos ? std::string_view{} : list.substr(comma + 1);
  }
  return sizes;
}

options parse_options(int argc, char** argv) {
  options opts;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + std::string(arg));
    const char* value = argv[++i];
    if (arg == "--sizes") opts.sizes = parse_sizes(value);
    else if (arg == "--min-seconds") opts.min_seconds = std::stod(value);
    else if (arg == "--repetitions") opts.repetitions = std::stoi(value);
    else throw std::invalid_argument("unknown argument " + std::string(arg));
  }
  if (opts.sizes.empty()) throw std::invalid_argument("--sizes is required");
  if (opts.repetitions < 1 || opts.min_seconds <= 0) throw std::invalid_argument("bad timing policy");
  return opts;
}

// Seconds per MPI_Allreduce on rank 0, between barriers, so the time covers every process.
double time_allreduce(std::vector<float>& buf, int rank, const options& opts) {
  const int count = static_cast<int>(buf.size());
  auto allreduce = [&] { MPI_Allreduce(MPI_IN_PLACE, buf.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
  auto timed = [&](std::int64_t iters) {
    MPI_Barrier(MPI_COMM_WORLD);
    const auto start = std::chrono::steady_clock::now();
    for (std::int64_t i = 0; i < iters; ++i) allreduce();
    MPI_Barrier(MPI_COMM_WORLD);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };

  allreduce();  // warm-up: connections, registration, first-touch of MPI's own buffers
  // Rank 0 decides the iteration count; the calibration runs double as further warm-up.
  std::int64_t iters = 1;
  for (;;) {
    const double seconds = timed(iters);
    std::int64_t next = rank == 0 ? bench::next_iterations(iters, seconds, opts.min_seconds) : 0;
    MPI_Bcast(&next, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    if (next == iters) break;
    iters = next;
  }
  std::vector<double> per_iter;
  for (int k = 0; k < opts.repetitions; ++k) per_iter.push_back(timed(iters) / static_cast<double>(iters));
  return bench::median(per_iter);
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);

  options opts;
  try {
    opts = parse_options(argc, argv);
  } catch (const std::exception& e) {
    if (rank == 0) std::fprintf(stderr, "bench_allreduce_mpi: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }

  for (const std::size_t bytes : opts.sizes) {
    // Filling pre-faults the pages; zeros keep the repeated in-place sums finite.
    std::vector<float> buf(bytes / sizeof(float), 0.0f);
    const double seconds = time_allreduce(buf, rank, opts);
    if (rank == 0) {
      std::printf("{\"bytes\":%zu,\"seconds_per_iter\":%.9g}\n", bytes, seconds);
      std::fflush(stdout);
    }
  }

  MPI_Finalize();
  return 0;
}
