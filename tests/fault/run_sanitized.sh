#!/usr/bin/env bash
# Runs the writer's fault-injection and streaming tests under AddressSanitizer and
# UndefinedBehaviorSanitizer: the doctest cases "writer*" (injected ENOSPC/EIO at every system call of
# the atomic file, a real 64 KiB tmpfs when mounting is allowed, a child killed with SIGKILL
# mid-write, cancelling and throwing callbacks), the GGUF writer's cases "gguf writer*", the C API
# test of the writer, and the peftc convert CLI tests. The fault tests themselves live in
# tests/unit/test_writer_fault.cpp and test_gguf_writer.cpp, so the ordinary build runs them too.
# usage: tests/fault/run_sanitized.sh [BUILD_DIR]   (default: <repo>/build-sanitize)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build-sanitize}
cmake -S "$root" -B "$build" -G Ninja -DPEFT_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
ninja -C "$build" peft_unit test_write peftc
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$build/tests/peft_unit" -tc='writer*,gguf writer*'
"$build/tests/test_write"
PEFT_TEST_DATA="$root/tests/fixtures" bash "$root/tests/cli/convert_options.sh" "$build/peftc"
PEFT_CORPUS="${PEFT_CORPUS:-$root/../shared/corpus/real}" bash "$root/tests/cli/convert_corpus.sh" "$build/peftc"
echo "sanitized writer tests passed"
