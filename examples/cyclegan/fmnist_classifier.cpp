// fmnist_classifier: trains the small Fashion-MNIST classifier that scores CycleGAN translations
// (cyclegan_train --classifier), mirrored over CPU replicas, and saves it as a checkpoint.
#include "classifier_training.hpp"

#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  cyclegan::classifier_options o;
  fs::path out = "fmnist_classifier.dck";
  fs::path dir = std::string(distribute::data::fashion_mnist_default_dir);
  int replicas = 2;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view flag = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(std::string(flag) + " needs a value");
        return argv[++i];
      };
      if (flag == "--help" || flag == "-h") {
        std::puts("usage: fmnist_classifier [--out FILE] [--epochs N] [--batch N] [--replicas N] [--lr X] [--seed N]\n"
                  "                         [--train-limit N] [--fmnist-dir DIR] [--quiet]");
        return 0;
      }
      if (flag == "--out") out = value();
      else if (flag == "--epochs") o.epochs = std::stoi(value());
      else if (flag == "--batch") o.batch = std::stoi(value());
      else if (flag == "--replicas") replicas = std::stoi(value());
      else if (flag == "--lr") o.lr = std::stod(value());
      else if (flag == "--seed") o.seed = std::stoull(value());
      else if (flag == "--train-limit") o.train_limit = std::stoull(value());
      else if (flag == "--fmnist-dir") dir = value();
      else if (flag == "--quiet") o.quiet = true;
      else throw std::invalid_argument("unknown flag '" + std::string(flag) + "' (see --help)");
    }
    namespace data = distribute::data;
    const auto train = cyclegan::all_examples(data::fashion_mnist(data::split::train, dir), o.train_limit);
    const auto test = cyclegan::all_examples(data::fashion_mnist(data::split::test, dir));
    distribute::mirrored_strategy<distribute::cpu> strategy{distribute::cpu_replicas(replicas)};
    std::printf("training the classifier on %zu images, %d epoch(s), %d replica(s), global batch %d\n", train.size(), o.epochs,
                replicas, o.batch * replicas);
    auto net = cyclegan::train_classifier(strategy, train, o);
    const auto acc = cyclegan::score_classifier(net, test);
    std::printf("test accuracy %.2f%% (sneaker %.1f%%, ankle boot %.1f%%)\n", 100 * acc.overall,
                100 * acc.per_class[cyclegan::sneaker], 100 * acc.per_class[cyclegan::ankle_boot]);
    distribute::checkpoint::archive ar;
    ar.put_model("classifier", net);
    ar.put("test_accuracy", acc.overall);
    distribute::checkpoint::save(out, ar);
    std::printf("saved %s\n", out.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fmnist_classifier: error: %s\n", e.what());
    return 1;
  }
}
