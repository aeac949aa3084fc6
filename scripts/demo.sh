#!/usr/bin/env bash
# The demo: CycleGAN translating Fashion-MNIST sneakers <-> ankle boots, mirrored over 2 CPU
# replicas. Builds the example, trains the classifier that scores translations (4 epochs, about 92.5%
# test accuracy; once: it is kept in the output folder) while the trainer compiles, trains the
# CycleGAN (2 epochs), scores it (the share of translated test images the classifier places in the
# target class, about 97% and 94%), and prints where the pictures are. About 6 minutes on a 2-core
# machine in all, build included (5:48 from a fresh clone on a Xeon at load average 1). Running it
# again continues from the last
# checkpoint. It installs only what the demo needs (`scripts/setup.sh demo`: the compiler, the
# example's libraries and Fashion-MNIST), not the test suite's 2 GB, and ends with its own wall time,
# split into its steps.
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

# Minutes and seconds, as 4:05.
mmss() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }
start=$SECONDS

scripts/setup.sh demo
setup_s=$((SECONDS - start))

step=$SECONDS
# Configuring the tests requires Boost.Test, which `setup.sh demo` does not install: where it is
# missing, the build folder is configured without them (scripts/test.sh installs it and configures
# them again). Where it is installed, the folder keeps them as the release preset and
# scripts/test.sh configure it: the demo does not take the tests out of a folder they share.
configure=(-DCMAKE_BUILD_TYPE=Release)
if [[ $(dpkg-query -W -f='${Status}' libboost-test-dev 2>/dev/null || true) != "install ok installed" ]]; then
  configure+=(-DDISTRIBUTE_BUILD_TESTS=OFF)
  echo "demo.sh: configuring $build without the tests (Boost.Test is not installed; scripts/test.sh installs what they need)"
fi
cmake -S . -B "$build" "${configure[@]}" >/dev/null
echo "demo.sh: building cyclegan_train_cpu and fmnist_classifier in $build"
# cyclegan_train without its CUDA side (the demo runs on CPU replicas, and nvcc is slow), and the
# classifier, side by side. The trainer takes about three times as long to compile: it builds in the
# background, and the classifier, built first, trains meanwhile on the core its build leaves free.
trainer_log=$(mktemp)
trap 'rm -f "$trainer_log"' EXIT
cmake --build "$build" -j 1 --target cyclegan_train_cpu >"$trainer_log" 2>&1 &
trainer_build=$!
cmake --build "$build" -j "$jobs" --target fmnist_classifier
bin=$build/examples/cyclegan

mkdir -p "$out"
# The scorer's file names its architecture: the file of the earlier, smaller classifier (kept in an
# output folder of an older demo) does not load into this one, so it is not reused.
classifier=$out/fmnist_classifier_bn3.dck
classifier_step=$SECONDS
classifier_kept=""
if [[ ! -f "$classifier" ]]; then
  echo "demo.sh: training the Fashion-MNIST classifier that scores the translations (about 1.5 minutes;" \
    "cyclegan_train_cpu compiles meanwhile)"
  "$bin/fmnist_classifier" --replicas 2 --out "$classifier"
else
  classifier_kept=" (kept from an earlier run)"
fi
[[ -n $classifier_kept ]] || classifier_kept=" (cyclegan_train_cpu compiling beside it)"
classifier_s=$((SECONDS - classifier_step))
trainer_status=0
wait "$trainer_build" || trainer_status=$?
cat "$trainer_log"
if ((trainer_status != 0)); then
  echo "demo.sh: building cyclegan_train_cpu failed (above)" >&2
  exit 1
fi
build_s=$((SECONDS - step - classifier_s))

step=$SECONDS
echo "demo.sh: training the CycleGAN, mirrored over 2 CPU replicas (Ctrl-C stops it with a checkpoint of its step)"
# Ctrl-C (SIGINT) stops the trainer after the step it lands in, with a checkpoint; it then exits with
# 130, and the next scripts/demo.sh continues from that step (--resume).
status=0
"$bin/cyclegan_train_cpu" --strategy mirrored --replicas 2 --placement full --epochs 2 \
  --out "$out/cyclegan" --checkpoint-dir "$out/cyclegan/checkpoints" --resume --preempted-exit-code 130 \
  --classifier "$classifier" "$@" || status=$?
if ((status == 130)); then
  echo "demo.sh: interrupted; run scripts/demo.sh again to continue the CycleGAN from its checkpoint"
  exit 130
fi
((status == 0)) || exit "$status"
cyclegan_s=$((SECONDS - step))

cat <<MSG

demo.sh: the pictures are in $out/cyclegan/
  samples_final.png     each row: real sneaker | as ankle boot | back to sneaker | real ankle boot | as sneaker | back to ankle boot
  samples_step*.png     the same test images during training
  losses.png            the loss curves (losses.csv holds every step)
  checkpoints/          the latest checkpoints: scripts/demo.sh --epochs 4 continues from them

MSG
# The build's share is its wall time less the classifier's training, which ran beside it: the parts add
# up to the whole.
echo "demo.sh: $(mmss $((SECONDS - start))) in all: setup $(mmss "$setup_s"), build $(mmss "$build_s")," \
  "classifier $(mmss "$classifier_s")$classifier_kept, CycleGAN $(mmss "$cyclegan_s")"
