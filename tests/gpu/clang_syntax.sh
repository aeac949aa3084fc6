#!/usr/bin/env bash
# Parses the GPU headers (each on its own, so that each includes what it uses) and the GPU test and
# benchmark sources with clang's CUDA front end, host and device side: a second compiler's reading of
# code that nvcc alone has compiled. No GPU, nvcc or CUDA library is needed (-nocudalib).
#
#   clang_syntax.sh CLANG CUDA_ROOT FLAGS_FILE SHIM_DIR FILE...
#
# FLAGS_FILE holds the -I and -D flags of the GPU tests, one a line. SHIM_DIR holds an empty
# texture_fetch_functions.h: CUDA 13 removed that header and clang 19's CUDA wrapper still includes
# it. Exit 77 (skipped) when CLANG is not installed; 1 when a file does not parse.
set -uo pipefail
clang=$1 cuda=$2 flags_file=$3 shim=$4
shift 4
if [[ -z $clang || ! -x $clang ]]; then
  echo "clang_syntax: clang 19 is not installed (Debian: apt-get install clang-19); skipped"
  exit 77
fi
flags=()
while IFS= read -r line; do
  # /usr/include and the toolkit's include directory are clang's own system directories (the second
  # through --cuda-path): named with -I they would come before its CUDA wrapper headers.
  [[ -n $line && $line != -I && $line != -D && $line != -I/usr/include && $line != "-I$cuda/include" ]] && flags+=("$line")
done <"$flags_file"
# Under -nocudalib clang 19 does not tell its device side the toolkit's version and then expects the
# launch API of CUDA before 9.2 (cudaConfigureCall): the version is given by hand, as the newest
# clang 19 knows.
common=(-x cuda -std=c++20 --cuda-path="$cuda" --cuda-gpu-arch=sm_90 -nocudalib -Xclang -target-sdk-version=12.5 -fsyntax-only
        -Wno-unknown-cuda-version -Wno-deprecated-declarations -isystem "$shim" "${flags[@]}")
# CUDA 13 keeps Thrust and CUB under include/cccl, which nvcc searches by itself.
[[ -d $cuda/include/cccl ]] && common+=(-isystem "$cuda/include/cccl")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# One file's parse into $2: "ok" or "failed" on the first line, what clang said after it.
check() {
  local file=$1 log=$2 source=$1 sides=() out status
  if [[ $file == *.cuh ]]; then
    # A header on its own, host side: everything it uses must come from its own includes. Its device
    # code is read when the sources, which include every header, are (both sides).
    source=${log%.log}-$(basename "$file").cu
    echo "#include \"$file\"" >"$source"
    sides=(--cuda-host-only)
  fi
  out=$("$clang" "${common[@]}" "${sides[@]}" "$source" 2>&1)
  status=$?
  if [[ $status -ne 0 && $out == *"frontend command failed with exit code 1"[3-9][0-9]* ]]; then
    # clang itself crashed (a signal), which says nothing about the code: once more.
    out=$("$clang" "${common[@]}" "${sides[@]}" "$source" 2>&1)
    status=$?
  fi
  { [[ $status -eq 0 ]] && echo ok || echo failed; echo "$out"; } >"$log"
}
# The files are independent: CLANG_SYNTAX_PARALLEL at once (default 1: under `ctest -j` the test holds
# one slot and runs beside the others instead of alone at the end; each parse is one thread and a few
# hundred MiB).
parallel=${CLANG_SYNTAX_PARALLEL:-1}
index=0
for file in "$@"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n; done
  check "$file" "$work/$(printf '%04d' "$index").log" &
  index=$((index + 1))
done
wait
failed=0 checked=0
index=0
for file in "$@"; do
  log=$work/$(printf '%04d' "$index").log
  index=$((index + 1))
  checked=$((checked + 1))
  if [[ $(head -1 "$log") != ok ]]; then
    echo "clang_syntax: $file does not parse:"
    tail -n +2 "$log" | grep -E "error|note: in instantiation|frontend command failed" | head -40
    failed=$((failed + 1))
  fi
done
echo "clang_syntax: $checked files, $failed failed ($("$clang" --version | head -1))"
[[ $failed -eq 0 ]]
