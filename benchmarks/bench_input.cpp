// The Fashion-MNIST input pipeline in examples per second, side by side in one run with
//   - the raw read: gunzip + parse of the IDX files (read_idx), the cost of getting the bytes at all;
//   - a copy pass: one pass over the loaded examples with no transform (a copy of each example);
//   - the bound: the same work written by hand for this one case: a shuffled index, then per step
//     and replica one float buffer filled straight from the loaded pixels (no per-example objects,
//     no threads);
//   - ours: shuffle (buffer 10,000) -> batch (global batch) -> map(to_float) -> strategy.distribute
//     (split over the replicas, prefetch 2 steps) with 1 and 2 prefetch threads, the consumer
//     touching every replica's batch.
// Each figure is the median of 5 repetitions (whole epochs). See docs/benchmarks.md.
//
//   bench_input [--dir DIR] [--replicas N] [--batch B] [--quick]

#include <distribute/distribute.hpp>
#include <distribute/data/distribute.hpp>
#include <distribute/data/fashion_mnist.hpp>

#include "bench_common.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace dist = distribute;
namespace data = distribute::data;

namespace {

using clock_type = std::chrono::steady_clock;

template <class F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = clock_type::now();
    f();
    t.push_back(std::chrono::duration<double>(clock_type::now() - t0).count());
  }
  return bench::median(t);
}

}  // namespace

int main(int argc, char** argv) {
  std::filesystem::path dir{data::fashion_mnist_default_dir};
  int replicas = 2;
  std::size_t global_batch = 64;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--dir" && i + 1 < argc) {
      dir = argv[++i];
    } else if (arg == "--replicas" && i + 1 < argc) {
      replicas = std::atoi(argv[++i]);
    } else if (arg == "--batch" && i + 1 < argc) {
      global_batch = static_cast<std::size_t>(std::atoll(argv[++i]));
    } else if (arg == "--quick") {
      reps = 3;
    } else {
      std::fprintf(stderr, "usage: bench_input [--dir DIR] [--replicas N] [--batch B] [--quick]\n");
      return 2;
    }
  }
  std::error_code ec;
  if (!std::filesystem::exists(dir / "train-images-idx3-ubyte.gz", ec) &&
      !std::filesystem::exists(dir / "train-images-idx3-ubyte", ec)) {
    std::printf("bench_input: skipped: Fashion-MNIST is not in %s (apt-get install dataset-fashion-mnist)\n",
                dir.string().c_str());
    return 0;
  }

  const std::string load = bench::load_average();
  std::printf("# bench_input  %s\n", bench::utc_now().c_str());
  std::printf("# machine: %u usable hardware threads, %s; load average before the run: %s\n",
              std::thread::hardware_concurrency(), bench::cpu_model().c_str(), load.c_str());
  std::printf("# compiler: %s; examples/s, median of %d epochs; %d replicas, global batch %zu\n", bench::compiler(),
              reps, replicas, global_batch);

  // Raw read: both train files, decompressed and parsed.
  const auto images_file = data::detail::idx_file(dir, "train-images-idx3-ubyte");
  const auto labels_file = data::detail::idx_file(dir, "train-labels-idx1-ubyte");
  std::size_t sink = 0;
  const double raw_s = median_seconds(reps, [&] {
    const auto images = data::read_idx(images_file, data::idx_images_magic);
    const auto labels = data::read_idx(labels_file, data::idx_labels_magic);
    sink += images.values[12345] + labels.values[7];
  });

  const auto train = data::fashion_mnist(data::split::train, dir);
  const double examples = static_cast<double>(train.size());

  // Bound: one pass over the loaded examples, nothing else.
  const double bound_s = median_seconds(reps, [&] {
    for (auto& e : train.epoch(0)) sink += e.image.values[400];
  });

  // Bound: the pipeline's work by hand (a full shuffle of indices, uint8 -> float into per-replica
  // buffers, the same split rule).
  const auto pixels = train.pixels();
  const auto all_labels = train.labels();
  const std::size_t row = train.rows() * train.cols();
  std::uint64_t hand_epoch = 0;
  const double hand_s = median_seconds(reps, [&] {
    std::vector<std::size_t> order(train.size());
    for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
    data::detail::rng r{data::detail::mix(1, hand_epoch++)};
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[r.below(i)]);
    float acc = 0;
    for (std::size_t start = 0; start < order.size(); start += global_batch) {
      const std::size_t n = std::min(global_batch, order.size() - start);
      std::size_t offset = start;
      for (int k = 0; k < replicas; ++k) {
        const std::size_t m = n / static_cast<std::size_t>(replicas) +
                              (static_cast<std::size_t>(k) < n % static_cast<std::size_t>(replicas) ? 1 : 0);
        std::vector<float> images(m * row);
        std::vector<std::int32_t> labels(m);
        for (std::size_t j = 0; j < m; ++j) {
          const std::uint8_t* src = pixels.data() + order[offset + j] * row;
          for (std::size_t p = 0; p < row; ++p)
            images[j * row + p] = static_cast<float>(src[p]) * (2.0f / 255.0f) - 1.0f;
          labels[j] = all_labels[order[offset + j]];
        }
        offset += m;
        if (m) acc += images[images.size() / 2] + static_cast<float>(labels[0]);
      }
    }
    sink += static_cast<std::size_t>(acc) & 1;
  });

  dist::mirrored_strategy<> strategy{dist::cpu_replicas(replicas)};
  const auto pipeline = train.shuffle(10000, 1).batch(global_batch).map(data::to_float{});
  std::vector<double> ours_s;
  for (std::size_t threads : {1u, 2u}) {
    std::uint64_t epoch = 0;
    ours_s.push_back(median_seconds(reps, [&] {
      auto inputs = strategy.distribute(pipeline, {.prefetch = 2, .prefetch_threads = threads});
      float acc = 0;
      for (auto& per : inputs.epoch(epoch++))
        for (auto& part : per)
          if (!part.empty()) acc += part.images.values[part.images.values.size() / 2];
      sink += static_cast<std::size_t>(acc) & 1;
    }));
  }

  const double raw = examples / raw_s, copy = examples / bound_s, bound = examples / hand_s, one = examples / ours_s[0],
               two = examples / ours_s[1];
  std::printf("\n%-34s %14s\n", "stage", "examples/s");
  std::printf("%-34s %14.0f\n", "raw IDX read (gunzip + parse)", raw);
  std::printf("%-34s %14.0f\n", "copy pass over loaded examples", copy);
  std::printf("%-34s %14.0f\n", "bound: the same work by hand", bound);
  std::printf("%-34s %14.0f   (%.2fx bound)\n", "pipeline, 1 prefetch thread", one, one / bound);
  std::printf("%-34s %14.0f   (%.2fx bound, %.2fx 1 thread)\n", "pipeline, 2 prefetch threads", two, two / bound,
              two / one);
  std::printf(
      "\n{\"bench\":\"input\",\"replicas\":%d,\"global_batch\":%zu,\"raw_idx_read\":%.0f,\"copy_pass\":%.0f,\"bound\":%"
      ".0f,"
      "\"pipeline_1_thread\":%.0f,\"pipeline_2_threads\":%.0f,\"load_average\":\"%s\"}\n",
      replicas, global_batch, raw, copy, bound, one, two, load.c_str());
  return sink == 42 ? 1 : 0;  // keeps the work observable
}
