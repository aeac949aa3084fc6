#!/usr/bin/env bash
# The CycleGAN training step, ours (bench_cyclegan: the example's trainer) beside PyTorch
# (cyclegan_torch.py: a port of the same networks and step) on the same CPU cores, in interleaved
# rounds (ours, peer, ours, peer, ...):
#   (a) demo      28x28x1, 16 filters, 3 blocks, 2 d-layers, global batch 8: one_device vs torch, all cores
#   (b) demo-1t   the same, both pinned to core 0 (taskset -c 0): one thread each
#   (c) demo-2r   the same, mirrored 2 replicas vs torch DDP (gloo) 2 ranks x 1 thread
#   (d) paper     256x256x3, 64 filters, 9 blocks, 3 d-layers, batch 1: one_device vs torch, all cores
# Before timing, the parameter counts of both sides must agree (at demo and paper size).
# With --gpu, on GPU 0 instead (ours --device cuda, the build must have CUDA; torch on "cuda"), both
# in float32 unless --tf32, with the peak device memory of each:
#   (g1) demo      28x28x1, 16 filters, 3 blocks, 2 d-layers, global batch 8, one_device vs torch eager
#   (g2) paper     256x256x3, 64 filters, 9 blocks, 3 d-layers, batch 1
#   (g3) paper     the same, batch 4
#   (g4) demo-2r   demo, mirrored over 2 logical replicas on the one GPU vs torch (one process, batch 8)
# The peer is the python3 on PATH when its torch has CUDA (a GPU machine's own PyTorch), else the
# virtual environment's.
#
#   benchmarks/peer/run_peer.sh [--build-dir build/release] [--venv build/peer-venv] [--rounds 3]
#       [--steps 20] [--warmup 3] [--paper-steps 1] [--paper-warmup 1] [--quick] [--check]
#       [--no-build] [--json FILE] [--precision bf16] [--gpu [--tf32] [--precision bf16|fp16] [--graphs] [--autotune]]
#
#   --quick   skips (d)
#   --check   also the step-1 check: both sides train one step from the same initial weights and
#             batch (bench_cyclegan writes them, the port loads them); losses and every gradient
#             must agree. Also checks that torch DDP's step 1 equals torch's single-process step 1.
#   --json    appends every measurement as one JSON line (with the configuration, round and loads)
#   --gpu     the GPU configurations (g1-g4) in place of (a)-(d); --quick skips (g3)
#   --graphs  with --gpu: each network's passes as CUDA graphs on both sides (ours --graphs on,
#             the peer torch.cuda.make_graphed_callables)
#   --autotune with --gpu: cuDNN's engines timed per convolution shape on both sides (ours
#             --autotune, compute_options::conv_autotune; the peer torch.backends.cudnn.benchmark)
#   --precision bf16  mixed precision on both sides (ours --precision bf16: on the CPU oneDNN's bf16
#             kernels, where it has bf16 units; the peer the step under torch.autocast); fp16: --gpu only
#
# The virtual environment (created once) holds a pinned CPU build of torch: from the PyTorch CPU
# wheel index when it is reachable, else PyPI's build (which brings CUDA libraries it does not use
# here). Logs go to <build-dir>/peer-logs/.
set -euo pipefail

TORCH_VERSION=2.15.0
NUMPY_VERSION=2.3.5
CPU_INDEX=https://download.pytorch.org/whl/cpu

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build_dir=build/release
venv=build/peer-venv
rounds=3
steps=20
warmup=3
paper_steps=1
paper_warmup=1
quick=0
check=0
build=1
json=""
gpu=0
gpu_flags=()  # --tf32, --autotune: the same flag to both sides
precision=()  # --precision bf16|fp16: ours --precision, the peer --amp
amp=()
graphs=0
autotune=0

die() { echo "run_peer.sh: $*" >&2; exit 1; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir=$2; shift 2 ;;
    --venv) venv=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --paper-steps) paper_steps=$2; shift 2 ;;
    --paper-warmup) paper_warmup=$2; shift 2 ;;
    --quick) quick=1; shift ;;
    --check) check=1; shift ;;
    --no-build) build=0; shift ;;
    --json) json=$2; shift 2 ;;
    --gpu) gpu=1; shift ;;
    --tf32) gpu_flags+=(--tf32); shift ;;
    --precision) [[ $2 == bf16 || $2 == fp16 ]] || die "--precision must be bf16 or fp16"
                 precision+=(--precision "$2"); amp+=(--amp "$2"); shift 2 ;;
    --graphs) graphs=1; precision+=(--graphs on); amp+=(--graphs); shift ;;
    --autotune) autotune=1; gpu_flags+=(--autotune); shift ;;
    -h|--help) sed -n '2,40p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
cd "$root"
[[ $graphs == 1 && $gpu == 0 ]] && die "--graphs needs --gpu"
[[ $autotune == 1 && $gpu == 0 ]] && die "--autotune needs --gpu"
[[ $gpu == 0 && " ${precision[*]} " == *" fp16 "* ]] && die "--precision fp16 needs --gpu (on the CPU: bf16, where it has bf16 units)"
[[ -n "$json" ]] && json=$(realpath -m "$json")
cores=$(nproc)
logs=$build_dir/peer-logs
py=$venv/bin/python
peer=benchmarks/peer/cyclegan_torch.py

# --- the peer's environment ---------------------------------------------------------------------
if [[ $gpu == 1 ]] && python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; then
  py=$(command -v python3)  # the machine's own PyTorch with CUDA
fi
have_torch() { [[ -x $py ]] && "$py" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$TORCH_VERSION')" 2>/dev/null; }
if [[ $gpu == 1 && $py != "$venv/bin/python" ]]; then
  echo "== the peer: $py, torch $("$py" -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)')"
elif ! have_torch; then
  echo "== creating $venv with torch $TORCH_VERSION (once)"
  python3 -m venv "$venv"
  "$py" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
  if ! "$py" -m pip install --quiet --timeout 20 --retries 0 --index-url "$CPU_INDEX" \
      "torch==$TORCH_VERSION" 2>/dev/null; then
    echo "   the CPU wheel index is not reachable; installing PyPI's torch $TORCH_VERSION"
    "$py" -m pip install --quiet "torch==$TORCH_VERSION"
  fi
  "$py" -m pip install --quiet "numpy==$NUMPY_VERSION"
  have_torch || die "torch $TORCH_VERSION did not install into $venv"
fi

# --- ours ---------------------------------------------------------------------------------------
if [[ $build == 1 ]]; then
  # The GPU side of bench_cyclegan is built on request.
  gpu_side=-DDISTRIBUTE_BENCH_CYCLEGAN_CUDA=$([[ $gpu == 1 ]] && echo ON || echo OFF)
  if [[ $build_dir == build/release ]]; then
    if [[ ! -f build/release/CMakeCache.txt || $gpu == 1 ]]; then cmake --preset release "$gpu_side" >/dev/null; fi
    cmake --build --preset release --target bench_cyclegan
  else
    if [[ ! -f $build_dir/CMakeCache.txt || $gpu == 1 ]]; then
      cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDISTRIBUTE_BUILD_TESTS=OFF "$gpu_side" >/dev/null
    fi
    cmake --build "$build_dir" --target bench_cyclegan -j "$cores"
  fi
fi
ours=$build_dir/benchmarks/bench_cyclegan
[[ -x $ours ]] || die "$ours is not built (drop --no-build, or pass --build-dir)"
mkdir -p "$logs"

demo=(--size 28 --channels 1 --filters 16 --blocks 3 --d-layers 2 --batch 8)
paper=(--size 256 --channels 3 --filters 64 --blocks 9 --d-layers 3 --batch 1)

# --- parameter counts: the port must be the same networks ---------------------------------------
echo "== parameter counts"
same_parameters() {  # name shape...
  local name=$1 o p; shift
  o=$("$ours" "$@" --params-only)
  p=$("$py" "$peer" "$@" --params-only)
  "$py" - "$name" "$o" "$p" <<'EOF' || die "parameter counts differ: the port is not the example's networks"
import json, sys
name, o, p = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
for k, what in (("g_params", "G"), ("d_params", "D")):
    print(f"   {name:<5} {what}: ours {o[k]:>10,}  torch {p[k]:>10,}  {'same' if o[k] == p[k] else 'DIFFERENT'}")
sys.exit(0 if o == p else 1)
EOF
}
same_parameters demo "${demo[@]}"
same_parameters paper "${paper[@]}"

# --- the step-1 check ---------------------------------------------------------------------------
if [[ $check == 1 ]]; then
  echo "== step-1 check: one step from the same weights and batch"
  n=0
  check_one() {  # strategy replicas shape...
    local strategy=$1 replicas=$2; shift 2
    local dir=$logs/check-$((n++))
    rm -rf "$dir" && mkdir -p "$dir"
    "$ours" --strategy "$strategy" --replicas "$replicas" "$@" --check-dir "$dir" >"$dir/ours.log"
    echo "-- ours $strategy x$replicas, $*"
    if ! "$py" "$peer" "$@" --check-dir "$dir" | tee "$dir/peer.log" | sed 's/^/   /'; then
      die "the step-1 check failed (ours and the port disagree); see $dir"
    fi
  }
  check_one one_device 1 "${demo[@]}"
  check_one mirrored 2 "${demo[@]}"
  check_one one_device 1 --size 32 --channels 3 --filters 8 --blocks 2 --d-layers 3 --batch 2
  check_one one_device 1 --size 64 --channels 3 --filters 8 --blocks 1 --d-layers 4 --batch 2
  # torch DDP against torch in one process: the same losses (the D losses follow the G update, so
  # they see the all-reduced generator gradients).
  s=$("$py" "$peer" "${demo[@]}" --steps 1 --warmup 0 2>/dev/null | tail -1)
  d=$("$py" "$peer" "${demo[@]}" --steps 1 --warmup 0 --ddp 2>/dev/null | tail -1)
  "$py" - "$s" "$d" <<'EOF' || die "torch DDP's step 1 differs from torch's single-process step 1"
import json, sys
s, d = (json.loads(a)["step1_losses"] for a in sys.argv[1:])
worst = max(abs(s[k] - d[k]) / max(abs(s[k]), 1e-12) for k in s)
print(f"-- torch DDP 2x1 vs one process, step-1 losses: worst relative difference {worst:.2e}")
sys.exit(0 if worst < 1e-5 else 1)
EOF
fi

# --- interleaved rounds -------------------------------------------------------------------------
load() { cut -d' ' -f1-3 /proc/loadavg; }
configs=(a b c)
[[ $quick == 0 ]] && configs+=(d)
if [[ $gpu == 1 ]]; then
  "$ours" --device cuda --steps 1 --warmup 0 "${demo[@]}" >/dev/null ||
    die "$ours --device cuda does not run (a build without CUDA, or no GPU)"
  "$py" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || die "the peer's torch has no CUDA"
  configs=(g1 g2 g4)
  [[ $quick == 0 ]] && configs=(g1 g2 g3 g4)
fi
paper4=(--size 256 --channels 3 --filters 64 --blocks 9 --d-layers 3 --batch 4)
results=$logs/results.jsonl
: >"$results"
run_load_start=$(load)
echo "== $(date -u +%Y-%m-%dT%H:%M:%SZ), $(lscpu | sed -n 's/^Model name:[[:space:]]*//p'), $cores cores, torch $("$py" -c 'import torch; print(torch.__version__)')"
echo "== load average at start: $run_load_start; rounds: $rounds"

measure() {  # round config side command...
  local round=$1 config=$2 side=$3; shift 3
  local log=$logs/$config-$side-$round.log l0 l1 line
  l0=$(load)
  local rc=0
  "$@" >"$log" 2>"$log.err" || rc=$?
  if [ "$rc" -ne 0 ]; then
    # torch's DDP ranks (gloo) now and then abort while shutting down, after the result is reported:
    # the measurement stands, and the exit status goes into the record. Ours must exit cleanly.
    if [ "$side" = peer ] && grep -q '^{' "$log"; then
      echo "run_peer.sh: warning: the peer exited with status $rc after reporting its result on ($config), round $round; kept (see $log.err)" >&2
    else
      cat "$log.err" >&2
      die "$side failed on ($config); see $log"
    fi
  fi
  l1=$(load)
  line=$(grep '^{' "$log" | tail -1)
  "$py" -c 'import json, sys; d = json.loads(sys.argv[1]); d.update(config=sys.argv[2], round=int(sys.argv[3]), load_start=sys.argv[4], load_end=sys.argv[5], exit_status=int(sys.argv[6])); print(json.dumps(d))' \
    "$line" "$config" "$round" "$l0" "$l1" "$rc" >>"$results"
  printf '   %-8s %-5s %s\n' "($config)" "$side" "$(grep 's/step' "$log" | sed 's/^ *//')"
}

for ((r = 1; r <= rounds; r++)); do
  echo "-- round $r"
  for c in "${configs[@]}"; do
    case $c in
      a) measure "$r" a ours "$ours" --strategy one_device "${precision[@]}" "${demo[@]}" --steps "$steps" --warmup "$warmup"
         measure "$r" a peer "$py" "$peer" "${amp[@]}" "${demo[@]}" --threads "$cores" --steps "$steps" --warmup "$warmup" ;;
      b) measure "$r" b ours taskset -c 0 "$ours" --strategy one_device "${precision[@]}" "${demo[@]}" --steps "$steps" --warmup "$warmup"
         measure "$r" b peer taskset -c 0 "$py" "$peer" "${amp[@]}" "${demo[@]}" --threads 1 --steps "$steps" --warmup "$warmup" ;;
      c) measure "$r" c ours "$ours" --strategy mirrored --replicas 2 "${precision[@]}" "${demo[@]}" --steps "$steps" --warmup "$warmup"
         measure "$r" c peer "$py" "$peer" "${amp[@]}" "${demo[@]}" --ddp --world-size 2 --steps "$steps" --warmup "$warmup" ;;
      d) measure "$r" d ours "$ours" --strategy one_device "${precision[@]}" "${paper[@]}" --steps "$paper_steps" --warmup "$paper_warmup"
         measure "$r" d peer "$py" "$peer" "${amp[@]}" "${paper[@]}" --threads "$cores" --steps "$paper_steps" --warmup "$paper_warmup" ;;
      g1) measure "$r" g1 ours "$ours" --device cuda "${gpu_flags[@]}" "${precision[@]}" --strategy one_device "${demo[@]}" --steps "$steps" --warmup "$warmup"
          measure "$r" g1 peer "$py" "$peer" --device cuda "${gpu_flags[@]}" "${amp[@]}" "${demo[@]}" --steps "$steps" --warmup "$warmup" ;;
      g2) measure "$r" g2 ours "$ours" --device cuda "${gpu_flags[@]}" "${precision[@]}" --strategy one_device "${paper[@]}" --steps "$steps" --warmup "$warmup"
          measure "$r" g2 peer "$py" "$peer" --device cuda "${gpu_flags[@]}" "${amp[@]}" "${paper[@]}" --steps "$steps" --warmup "$warmup" ;;
      g3) measure "$r" g3 ours "$ours" --device cuda "${gpu_flags[@]}" "${precision[@]}" --strategy one_device "${paper4[@]}" --steps "$steps" --warmup "$warmup"
          measure "$r" g3 peer "$py" "$peer" --device cuda "${gpu_flags[@]}" "${amp[@]}" "${paper4[@]}" --steps "$steps" --warmup "$warmup" ;;
      g4) measure "$r" g4 ours "$ours" --device cuda "${gpu_flags[@]}" "${precision[@]}" --strategy mirrored --replicas 2 "${demo[@]}" --steps "$steps" --warmup "$warmup"
          measure "$r" g4 peer "$py" "$peer" --device cuda "${gpu_flags[@]}" "${amp[@]}" "${demo[@]}" --steps "$steps" --warmup "$warmup" ;;
    esac
  done
done
run_load_end=$(load)

"$py" benchmarks/peer/summarize.py "$results" "$run_load_start" "$run_load_end"
if [[ -n "$json" ]]; then
  cat "$results" >>"$json"
  echo "== appended $(wc -l <"$results") JSON lines to $json"
fi
