#!/usr/bin/env bash
# The demo: CycleGAN translating Fashion-MNIST sneakers <-> ankle boots, mirrored over 2 CPU
# replicas. Builds the example, trains the classifier that scores translations (5 epochs, about 93%
# test accuracy; once: it is kept in the output folder), trains the CycleGAN (2 epochs), scores it
# (the share of translated test images the classifier places in the target class, about 96% and
# 93%), and prints where the pictures are. Under 10 minutes on a 2-core machine in all, build
# included (6:35 from a fresh clone at load average 3). Running it again continues from the last
# checkpoint.
#
#   scripts/demo.sh                      the default run
#   scripts/demo.sh --epochs 6           longer (extra arguments go to cyclegan_train_cpu; see --help)
#   DEMO_OUT=elsewhere scripts/demo.sh   another output folder (default demo_out)
#   BUILD_DIR=build/mine scripts/demo.sh another build folder (default build/release)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

build=${BUILD_DIR:-build/release}
out=${DEMO_OUT:-demo_out}
jobs=$(nproc)

scripts/setup.sh
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
echo "demo.sh: building cyclegan_train_cpu and fmnist_classifier in $build"
# cyclegan_train without its CUDA side (the demo runs on CPU replicas, and nvcc is slow), and the
# classifier, in parallel.
cmake --build "$build" -j "$jobs" --target cyclegan_demo
bin=$build/examples/cyclegan

mkdir -p "$out"
# The scorer's file names its architecture: the file of the earlier, smaller classifier (kept in an
# output folder of an older demo) does not load into this one, so it is not reused.
classifier=$out/fmnist_classifier_bn3.dck
if [[ ! -f "$classifier" ]]; then
  echo "demo.sh: training the Fashion-MNIST classifier that scores the translations (about 2 minutes)"
  "$bin/fmnist_classifier" --epochs 5 --replicas 2 --out "$classifier"
fi

echo "demo.sh: training the CycleGAN, mirrored over 2 CPU replicas"
"$bin/cyclegan_train_cpu" --strategy mirrored --replicas 2 --placement full --epochs 2 \
  --out "$out/cyclegan" --checkpoint-dir "$out/cyclegan/checkpoints" --resume \
  --classifier "$classifier" "$@"

cat <<MSG

demo.sh: the pictures are in $out/cyclegan/
  samples_final.png     each row: real sneaker | as ankle boot | back to sneaker | real ankle boot | as sneaker | back to ankle boot
  samples_step*.png     the same test images during training
  losses.png            the loss curves (losses.csv holds every step)
  checkpoints/          the latest checkpoints: scripts/demo.sh --epochs 4 continues from them
MSG
