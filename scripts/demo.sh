#!/usr/bin/env bash
# Builds and runs the quickstart example. Extra arguments go to the program.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scripts/setup.sh
cmake --preset release
cmake --build --preset release -j "$(nproc)" --target quickstart
exec build/release/examples/quickstart/quickstart "$@"
