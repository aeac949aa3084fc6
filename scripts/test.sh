#!/usr/bin/env bash
# Builds the release preset and runs the test suite. Extra arguments go to ctest:
#   scripts/test.sh -L core        scripts/test.sh -R consumer
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
cmake --preset release
cmake --build --preset release -j "$(nproc)"
ctest --preset release -j "$(nproc)" "$@"
