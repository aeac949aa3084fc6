#!/usr/bin/env bash
# Every C++ and CUDA source of the repository is in the style of its .clang-format: clang-format
# would change nothing. The style is clang-format 19's reading of that file (another version formats
# some constructs differently), so only clang-format-19 is used; where it is not installed the test is
# skipped (77). To format a file: clang-format-19 -i FILE.
#
#   check_format.sh CLANG_FORMAT SOURCE_DIR
set -uo pipefail
clang_format=$1 source_dir=$2
if [[ -z $clang_format || ! -x $clang_format ]]; then
  echo "check_format: clang-format 19 is not installed (Debian: apt-get install clang-format-19); skipped"
  exit 77
fi
cd "$source_dir" || exit 1
mapfile -t files < <(find include tests examples benchmarks -type f \( -name '*.hpp' -o -name '*.cpp' -o -name '*.cuh' -o -name '*.cu' \) \
                       -not -path 'tests/fuzz/corpus/*' | sort)
if ! "$clang_format" --dry-run --Werror "${files[@]}" 2>"${TMPDIR:-/tmp}/check_format.$$"; then
  grep -E '^[^ ]+:[0-9]+:[0-9]+: error' "${TMPDIR:-/tmp}/check_format.$$" | cut -d: -f1 | uniq -c |
    awk '{ print "  " $2 " (" $1 " places)" }' | head -50
  echo "check_format: the sources above are not in the style of .clang-format; run: clang-format-19 -i FILE"
  rm -f "${TMPDIR:-/tmp}/check_format.$$"
  exit 1
fi
rm -f "${TMPDIR:-/tmp}/check_format.$$"
echo "check_format: ${#files[@]} sources in the style of .clang-format"
