#!/usr/bin/env bash
# Runs SUITES of the GPU test binary under compute-sanitizer's TOOL (memcheck, racecheck, synccheck).
# Without a GPU the binary says so (exit 77) before the sanitizer is involved, and so does this; so
# it does where no compute-sanitizer is found (SANITIZER, else the PATH).
#   run_sanitizer.sh SANITIZER TOOL BINARY SUITES
set -uo pipefail
sanitizer=$1 tool=$2 binary=$3 suites=$4
"$binary" --run_test=device/devices_are_small_values_with_streams >/dev/null 2>&1
probe=$?
if [[ $probe -eq 77 ]]; then
  echo "run_sanitizer: no CUDA device is visible; skipped"
  exit 77
fi
if [[ -z $sanitizer || ! -x $sanitizer ]]; then
  sanitizer=$(command -v compute-sanitizer || true)
fi
if [[ -z $sanitizer ]]; then
  echo "run_sanitizer: compute-sanitizer is not installed here; skipped"
  exit 77
fi
# CUDA API calls that return an error are not reported: the suites make them on purpose (an invalid
# device ordinal, a capture on the legacy stream, each checked for its error), and NCCL probes its
# kernels with calls that fail with cudaErrorNoKernelImageForDevice on every GPU while its
# communicator starts. Those are answers the code handles, not faults; memory errors, races and
# invalid synchronisation still fail the test.
exec "$sanitizer" --tool "$tool" --report-api-errors no --error-exitcode 1 --print-limit 50 "$binary" --run_test="$suites"
