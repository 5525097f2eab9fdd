#!/usr/bin/env bash
# Runs the header fuzzer for a bounded time over a copy of the committed seed corpus.
#   tests/fuzz/run.sh BUILD_DIR SECONDS
# BUILD_DIR is a build configured with clang and -DPEFT_FUZZ=ON (the fuzzer is built if missing).
# Exits nonzero when the fuzzer finds a crash, a sanitizer report, a timeout or a memory blow-up;
# the reproducer is left in BUILD_DIR/fuzz-artifacts/ and its path printed. Every finding should
# become a seed in tests/fuzz/corpus/header/ and a unit test.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS" >&2
  exit 2
fi
build_dir=$1
seconds=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
fuzzer=$build_dir/tests/fuzz/header_fuzzer

if [[ ! -x $fuzzer ]]; then
  cmake --build "$build_dir" --target header_fuzzer
fi
if [[ ! -d $here/corpus/header ]]; then
  echo "run.sh: missing seed corpus $here/corpus/header" >&2
  exit 1
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/peft-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/corpus" "$build_dir/fuzz-artifacts"
cp "$here"/corpus/header/* "$work/corpus/"

# -timeout: one input taking a second is a hang (headers here are at most a few KB);
# -rss_limit_mb / -malloc_limit_mb: any large allocation is a finding.
status=0
"$fuzzer" "$work/corpus" \
  -dict="$here/header.dict" \
  -max_total_time="$seconds" \
  -max_len=8192 \
  -timeout=1 \
  -rss_limit_mb=1024 \
  -malloc_limit_mb=256 \
  -print_final_stats=1 \
  -artifact_prefix="$build_dir/fuzz-artifacts/" \
  2> "$work/log" || status=$?
grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::average_exec_per_sec|Done [0-9]+ runs)" "$work/log" || true
if [[ $status -ne 0 ]]; then
  tail -n 60 "$work/log" >&2
  echo "run.sh: the fuzzer failed (exit $status); reproducers:" >&2
  ls -1 "$build_dir"/fuzz-artifacts/ >&2 || true
  exit 1
fi
echo "run.sh: no findings in ${seconds}s"
