#!/usr/bin/env bash
# Packs what a GPU machine needs to run this project's GPU checks (scripts/gpu/check.sh) into one
# folder, .gpu/ at the project's root by default (git-ignored through .git/info/exclude): the GPU
# binaries of a CUDA build (stripped, except the test binaries, whose symbols make backtraces
# readable), the Debian libraries they link that the GPU machine's image lacks (Boost.Test, oneDNN,
# Open MPI, ...), gzip-packed (about 26 MB), a Fashion-MNIST subset, and check.sh beside them as
# device-check.sh.
#
#   scripts/gpu/pack.sh [--out DIR] [--no-data] [--partial] [BUILD_DIR]
#                        (default .gpu and build/release; from the project's root; --no-data: without
#                        the Fashion-MNIST subset, for the dry run of tests/gpu/check_dry_run.sh;
#                        --partial: also a build configured with -DDISTRIBUTE_BUILD_GPU_PROGRAMS=OFF,
#                        which scripts/test.sh makes where no GPU is visible and which lacks most GPU
#                        tests: refused without it, for the dry run only)
#
# Then, on the GPU machine, from a copy of the project that holds .gpu/: bash .gpu/device-check.sh
# (docs/gpu.md, "Checking on a GPU"). Build with -DDISTRIBUTE_NATIVE_ARCH=OFF
# -DDISTRIBUTE_BENCH_CYCLEGAN_CUDA=ON: the GPU machine's processor is not this one (an -march=native
# binary may stop with an illegal instruction there). Exit 77 where BUILD_DIR holds no GPU test
# binary (a build without CUDA): nothing to pack.
set -euo pipefail
out=.gpu
data=1 partial=0
while [[ ${1:-} == --* ]]; do
  case $1 in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --no-data) data=0; shift ;;
    --partial) partial=1; shift ;;
    *) echo "pack.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
build=${1:-build/release}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
[[ -f CMakeLists.txt && -d $build ]] || { echo "pack.sh: run from the project's root; no $build" >&2; exit 1; }
if [[ ! -x $build/tests/gpu/distribute_gpu_tests ]]; then
  echo "pack.sh: $build has no GPU test binary (tests/gpu/distribute_gpu_tests): a build without CUDA; nothing packed"
  exit 77
fi
if [[ $partial -eq 0 ]] && grep -q "DISTRIBUTE_BUILD_GPU_PROGRAMS:BOOL=OFF" "$build/CMakeCache.txt"; then
  echo "pack.sh: $build was configured with -DDISTRIBUTE_BUILD_GPU_PROGRAMS=OFF (the GPU code compiled as a check; most GPU tests and the CycleGAN's GPU run left out): configure it with =ON for the device check (--partial packs it anyway); nothing packed" >&2
  exit 1
fi
grep -q "DISTRIBUTE_NATIVE_ARCH:BOOL=OFF" "$build/CMakeCache.txt" ||
  echo "pack.sh: warning: $build was not configured with -DDISTRIBUTE_NATIVE_ARCH=OFF: its binaries may not run on another processor" >&2
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/build" "$stage/libs" "$out"
if [[ $out == .gpu ]]; then
  # .gpu/ goes to the GPU machine beside the project, never into a commit.
  exclude=$(git rev-parse --git-path info/exclude 2>/dev/null || true)
  [[ -n $exclude ]] && { grep -qx "/.gpu/" "$exclude" 2>/dev/null || echo "/.gpu/" >>"$exclude"; }
fi
bins=(tests/gpu/distribute_gpu_tests tests/gpu/distribute_gpu_interop_tests examples/cyclegan/cyclegan_train
      benchmarks/bench_cyclegan benchmarks/bench_nn_gpu benchmarks/bench_allreduce_gpu)
packed=0
for b in "${bins[@]}"; do
  [[ -x $build/$b ]] || { echo "pack.sh: $build/$b is not built: skipped" >&2; continue; }
  mkdir -p "$stage/build/$(dirname "$b")"
  if [[ $b == tests/* ]]; then cp "$build/$b" "$stage/build/$b"; else strip -o "$stage/build/$b" "$build/$b"; fi
  packed=$((packed + 1))
  # The libraries the GPU machine has (CUDA's, cuDNN, NCCL, the C and C++ runtimes) stay out.
  ldd "$build/$b" | awk '/=>/ {print $3}' |
    grep -v -E 'cuda|cudnn|nccl|cublas|nvrtc|libc\.so|libm\.so|libstdc|libgcc_s|libpthread|librt|libdl|ld-linux' |
    while read -r l; do cp -Ln "$l" "$stage/libs/" 2>/dev/null || true; done || true
done
tar -C "$stage" -czf "$out/pack.tar.gz" build libs
# A Fashion-MNIST subset (8,000 train, 2,000 test images): the CycleGAN's GPU test trains on 400.
fmnist=/usr/share/datasets/fashion-mnist
if [[ $data -eq 0 ]]; then
  :
elif [[ -f $fmnist/train-images-idx3-ubyte.gz ]]; then
  python3 - "$fmnist/" "$out/fmnist/" <<'PY'
import gzip, struct, os, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
for name, n in [('train-images-idx3-ubyte', 8000), ('train-labels-idx1-ubyte', 8000),
                ('t10k-images-idx3-ubyte', 2000), ('t10k-labels-idx1-ubyte', 2000)]:
    d = gzip.open(src + name + '.gz').read()
    nd = struct.unpack('>I', d[:4])[0] & 0xff
    dims = list(struct.unpack('>' + 'I' * nd, d[4:4 + 4 * nd])); per = 1
    for x in dims[1:]: per *= x
    h = 4 + 4 * nd; dims[0] = n
    gzip.open(dst + name + '.gz', 'wb').write(d[:4] + struct.pack('>' + 'I' * nd, *dims) + d[h:h + n * per])
PY
else
  echo "pack.sh: warning: no Fashion-MNIST in $fmnist (scripts/setup.sh demo installs it): the CycleGAN's GPU test will be skipped" >&2
fi
cp "$here/check.sh" "$out/device-check.sh"
echo "pack.sh: $packed binaries and $(ls "$stage/libs" | wc -l) libraries in $out/pack.tar.gz ($(du -sh "$out" | cut -f1) in $out)"
