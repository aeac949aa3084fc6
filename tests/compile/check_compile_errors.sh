#!/usr/bin/env bash
# Compiles SOURCE, whose `// expect-error: TEXT` comments each stand above a line that must give one
# compile error containing TEXT. Passes when the errors are exactly those: each expected text as often
# as it is expected, each reported from the line below its comment, and no other error (so the
# lines that are not marked must compile).
#   check_compile_errors.sh CXX SOURCE FLAGS...
set -uo pipefail
cxx=$1 source=$2
shift 2
out=$("$cxx" -std=c++20 -fsyntax-only "$@" "$source" 2>&1)
echo "$out"
errors=$(grep -E "error:" <<<"$out")
expected=$(grep -c "// expect-error: " "$source")
got=$(grep -c . <<<"$errors")
fail=0
if [[ $got -ne $expected ]]; then
  echo "check_compile_errors: $got errors, $expected expected"
  fail=1
fi
while IFS= read -r want; do
  wanted=$(grep -cF -- "// expect-error: $want" "$source")
  found=$(grep -cF -- "$want" <<<"$errors")
  if [[ $found -ne $wanted ]]; then
    echo "check_compile_errors: \"$want\" in $found errors, expected in $wanted"
    fail=1
  fi
done < <(sed -n 's|.*// expect-error: ||p' "$source" | sort -u)
name=$(basename "$source")
while IFS=: read -r line _; do
  grep -q "$name:$((line + 1)):" <<<"$out" ||
    { echo "check_compile_errors: nothing reported from $name:$((line + 1))"; fail=1; }
done < <(grep -n "// expect-error: " "$source")
[[ $fail -eq 0 ]] && echo "check_compile_errors: the $expected expected errors, each where expected, and no other"
exit $fail
