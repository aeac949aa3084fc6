// Separate models on separate devices: two independent models trained at the same time, each pinned
// by its own one_device_strategy to a device of its own (here cpu:0 and cpu:1, threads of this
// process; with GPUs, one_device_strategy<cuda>{cuda{0}} and {cuda{1}}). Nothing is shared and nothing
// is communicated: this is the tf.distribute answer to "train model A on device 0 while model B
// trains on device 1", as opposed to one model mirrored over both.
//
// The two models here are a small learning-rate sweep of the Fashion-MNIST classifier of the
// CycleGAN example: the same network, two learning rates, trained concurrently.
#include "../cyclegan/classifier_training.hpp"

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <thread>

namespace dist = distribute;

int main(int argc, char** argv) {
  cyclegan::classifier_options base;
  base.epochs = 1;
  base.batch = 32;
  base.quiet = true;
  std::size_t train_limit = 12000;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view flag = argv[i];
      if (flag == "--train-limit" && i + 1 < argc) train_limit = std::stoull(argv[++i]);
      else if (flag == "--epochs" && i + 1 < argc) base.epochs = std::stoi(argv[++i]);
      else {
        std::puts("usage: separate_models [--train-limit N] [--epochs N]");
        return flag == "--help" ? 0 : 1;
      }
    }
    namespace data = dist::data;
    const auto train = cyclegan::all_examples(data::fashion_mnist(data::split::train), train_limit);
    const auto test = cyclegan::all_examples(data::fashion_mnist(data::split::test), 2000);

    struct job {
      double lr;
      dist::cpu device;
      double accuracy = 0, seconds = 0;
      std::exception_ptr error;
    };
    job jobs[] = {{.lr = 1e-3, .device = dist::cpu{0}, .error = {}}, {.lr = 3e-4, .device = dist::cpu{1}, .error = {}}};
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (auto& j : jobs)
      threads.emplace_back([&train, &test, &base, &j] {
        try {
          const auto t0 = std::chrono::steady_clock::now();
          dist::one_device_strategy<dist::cpu> strategy{j.device};  // this model's device, and only this one
          auto o = base;
          o.lr = j.lr;
          auto net = cyclegan::train_classifier(strategy, train, o);
          j.accuracy = cyclegan::score_classifier(net, test).overall;
          j.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        } catch (...) {
          j.error = std::current_exception();
        }
      });
    for (auto& t : threads) t.join();
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (auto& j : jobs) {
      if (j.error) std::rethrow_exception(j.error);
      std::printf("model on %s: lr %.0e, %zu images x %d epoch(s), test accuracy %.1f%%, %.1f s\n",
                  j.device.name().c_str(), j.lr, train.size(), base.epochs, 100 * j.accuracy, j.seconds);
    }
    std::printf("both models trained concurrently in %.1f s of wall time\n", wall);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "separate_models: error: %s\n", e.what());
    return 1;
  }
}
