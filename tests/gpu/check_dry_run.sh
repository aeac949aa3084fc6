#!/usr/bin/env bash
# The device check (scripts/gpu/) run dry, without a GPU:
#   check_dry_run.sh summary SOURCE_DIR
#     check.sh's reading of canned logs (tests/gpu/check_logs, taken from a run on an H100): the
#     summary expected_summary.txt holds, and exit 1, since some of those checks failed; then the
#     same logs with every check passed: exit 0 and no error lines.
#   check_dry_run.sh pack SOURCE_DIR BUILD_DIR
#     pack.sh over a CUDA build: the archive holds the GPU test binaries and the libraries, and
#     device-check.sh is check.sh. Exit 77 where BUILD_DIR has no GPU binaries (pack.sh's own 77).
set -uo pipefail
mode=$1 source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "check_dry_run: $*"; exit 1; }
case $mode in
  summary)
    logs=$source/tests/gpu/check_logs
    out=$(bash "$source/scripts/gpu/check.sh" --summarize "$logs")
    status=$?
    echo "$out"
    [[ $status -eq 1 ]] || fail "check.sh --summarize exited $status over logs with failures, not 1"
    diff <(echo "$out") "$logs/expected_summary.txt" || fail "the summary differs from expected_summary.txt (above)"
    mkdir "$work/passed"
    for name in gpu_interop suite_host suite_device suite_collectives suite_strategy suite_failure suite_hardening \
                suite_layers suite_cudnn suite_passes gpu_cyclegan; do
      printf '*** No errors detected\nrc=0\n' >"$work/passed/$name.log"
    done
    out=$(bash "$source/scripts/gpu/check.sh" --summarize "$work/passed")
    status=$?
    echo "$out"
    [[ $status -eq 0 ]] || fail "check.sh --summarize exited $status over logs of passed checks, not 0"
    [[ $(grep -c '^gpu\.' <<<"$out") -eq 11 ]] || fail "not one line per check (11)"
    ! grep -q '^  ' <<<"$out" || fail "error lines in the summary of passed checks"
    echo "check_dry_run: the summary reads failures, skips and passes as they were"
    ;;
  pack)
    build=$3
    (cd "$source" && bash scripts/gpu/pack.sh --out "$work/pack" --no-data --partial "$build")
    status=$?
    [[ $status -eq 77 ]] && exit 77
    [[ $status -eq 0 ]] || fail "pack.sh exited $status"
    listing=$(tar -tzf "$work/pack/pack.tar.gz") || fail "pack.tar.gz is not a gzip tar archive"
    for want in build/tests/gpu/distribute_gpu_tests libs/; do
      grep -q "^$want" <<<"$listing" || fail "pack.tar.gz lacks $want"
    done
    grep -q '^libs/libboost_unit_test_framework' <<<"$listing" || fail "pack.tar.gz lacks Boost.Test's library"
    cmp -s "$work/pack/device-check.sh" "$source/scripts/gpu/check.sh" || fail "device-check.sh is not scripts/gpu/check.sh"
    echo "check_dry_run: pack.sh packed $(grep -c . <<<"$listing") files; device-check.sh is check.sh"
    ;;
  *) fail "usage: check_dry_run.sh summary SOURCE_DIR | pack SOURCE_DIR BUILD_DIR" ;;
esac
