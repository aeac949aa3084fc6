#!/usr/bin/env bash
# Compiles old_names.cpp: it must compile, and warn once per old name with the new name.
#   check_old_names.sh CXX SOURCE FLAGS...
set -uo pipefail
cxx=$1 source=$2
shift 2
out=$("$cxx" -std=c++20 -fsyntax-only "$@" "$source" 2>&1)
status=$?
echo "$out"
[[ $status -eq 0 ]] || { echo "check_old_names: the old names no longer compile"; exit 1; }
for want in "engine_options is now compute_options" "set_engine_options is now set_compute_options"; do
  grep -q "$want" <<<"$out" || { echo "check_old_names: no warning saying \"$want\""; exit 1; }
done
echo "check_old_names: the old names compile, each with a warning naming the new one"
