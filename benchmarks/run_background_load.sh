#!/usr/bin/env bash
# The CycleGAN step at demo size on a quiet machine and beside busy processes
# (bench_cyclegan --background-load), for each way of running the engine's threads, in interleaved
# rounds (every candidate once per round, quiet then loaded, so that other work on the machine falls
# on all of them alike):
#   default     the engine's defaults: the replica's share of the cores, fewer while other programs
#               keep them busy (compute_options::adapt_threads)
#   fixed       the share, always (--adapt-threads off), libgomp's default waits (spin, then sleep)
#   passive     fixed, with OMP_WAIT_POLICY=passive in the environment (threads sleep at once at a barrier)
#   spin1000    fixed, with GOMP_SPINCOUNT=1000 in the environment (a short spin before sleeping)
#   threads1    compute_options::threads = 1 (--threads 1)
# for one_device (all cores) and mirrored (2 replicas of one thread each; there threads1 and fixed are
# the default, so --mirrored-candidates leaves them out). Prints one line per run and
# a table of each candidate's images/s (median of --steps steps per run, the runs in order) with the
# lowest loaded run as a share of the median quiet run; the JSON lines (with the candidate, the round,
# and /proc/loadavg before and after) go to --json.
#
#   benchmarks/run_background_load.sh [--bench build/release/benchmarks/bench_cyclegan] [--rounds 5]
#       [--steps 20] [--warmup 3] [--load 1] [--strategies "one_device mirrored"]
#       [--candidates "default fixed passive spin1000 threads1"]
#       [--mirrored-candidates "default passive spin1000"] [--json FILE]
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bench=$root/build/release/benchmarks/bench_cyclegan
rounds=5
steps=20
warmup=3
busy=1
strategies="one_device mirrored"
candidates="default fixed passive spin1000 threads1"
mirrored_candidates="default passive spin1000"
json=""
die() { echo "run_background_load.sh: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bench) bench=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --load) busy=$2; shift 2 ;;
    --strategies) strategies=$2; shift 2 ;;
    --candidates) candidates=$2; shift 2 ;;
    --mirrored-candidates) mirrored_candidates=$2; shift 2 ;;
    --json) json=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ -x $bench ]] || die "$bench is not built (cmake --build --preset release --target bench_cyclegan)"
out=$(mktemp)
trap 'rm -f "$out" "$out.jsonl"' EXIT

demo=(--size 28 --channels 1 --filters 16 --blocks 3 --d-layers 2 --batch 8 --steps "$steps" --warmup "$warmup")
echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ), $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 1; r <= rounds; r++)); do
  for load in 0 "$busy"; do
    for strategy in $strategies; do
      replicas=() list=$candidates
      [[ $strategy == mirrored ]] && replicas=(--replicas 2) list=$mirrored_candidates
      for c in $list; do
        env=() flags=()
        case $c in
          default) ;;
          fixed) flags=(--adapt-threads off) ;;
          passive) env=(OMP_WAIT_POLICY=passive) flags=(--adapt-threads off) ;;
          spin1000) env=(GOMP_SPINCOUNT=1000) flags=(--adapt-threads off) ;;
          threads1) flags=(--threads 1) ;;
          *) die "unknown candidate $c" ;;
        esac
        l0=$(cut -d' ' -f1-3 /proc/loadavg)
        env "${env[@]}" "$bench" --strategy "$strategy" "${replicas[@]}" "${demo[@]}" "${flags[@]}" --background-load "$load" >"$out"
        l1=$(cut -d' ' -f1-3 /proc/loadavg)
        line=$(grep '^{' "$out" | tail -1)
        python3 -c 'import json, sys; d = json.loads(sys.argv[1]); d.update(candidate=sys.argv[2], round=int(sys.argv[3]), load_start=sys.argv[4], load_end=sys.argv[5]); print(json.dumps(d))' \
          "$line" "$c" "$r" "$l0" "$l1" >>"$out.jsonl"
        printf '  round %d  %-10s %-9s busy %d  %8.1f images/s  load %s -> %s\n' "$r" "$strategy" "$c" "$load" \
          "$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["images_per_s"])' "$line")" "$l0" "$l1"
      done
    done
  done
done
python3 - "$out.jsonl" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("\n| strategy | candidate | quiet images/s (runs) | loaded images/s (runs) | worst loaded / median quiet |")
print("|---|---|---|---|---|")
keys = []
for d in runs:
    k = (d["strategy"], d["candidate"])
    if k not in keys: keys.append(k)
for s, c in keys:
    q = [d["images_per_s"] for d in runs if (d["strategy"], d["candidate"]) == (s, c) and d["background_load"] == 0]
    b = [d["images_per_s"] for d in runs if (d["strategy"], d["candidate"]) == (s, c) and d["background_load"] > 0]
    f = lambda v: ", ".join(f"{x:.0f}" for x in v)
    share = min(b) / statistics.median(q) if q and b else float("nan")
    print(f"| {s} | {c} | {f(q)} | {f(b)} | {100 * share:.0f}% |")
EOF
if [[ -n $json ]]; then cat "$out.jsonl" >>"$json"; fi
