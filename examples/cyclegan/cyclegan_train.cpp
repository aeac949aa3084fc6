// cyclegan_train: CycleGAN on Fashion-MNIST sneakers <-> ankle boots (or any trainA/trainB folders),
// under one device or mirrored over CPU replicas, with the three selective-mirroring placements.
// `cyclegan_train --help` lists the flags; docs/cyclegan.md explains them.
#include "program.hpp"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

namespace {

const char* usage = R"(usage: cyclegan_train [flags]

strategy
  --strategy one_device|mirrored   where the step runs (default mirrored)
  --replicas N                     CPU replicas of the mirrored strategy (default 2)
  --placement full|discriminator_only|conditional   selective mirroring (default full)
  --mirror-threshold N             conditional: mirror when the global batch is >= N (default 16)
model
  --filters N --blocks N           generator filters (64 in the paper) and residual blocks (9) (default 16, 3)
  --d-filters N --d-layers N       discriminator filters (64) and stride-2 layers (3) (default 16, 2)
  --norm instance|batch|sync_batch the discriminator's normalisation (default instance)
training
  --batch N                        per-replica batch; the global batch is N x replicas (default 4)
  --epochs N | --steps N           length of the run (default 1 epoch); the lr decays over the last half
  --decay-fraction F               share of the run with linear lr decay (default 0.5)
  --lr X                           Adam learning rate (default 2e-4), betas (0.5, 0.999)
  --scale-lr --warmup-steps N      lr x replicas, reached by a linear warm-up
  --lambda-cycle X --lambda-identity X   loss weights (default 10, 0.5 x cycle)
  --pool-size N                    image pool (default 50)
  --seed N                         initialisation, data order and pool (default 1)
data
  --fmnist-dir DIR                 Fashion-MNIST IDX files (default /usr/share/datasets/fashion-mnist)
  --data-dir DIR                   DIR/trainA and DIR/trainB image folders instead (testA/testB optional)
  --channels N --image-size N      for --data-dir (default 1, 28)
  --train-limit N                  use at most N training images per domain
output
  --out DIR                        pictures, losses.csv and losses.png (default cyclegan_out)
  --sample-every N --samples N     a picture grid every N steps (default 200), N rows (default 6)
  --checkpoint-dir DIR --checkpoint-every N   checkpoints (default every 500 steps and at the end)
  --resume                         continue from the latest checkpoint in --checkpoint-dir
  --stop-at-step N                 stop early at step N (the schedule still spans the whole run)
  --classifier FILE                fmnist_classifier's checkpoint: score translations at the end
  --evaluate                       only score the latest checkpoint (needs --classifier)
  --eval-limit N                   score at most N test images per direction
  --verify-every N                 check every N steps that mirrored copies are identical
  --quiet                          no progress output
)";

}  // namespace

int main(int argc, char** argv) {
  cyclegan::settings st;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view flag = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(std::string(flag) + " needs a value");
        return argv[++i];
      };
      auto integer = [&]() -> long long {
        const std::string v = value();
        std::size_t used = 0;
        const long long x = std::stoll(v, &used);
        if (used != v.size() || x < 0) throw std::invalid_argument(std::string(flag) + " needs a non-negative integer, not '" + v + "'");
        return x;
      };
      auto real = [&]() -> double {
        const std::string v = value();
        std::size_t used = 0;
        const double x = std::stod(v, &used);
        if (used != v.size()) throw std::invalid_argument(std::string(flag) + " needs a number, not '" + v + "'");
        return x;
      };
      auto& t = st.train;
      if (flag == "--help" || flag == "-h") { std::fputs(usage, stdout); return 0; }
      else if (flag == "--strategy") st.strategy = value();
      else if (flag == "--replicas") st.replicas = static_cast<int>(integer());
      else if (flag == "--placement") t.place = cyclegan::parse_placement(value());
      else if (flag == "--mirror-threshold") t.mirror_threshold = static_cast<std::size_t>(integer());
      else if (flag == "--filters") t.gen.filters = integer();
      else if (flag == "--blocks") t.gen.blocks = static_cast<int>(integer());
      else if (flag == "--d-filters") t.disc.filters = integer();
      else if (flag == "--d-layers") t.disc.layers = static_cast<int>(integer());
      else if (flag == "--norm") t.disc.norm = cyclegan::parse_norm(value());
      else if (flag == "--batch") t.batch = static_cast<int>(integer());
      else if (flag == "--epochs") st.epochs = static_cast<int>(integer());
      else if (flag == "--steps") st.steps = integer();
      else if (flag == "--decay-fraction") t.decay_fraction = real();
      else if (flag == "--lr") t.lr = real();
      else if (flag == "--scale-lr") t.scale_lr = true;
      else if (flag == "--warmup-steps") t.warmup_steps = integer();
      else if (flag == "--lambda-cycle") t.lambda_cycle = real();
      else if (flag == "--lambda-identity") t.lambda_identity = real();
      else if (flag == "--pool-size") t.pool_size = static_cast<std::size_t>(integer());
      else if (flag == "--seed") t.seed = static_cast<std::uint64_t>(integer());
      else if (flag == "--fmnist-dir") st.fmnist_dir = value();
      else if (flag == "--data-dir") st.data_dir = value();
      else if (flag == "--channels") st.channels = static_cast<int>(integer());
      else if (flag == "--image-size") st.image_size = static_cast<int>(integer());
      else if (flag == "--train-limit") st.train_limit = static_cast<std::size_t>(integer());
      else if (flag == "--out") st.out_dir = value();
      else if (flag == "--sample-every") st.sample_every = integer();
      else if (flag == "--samples") st.samples = static_cast<int>(integer());
      else if (flag == "--checkpoint-dir") st.checkpoint_dir = value();
      else if (flag == "--checkpoint-every") st.checkpoint_every = integer();
      else if (flag == "--resume") st.resume = true;
      else if (flag == "--stop-at-step") st.stop_at_step = integer();
      else if (flag == "--classifier") st.classifier = value();
      else if (flag == "--evaluate") st.evaluate = true;
      else if (flag == "--eval-limit") st.eval_limit = static_cast<std::size_t>(integer());
      else if (flag == "--verify-every") st.verify_every = integer();
      else if (flag == "--quiet") st.quiet = true;
      else throw std::invalid_argument("unknown flag '" + std::string(flag) + "' (see --help)");
    }
    if (st.resume && st.checkpoint_dir.empty()) throw std::invalid_argument("--resume needs --checkpoint-dir");
    const auto sum = cyclegan::run(st);
    if (!st.evaluate && !st.quiet) std::printf("pictures and loss curves: %s\n", st.out_dir.string().c_str());
    return sum.finite ? 0 : 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cyclegan_train: error: %s\n", e.what());
    return 1;
  }
}
