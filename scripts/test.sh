#!/usr/bin/env bash
# Installs what the tests need (scripts/setup.sh test), builds the release preset and runs the test
# suite. Extra arguments go to ctest:
#   scripts/test.sh -L core        scripts/test.sh -R consumer
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh test
# scripts/demo.sh configures build/release without the tests where Boost.Test was not installed, and
# where Open MPI was not either, without the MPI backend (DISTRIBUTE_ENABLE_MPI keeps the value its
# first configure found). Such a folder gets both again, as this machine has them now.
configure=()
if grep -qx 'DISTRIBUTE_BUILD_TESTS:BOOL=OFF' build/release/CMakeCache.txt 2>/dev/null; then
  echo "test.sh: build/release was configured without the tests (by scripts/demo.sh); configuring them, and MPI as installed"
  configure=(-DDISTRIBUTE_BUILD_TESTS=ON -U DISTRIBUTE_ENABLE_MPI)
fi
# The nvcc-built programs only a GPU runs (DISTRIBUTE_BUILD_GPU_PROGRAMS) are built where a GPU is
# visible, or where DISTRIBUTE_BUILD_GPU_PROGRAMS=ON is in the environment; elsewhere the GPU code is
# compiled as a check (the GPU binary's host suite, gpu_syntax.clang): the suite from a fresh clone
# took 35 minutes on 2 cores this way, against 40 before.
gpu_programs=${DISTRIBUTE_BUILD_GPU_PROGRAMS:-}
if [[ -z $gpu_programs ]]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then gpu_programs=ON; else gpu_programs=OFF; fi
fi
configure+=(-DDISTRIBUTE_BUILD_GPU_PROGRAMS="$gpu_programs")
cmake --preset release "${configure[@]}"
cmake --build --preset release -j "$(nproc)"
ctest --preset release -j "$(nproc)" "$@"
