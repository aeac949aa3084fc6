// fmnist_classifier: trains the small Fashion-MNIST classifier that scores CycleGAN translations
// (cyclegan_train --classifier), mirrored over CPU replicas, and saves it as a checkpoint.
#include "classifier_training.hpp"
#include "export.hpp"

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>

int main(int argc, char** argv) {
  cyclegan::classifier_settings st;
  try {
    if (!cyclegan::parse_classifier_arguments(st, argc, argv)) {
      std::fputs(cyclegan::classifier_usage, stdout);
      return 0;
    }
    const auto& o = st.options;
    cyclegan::check_export_available(st.export_dir);
    namespace data = distribute::data;
    const auto train = cyclegan::all_examples(data::fashion_mnist(data::split::train, st.dir), o.train_limit);
    const auto test = cyclegan::all_examples(data::fashion_mnist(data::split::test, st.dir));
    distribute::mirrored_strategy<distribute::cpu> strategy{distribute::cpu_replicas(st.replicas)};
    std::printf(
        "training the classifier on %zu images, %d epoch(s), %d replica(s), global batch %d, lr %g "
        "(falling linearly to zero over the last %g%% of the steps)\n",
        train.size(), o.epochs, st.replicas, o.batch * st.replicas, o.lr, 100 * o.decay_fraction);
    std::fflush(stdout);  // before the progress lines on stderr
    const auto started = std::chrono::steady_clock::now();
    auto net = cyclegan::train_classifier(
        strategy, train, o, [&](const cyclegan::classifier_epoch& e, cyclegan::classifier& c) {
          std::printf("epoch %d/%d: %.1f s, loss %.4f, training accuracy %.2f%%", e.epoch, o.epochs, e.seconds, e.loss,
                      100 * e.accuracy);
          if (st.eval_each_epoch)
            std::printf(", test accuracy %.2f%%", 100 * cyclegan::score_classifier(c, test).overall);
          std::printf("\n");
          std::fflush(stdout);
        });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const auto acc = cyclegan::score_classifier(net, test);
    std::printf("trained in %.0f s; test accuracy %.2f%% (sneaker %.1f%%, ankle boot %.1f%%)\n", seconds,
                100 * acc.overall, 100 * acc.per_class[cyclegan::sneaker], 100 * acc.per_class[cyclegan::ankle_boot]);
    distribute::checkpoint::archive ar;
    ar.put_model("classifier", net);
    ar.put("test_accuracy", acc.overall);
    distribute::checkpoint::save(st.out, ar);
    std::printf("saved %s\n", st.out.string().c_str());
    if (!st.export_dir.empty())
      for (const auto& f :
           cyclegan::export_network(net, "classifier", distribute::shape::nchw(1, 1, 28, 28), st.export_dir))
        std::printf("exported %s\n", f.string().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fmnist_classifier: error: %s\n", e.what());
    return 1;
  }
}
