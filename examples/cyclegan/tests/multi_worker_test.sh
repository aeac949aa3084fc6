#!/usr/bin/env bash
# cyclegan_train --strategy multi_worker under mpiexec: the final checkpoint of 2 workers x 1 replica
# must be byte-identical to --strategy mirrored --replicas 2 with the same global batch, also when
# the multi-worker run is stopped halfway and resumed; only the chief prints and writes (its
# pictures, and with --tensorboard one event file). Then 2
# workers x 2 replicas against mirrored --replicas 4: byte-identical too (every stage sums in the
# same tree over replica order), also with the gradients travelling as bfloat16.
#
#   multi_worker_test.sh CYCLEGAN_TRAIN MPIEXEC "MPIEXEC_PREFLAGS" WORK_DIR
# Exits 77 (skipped) when Fashion-MNIST is not installed.
set -euo pipefail
train=$1 mpiexec=$2 preflags=$3 work=$4
source "$(dirname "${BASH_SOURCE[0]}")/test_setup.sh"
# A small model and 20 steps of a global batch of 4: seconds per run.
common=(--steps 20 --batch 2 --train-limit 400 --filters 8 --blocks 1 --d-filters 8 --d-layers 2 --norm sync_batch
        --sample-every 10 --checkpoint-every 10 --seed 3)
read -r -a launcher_flags <<< "$preflags"
mpirun() { "$mpiexec" "${launcher_flags[@]}" -np "$1" "${@:2}"; }
latest() { ls "$1"/ckpt-*.dck | sort | tail -n 1; }
fail() { echo "FAIL: $*"; exit 1; }

"$train" "${common[@]}" --strategy mirrored --replicas 2 --quiet --out "$work/m2" --checkpoint-dir "$work/m2/ckpt"

mpirun 2 "$train" "${common[@]}" --strategy multi_worker --replicas 1 --out "$work/w2" --checkpoint-dir "$work/w2/ckpt" \
  --tensorboard "$work/w2/tb" > "$work/w2.log" 2>&1 || { cat "$work/w2.log"; fail "the 2 x 1 job failed"; }
cat "$work/w2.log"
[[ $(grep -c '^done: step 20' "$work/w2.log") == 1 ]] || fail "expected one 'done' line (the chief's)"
[[ $(grep -c '^training ' "$work/w2.log") == 1 ]] || fail "expected one 'training' line (the chief's)"
grep -q 'on 2 multi_worker replica' "$work/w2.log" || fail "the chief must count the job's 2 replicas"
[[ -f $work/w2/samples_final.png && -f $work/w2/losses.png && -f $work/w2/losses.csv ]] || fail "the chief's pictures"
events=("$work"/w2/tb/events.out.tfevents.*)
[[ ${#events[@]} == 1 && -s ${events[0]} ]] || fail "expected one non-empty TensorBoard event file (the chief's): ${events[*]}"
cmp "$(latest "$work/m2/ckpt")" "$(latest "$work/w2/ckpt")" || fail "2 workers x 1 differs from mirrored --replicas 2"
echo "2 workers x 1 replica: final checkpoint byte-identical to mirrored --replicas 2"

# Stopped at step 10, resumed to 20.
mpirun 2 "$train" "${common[@]}" --strategy multi_worker --replicas 1 --quiet --out "$work/r2" --checkpoint-dir "$work/r2/ckpt" \
  --stop-at-step 10
mpirun 2 "$train" "${common[@]}" --strategy multi_worker --replicas 1 --out "$work/r2" --checkpoint-dir "$work/r2/ckpt" \
  --resume > "$work/r2.log" 2>&1 || { cat "$work/r2.log"; fail "the resumed job failed"; }
grep -q 'resumed from .*ckpt-0*10.dck at step 10' "$work/r2.log" || { cat "$work/r2.log"; fail "no resume at step 10"; }
cmp "$(latest "$work/m2/ckpt")" "$(latest "$work/r2/ckpt")" || fail "the resumed 2 x 1 job differs from mirrored --replicas 2"
echo "2 workers x 1 replica, stopped at 10 and resumed: byte-identical to mirrored --replicas 2"

# 2 workers x 2 replicas against 4 replicas in one process.
"$train" "${common[@]}" --batch 1 --strategy mirrored --replicas 4 --quiet --out "$work/m4" --checkpoint-dir "$work/m4/ckpt"
mpirun 2 "$train" "${common[@]}" --batch 1 --strategy multi_worker --replicas 2 --quiet --out "$work/w4" \
  --checkpoint-dir "$work/w4/ckpt"
a=$(latest "$work/m4/ckpt") b=$(latest "$work/w4/ckpt")
cmp "$a" "$b" || fail "2 workers x 2 differs from mirrored --replicas 4 ($(cmp -l "$a" "$b" | wc -l) bytes)"
echo "2 workers x 2 replicas: final checkpoint byte-identical to mirrored --replicas 4"

# Gradients travelling as bfloat16: 2 workers x 2 replicas against 4 replicas in one process, byte
# for byte again (each addition rounded to bfloat16 in the same tree), and not the float run.
bf16=(--gradient-compression bfloat16)
"$train" "${common[@]}" "${bf16[@]}" --batch 1 --strategy mirrored --replicas 4 --quiet --out "$work/m4h" \
  --checkpoint-dir "$work/m4h/ckpt"
mpirun 2 "$train" "${common[@]}" "${bf16[@]}" --batch 1 --strategy multi_worker --replicas 2 --out "$work/w4h" \
  --checkpoint-dir "$work/w4h/ckpt" > "$work/w4h.log" 2>&1 || { cat "$work/w4h.log"; fail "the bfloat16 2 x 2 job failed"; }
grep -q '^gradients all-reduced as bfloat16' "$work/w4h.log" || { cat "$work/w4h.log"; fail "the chief must say the gradients travel as bfloat16"; }
a=$(latest "$work/m4h/ckpt") b=$(latest "$work/w4h/ckpt")
cmp "$a" "$b" || fail "bfloat16 gradients: 2 workers x 2 differs from mirrored --replicas 4 ($(cmp -l "$a" "$b" | wc -l) bytes)"
if cmp -s "$a" "$(latest "$work/m4/ckpt")"; then fail "bfloat16 gradients gave the float run's checkpoint"; fi
echo "bfloat16 gradients, 2 workers x 2 replicas: final checkpoint byte-identical to mirrored --replicas 4, not the float run's"
rm -rf "$work"
echo "PASS"
