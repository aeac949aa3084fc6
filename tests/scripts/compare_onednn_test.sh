#!/usr/bin/env bash
# scripts/compare_onednn.sh's decision (--decide), on canned results: which oneDNN it picks, that it
# says why, and that results it cannot use are an error naming the line, not a pick.
set -u
script=$1/scripts/compare_onednn.sh
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0
line() { echo "{\"bench\":\"cyclegan\",\"precision\":\"$1\",\"s_per_step\":$2,\"onednn\":\"$3\",\"round\":1}"; }
expect() {  # expect NAME EXIT-STATUS PATTERN FILE
  local out rc
  out=$(bash "$script" --decide "$4" 2>&1)
  rc=$?
  if [[ $rc -ne $2 ]] || ! grep -qE "$3" <<<"$out"; then
    echo "FAIL $1: exit $rc (expected $2), output:"
    echo "$out"
    failures=$((failures + 1))
  else
    echo "ok   $1: $(grep -E "$3" <<<"$out" | head -1)"
  fi
}
# oneDNN 3 10% faster in both precisions (medians of two rounds each): picked.
{ line float32 4.0 2; line float32 4.4 2; line float32 3.6 3; line float32 3.96 3
  line bf16 3.0 2; line bf16 3.2 2; line bf16 2.7 3; line bf16 2.88 3; } >"$work/faster.jsonl"
expect "3 faster by 10%" 0 '^picked: oneDNN 3 \(build/onednn\), for every precision measured \(float32, bf16\)' "$work/faster.jsonl"
expect "why, per precision" 0 '^bf16: oneDNN 3 \(build/onednn\): its step takes 0\.90 of 2\.6' "$work/faster.jsonl"
expect "the configure line" 0 '^configure: cmake -DDISTRIBUTE_DNNL_ROOT=\$PWD/build/onednn' "$work/faster.jsonl"
# Faster in bfloat16 by 20%, slower in float32 by 25%: a pick per precision.
{ line float32 4.0 2; line float32 5.0 3; line bf16 3.0 2; line bf16 2.4 3; } >"$work/mixed.jsonl"
expect "mixed: one per precision" 0 '^picked: it depends on the precision .*: float32 on oneDNN 2\.6 \(Debian, the default\); bf16 on oneDNN 3' "$work/mixed.jsonl"
expect "mixed: bf16's configure line" 0 '^configure for bf16: cmake -DDISTRIBUTE_DNNL_ROOT' "$work/mixed.jsonl"
expect "mixed: float32's configure line" 0 "^configure for float32: cmake \\.\\.\\. \\(no option" "$work/mixed.jsonl"
expect "mixed table" 0 '^bf16 +3\.000 +2\.400 +0\.80' "$work/mixed.jsonl"
# 3% faster: inside the margin.
{ line float32 4.0 2; line float32 3.88 3; } >"$work/close.jsonl"
expect "3% is inside the margin" 0 '^float32: oneDNN 2\.6 .*0\.97 of its time' "$work/close.jsonl"
expect "3%: the default stays" 0 '^picked: oneDNN 2\.6 \(Debian, the default\), for every precision measured \(float32\)' "$work/close.jsonl"
# Unusable results.
{ line float32 4.0 2; echo 'not json'; } >"$work/bad.jsonl"
expect "a line that is not a result" 1 'bad\.jsonl line 2 is not a result' "$work/bad.jsonl"
{ line float32 4.0 2; line bf16 3.0 2; } >"$work/one.jsonl"
expect "one build only" 1 'no precision measured on both builds' "$work/one.jsonl"
exit $((failures > 0))
