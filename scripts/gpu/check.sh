#!/usr/bin/env bash
# Every GPU check of this project in one go, on the GPU machine, from the project's root after
# scripts/gpu/pack.sh packed .gpu/ there (pack.sh copies this file to .gpu/device-check.sh):
#   1. every suite of the GPU test binary (host device collectives strategy failure hardening layers
#      cudnn passes), one process each, beside gpu.interop and the CycleGAN's GPU test;
#   2. the CycleGAN step against PyTorch eager on the same GPU, and the GPU benchmarks;
#   3. compute-sanitizer memcheck over the suites, as time allows.
# Writes $OUT/summary.txt (also printed) and $OUT/logs.tgz. About 6 minutes on an H100; later
# sections are skipped as the time runs out. Exit 1 where a check of section 1 failed.
#
#   bash .gpu/device-check.sh [quick]          quick: section 1 only
#   scripts/gpu/check.sh --summarize LOGDIR    the summary of section 1's logs in LOGDIR, made
#                                              elsewhere (what the test gpu.check_dry_run runs here
#                                              on canned logs: this script's own reading of them)
#
# The multi-worker suite needs two GPUs and mpiexec: it is the ctest gpu.multi_worker_2_processes,
# not run here.
set -u
suites="host device collectives strategy failure hardening layers cudnn passes"

# The summary of section 1 from its logs in $1: one line a check (its exit status and Boost.Test's
# last word on it), and the first errors of a failed one. Returns 1 where a check failed or left no
# log, 0 otherwise (77, skipped, counts as not failed: a suite that found no GPU says so).
summarize() {
  local d=$1 s f status failed=0
  check_line() {  # name log detail-pattern
    local name=$1 log=$2 pattern=$3 detail
    if [[ ! -f $log ]]; then
      echo "$name: no log"
      failed=1
      return
    fi
    status=$(tail -n 1 "$log")
    detail=$(grep -aE "$pattern" "$log" | sed 's/\x1b\[[0-9;]*m//g; s/^ *//' | head -n 2 | paste -sd ' ' | cut -c1-160)
    echo "$name $status${detail:+ $detail}"
    case $status in rc=0 | rc=77) ;; *) failed=1 ;; esac
    grep -aE '(error|fatal error): in|^FAIL' "$log" | sed 's/\x1b\[[0-9;]*m//g' | head -n 3 | cut -c1-300 | sed 's/^/  /'
  }
  local boost='has (passed|failed) with|No errors detected|assertions? out of [0-9]+ failed|: skipped$'
  check_line gpu.interop "$d/gpu_interop.log" "$boost"
  for s in $suites; do check_line "gpu.$s" "$d/suite_$s.log" "$boost"; done
  check_line gpu.cyclegan "$d/gpu_cyclegan.log" 'tracks|equals|exactly|skipped'
  return $failed
}

if [[ ${1:-} == --summarize ]]; then
  [[ -d ${2:-} ]] || { echo "check.sh --summarize: needs a folder of logs" >&2; exit 2; }
  summarize "$2"
  exit $?
fi

root=$(pwd); g=$root/.gpu; O=${OUT:-$(mktemp -d)}; mkdir -p "$O/l"
t0=$(date +%s); el() { echo $(( $(date +%s) - t0 )); }
log() { echo "[$(el)s] $*" | tee -a "$O/summary.txt"; }
[[ -f $g/pack.tar.gz ]] || { echo "check.sh: no $g/pack.tar.gz: run scripts/gpu/pack.sh where the project was built" >&2; exit 2; }
tar -C "$g" -xzf "$g/pack.tar.gz"
mkdir -p /usr/share/datasets; [[ -e /usr/share/datasets/fashion-mnist ]] || ln -s "$g/fmnist" /usr/share/datasets/fashion-mnist
# cuDNN and NCCL come with the machine's PyTorch, cuBLAS and nvrtc with its CUDA toolkit.
dirs=""
for lib in libcudnn.so.9 libnccl.so.2 libcublas.so.13 libnvrtc.so.13; do
  f=$(find /usr/local/cuda/lib64/ /opt/torch/.venv/lib/python3.12/site-packages/nvidia -name "$lib" 2>/dev/null | head -1)
  [[ -z $f ]] && f=$(find / -xdev -name "$lib" 2>/dev/null | head -1)
  [[ -n $f ]] && dirs="$dirs:$(dirname "$f")"; log "$lib: ${f:-MISSING}"
done
export LD_LIBRARY_PATH="$g/libs$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
log "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1)"
log "torch $(python3 -c 'import torch; print(torch.__version__, "cudnn", torch.backends.cudnn.version())' 2>&1 | tail -1)"
log "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
B=$g/build; T=$B/tests/gpu/distribute_gpu_tests
# 1. The gpu suites, one process each, beside the CycleGAN's GPU test and gpu.interop.
for s in $suites; do
  ( timeout 150 "$T" --run_test=$s --report_level=short --log_level=test_suite >"$O/l/suite_$s.log" 2>&1; echo "rc=$?" >>"$O/l/suite_$s.log" ) &
done
( timeout 200 bash examples/cyclegan/tests/gpu_test.sh "$B/examples/cyclegan/cyclegan_train" "$(mktemp -d)/work" >"$O/l/gpu_cyclegan.log" 2>&1; echo "rc=$?" >>"$O/l/gpu_cyclegan.log" ) &
( DISTRIBUTE_REQUIRE_GPU=1 timeout 120 "$B/tests/gpu/distribute_gpu_interop_tests" --report_level=short >"$O/l/gpu_interop.log" 2>&1; echo "rc=$?" >>"$O/l/gpu_interop.log" ) &
wait
summarize "$O/l" | while IFS= read -r line; do log "$line"; done
section1=${PIPESTATUS[0]}
if [[ ${1:-} != quick ]]; then
  # 2. The CycleGAN step against PyTorch eager on this GPU, alone on the card.
  PYTHONUNBUFFERED=1 timeout 210 bash benchmarks/peer/run_peer.sh --gpu --no-build --build-dir "$B" --rounds 1 --steps 10 --warmup 3 \
    --json "$O/peer.jsonl" >"$O/l/peer.log" 2>&1
  log "peer rc=$?"; grep -aE '^\(g|goal' "$O/l/peer.log" | tee -a "$O/summary.txt"
  timeout 45 "$B/benchmarks/bench_allreduce_gpu" >"$O/l/bench_allreduce_gpu.log" 2>&1; log "bench_allreduce_gpu rc=$?"
  timeout 60 "$B/benchmarks/bench_nn_gpu" >"$O/l/bench_nn_gpu.log" 2>&1; log "bench_nn_gpu rc=$?"
  # 3. memcheck (the API errors some tests cause on purpose are not reported).
  if [[ $(el) -lt 420 ]]; then
    timeout $((480 - $(el))) compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 1 --print-limit 30 \
      "$T" --run_test=device,collectives,strategy,hardening,layers,cudnn,passes >"$O/l/memcheck.log" 2>&1
    log "memcheck rc=$? $(grep -aE 'ERROR SUMMARY' "$O/l/memcheck.log" | tail -1)"
  fi
fi
(cd "$O" && tar czf logs.tgz l && rm -rf l)
log "done; logs in logs.tgz"
[[ $section1 -eq 0 ]] || exit 1
