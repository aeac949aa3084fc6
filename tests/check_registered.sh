#!/usr/bin/env bash
# check_registered.sh BINARY SUITE...: every top-level suite or case of a Boost.Test binary is one of
# the SUITES its CMake registers as ctest tests (tests/CMakeLists.txt, distribute_add_test_binary), so
# no case is compiled and never run. Exits 77 (skipped) where the binary lists nothing and itself
# exits 77 (a GPU binary on a machine without a GPU).
set -u
binary=$1
shift
listing=$("$binary" --list_content 2>&1)
rc=$?
top=$(printf '%s\n' "$listing" | grep -E '^[A-Za-z_][A-Za-z0-9_<>:, ]*\*?$' | sed 's/\*$//')
if [ -z "$top" ]; then
  [ "$rc" -eq 77 ] && { echo "$(basename "$binary") lists nothing here (exit 77): skipped"; exit 77; }
  echo "$(basename "$binary") --list_content listed nothing (exit $rc):"
  printf '%s\n' "$listing" | head -5
  exit 1
fi
missing=0
while IFS= read -r name; do
  found=0
  for suite in "$@"; do [ "$suite" = "$name" ] && found=1 && break; done
  if [ "$found" -eq 0 ]; then
    echo "$(basename "$binary"): '$name' is not in the SUITES of its distribute_add_test_binary: ctest never runs it"
    missing=1
  fi
done <<<"$top"
[ "$missing" -eq 0 ] && echo "$(basename "$binary"): $(printf '%s\n' "$top" | wc -l) suites and cases, each registered"
exit "$missing"
