#!/usr/bin/env bash
# Which oneDNN the CPU engine should be built on, decided by measuring on this machine: Debian's 2.6.3
# (libdnnl-dev, the default: Winograd kernels for AVX-512) or Intel's 3.2 from PyPI (build/onednn,
# fetched by `DISTRIBUTE_ONEDNN=3 scripts/setup.sh`: newer kernels for AMX, no Winograd). Which is
# faster depends on the CPU: on a Zen 4 2.6.3's Winograd made the paper-size CycleGAN step about 1.7x
# faster in float32; on a Xeon with AMX, 3.2's bfloat16 kernels are the newer ones.
#
#   scripts/compare_onednn.sh [--precision float32|bf16] [--rounds N] [--size S] [--steps N]
#                                                      (about 6-10 minutes on 2 cores)
#   scripts/compare_onednn.sh --decide RESULTS.jsonl                 (the decision alone, from results)
#
# It builds bench_cyclegan on each oneDNN (build/onednn-compare/2, .../3; Release, -march=native),
# times the paper-size CycleGAN step (256x256 RGB, 64 filters, 9 blocks, batch 1, one_device on every
# core) in float32 and, where the CPU has bf16 units, bfloat16, the two builds interleaved for
# --rounds rounds (2) so that a change of load falls on both, and picks:
#   - per precision, the median seconds a step of each build, and oneDNN 3 where its step takes at
#     most 0.95 of 2.6's time, otherwise Debian's (the default: the margin keeps it against noise);
#   - one pick where the precisions agree, otherwise one per precision (on a Xeon with AMX, 3.2 was
#     1.76x faster in bfloat16 and 1.59x slower in float32): a build serves the precision it trains in.
# It prints the table, the pick and why, and the configure line, and writes them to
# build/onednn-compare/choice.txt (the raw results beside it, results.jsonl). Each build keeps its
# own file of timed kernel choices (DISTRIBUTE_CONV_CHOICES), as a user's runs would.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out=$root/build/onednn-compare
rounds=2 size=256 steps=2 decide_from= only=
while [[ $# -gt 0 ]]; do
  case $1 in
    --rounds) rounds=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --decide) decide_from=$2; shift 2 ;;
    --precision) only=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "compare_onednn.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -z $only || $only == float32 || $only == bf16 ]] ||
  { echo "compare_onednn.sh: --precision takes float32 or bf16, got '$only'" >&2; exit 2; }
for n in "$rounds" "$size" "$steps"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "compare_onednn.sh: --rounds, --size and --steps take positive integers, got '$n'" >&2; exit 2; }
done

# The decision, from bench_cyclegan's JSON lines, each with "onednn" (2 or 3) added.
decide() {
  python3 - "$1" <<'PY'
import json, statistics, sys
runs = {}
with open(sys.argv[1]) as f:
    for n, line in enumerate(f, 1):
        line = line.strip()
        if not line:
            continue
        try:
            r = json.loads(line)
            key = (str(r["onednn"]), r["precision"])
            runs.setdefault(key, []).append(float(r["s_per_step"]))
        except (ValueError, KeyError, TypeError) as e:
            sys.exit(f"compare_onednn.sh: {sys.argv[1]} line {n} is not a result of this script ({e})")
precisions = sorted({p for _, p in runs}, key=lambda p: (p != "float32", p))
both = [p for p in precisions if ("2", p) in runs and ("3", p) in runs]
if not both:
    sys.exit(f"compare_onednn.sh: {sys.argv[1]} has no precision measured on both builds")
rows = []
for p in both:
    a, b = statistics.median(runs[("2", p)]), statistics.median(runs[("3", p)])
    rows.append((p, a, b))
print("precision   oneDNN 2.6 (Debian) s/step   oneDNN 3 (PyPI) s/step   3 / 2.6")
for p, a, b in rows:
    print(f"{p:<11} {a:>27.3f} {b:>24.3f} {b / a:>9.2f}")
# Per precision: oneDNN 3 where its step takes at most 0.95 of 2.6's time, else the default.
names = {"2": "oneDNN 2.6 (Debian, the default)", "3": "oneDNN 3 (build/onednn)"}
configure = {"2": "cmake ... (no option: Debian's oneDNN)", "3": "cmake -DDISTRIBUTE_DNNL_ROOT=$PWD/build/onednn ..."}
picks = {}
for p, a, b in rows:
    picks[p] = "3" if b / a <= 0.95 else "2"
    if picks[p] == "3":
        print(f"{p}: {names['3']}: its step takes {b / a:.2f} of 2.6's time ({a / b:.2f}x as fast)")
    else:
        print(f"{p}: {names['2']}: oneDNN 3's step takes {b / a:.2f} of its time, not the 0.95 or less that "
              "would change the default")
if len(set(picks.values())) == 1:
    v = next(iter(picks.values()))
    print(f"picked: {names[v]}, for every precision measured ({', '.join(picks)})")
    print(f"configure: {configure[v]}")
else:
    print("picked: it depends on the precision the model trains in: " +
          "; ".join(f"{p} on {names[v]}" for p, v in picks.items()))
    for p, v in picks.items():
        print(f"configure for {p}: {configure[v]}")
PY
}

if [[ -n $decide_from ]]; then
  decide "$decide_from"
  exit
fi

cd "$root"
DISTRIBUTE_ONEDNN=3 bash scripts/setup.sh demo
[[ -f build/onednn/include/oneapi/dnnl/dnnl.h ]] || {
  echo "compare_onednn.sh: oneDNN 3 could not be fetched into build/onednn ($(cat build/onednn.unavailable 2>/dev/null || echo 'see build/onednn.log')): Debian's oneDNN stays" >&2
  exit 1
}
mkdir -p "$out"
for v in 2 3; do
  dir=$out/$v
  dnnl_root=
  [[ $v == 3 ]] && dnnl_root=$root/build/onednn
  echo "compare_onednn.sh: building bench_cyclegan on oneDNN $v in $dir"
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DDISTRIBUTE_BUILD_TESTS=OFF -DDISTRIBUTE_BUILD_EXAMPLES=OFF \
    -DDISTRIBUTE_ENABLE_CUDA=OFF -DDISTRIBUTE_DNNL_ROOT="$dnnl_root" >"$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; exit 1; }
  cmake --build "$dir" --target bench_cyclegan -j "$(nproc)" >"$dir.build.log" 2>&1 || { tail -40 "$dir.build.log"; exit 1; }
done

bf16_units=false
grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && bf16_units=true
if [[ -n $only ]]; then
  precisions=("$only")
  [[ $only == float32 || $bf16_units == true ]] ||
    { echo "compare_onednn.sh: this CPU has no bf16 units (avx512_bf16, amx_bf16): nothing to compare in bf16" >&2; exit 2; }
else
  precisions=(float32)
  [[ $bf16_units == true ]] && precisions+=(bf16)
fi
results=$out/results.jsonl
: >"$results"
echo "compare_onednn.sh: ${precisions[*]}, $rounds rounds, the paper-size step at ${size}x$size (load average $(cut -d' ' -f1-3 /proc/loadavg))"
for ((round = 1; round <= rounds; round++)); do
  for p in "${precisions[@]}"; do
    for v in 2 3; do
      line=$(DISTRIBUTE_CONV_CHOICES=$out/$v.conv_choices.txt "$out/$v/benchmarks/bench_cyclegan" --strategy one_device \
        --size "$size" --channels 3 --filters 64 --blocks 9 --d-layers 3 --batch 1 --steps "$steps" --warmup 1 \
        --precision "$p" | grep '^{"bench":"cyclegan"' | tail -1)
      [[ -n $line ]] || { echo "compare_onednn.sh: bench_cyclegan on oneDNN $v printed no result" >&2; exit 1; }
      echo "${line%\}},\"onednn\":\"$v\",\"round\":$round}" >>"$results"
      echo "  round $round, $p, oneDNN $v: $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["s_per_step"])' "$line") s/step"
    done
  done
done
{
  echo "# compare_onednn.sh $(date -u +%Y-%m-%dT%H:%M:%SZ), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) threads, load average $(cut -d' ' -f1-3 /proc/loadavg)"
  decide "$results"
} | tee "$out/choice.txt"
