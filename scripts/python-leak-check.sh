#!/usr/bin/env bash
# Runs the Python binding's tests (bindings/python/tests) against the AddressSanitizer build of the
# library with LeakSanitizer on, and fails if any leak report has a frame in libpeft_c: memory the
# library allocated that nothing freed (a library leak, or a binding that forgets a *_free).
#
#   scripts/python-leak-check.sh [ASAN_BUILD_DIR]     (default: build-asan in the repository)
#
# The build folder must hold libpeft_c.so built with -DPEFT_SANITIZE=ON (ninja -C build-asan peft_c).
# The interpreter is the venv's python from scripts/python-env.sh. Python runs with PYTHONMALLOC=malloc
# and the library's libasan preloaded, so every allocation is tracked. CPython does not free everything
# at exit, so leak reports without a libpeft_c frame are only counted and printed as information.
# Any other sanitizer report (a memory error, undefined behaviour) aborts the process and fails
# the check, as does a failing test. Reports go to a temporary folder; the library's are printed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-$root/build-asan}
case $build in /*) ;; *) build=$PWD/$build ;; esac
lib=$build/libpeft_c.so

die() { echo "python-leak-check: $*" >&2; exit 1; }
[ -f "$lib" ] || die "no $lib (build it: cmake -S . -B build-asan -DPEFT_SANITIZE=ON ... && ninja -C build-asan peft_c)"

# The AddressSanitizer runtime the library links (ldd's answer): GCC's libasan, or clang's shared
# runtime (CMakeLists.txt links it with -shared-libsan); else GCC's.
linked=$(ldd "$lib")  # read whole: an awk that stops early would make ldd fail under pipefail
libasan=$(awk '$1 ~ /^(libasan\.so|libclang_rt\.asan)/ {print $3; exit}' <<<"$linked")
[ -n "$libasan" ] || die "$lib does not link an AddressSanitizer runtime: not a PEFT_SANITIZE=ON build"
[ -f "$libasan" ] || libasan=$(gcc -print-file-name=libasan.so)
[ -f "$libasan" ] || die "cannot find libasan.so"
# libstdc++ is preloaded too: python does not link it, and ASan's __cxa_throw interceptor finds the
# real function only if libstdc++ is loaded when ASan starts (else the first C++ throw aborts in
# "CHECK failed: ... real___cxa_throw").
libstdcxx=$(awk '$1 ~ /^libstdc\+\+\.so/ {print $3; exit}' <<<"$linked")
[ -f "$libstdcxx" ] || libstdcxx=$(g++ -print-file-name=libstdc++.so)

venv=$("$root/scripts/python-env.sh")
py=$venv/bin/python

# PEFT_LEAK_LOGS=DIR keeps the sanitizer logs in DIR (emptied first) instead of a temporary folder.
if [ -n "${PEFT_LEAK_LOGS:-}" ]; then
  logs=$PEFT_LEAK_LOGS
  mkdir -p "$logs" && rm -f "$logs"/asan.* "$logs"/ubsan.* "$logs"/ours.txt "$logs"/errors.txt
else
  logs=$(mktemp -d)
  trap 'rm -rf "$logs"' EXIT
fi

tests=$root/bindings/python/tests
# Tests left out under ASan, as --deselect NODEID with a comment saying why. None at present: the
# tests that import torch, transformers and peft run under ASan too (about 2 minutes in all).
deselect=()

# exitcode=0: leaks do not change exit codes (CPython's own leaks would fail every subprocess a test
# starts, and pytest itself); they are judged from the logs below. abort_on_error=1: any other report
# aborts the process. Frames name their module (%m) so the library's frames can be told apart even
# when they are symbolized to source lines. The options reach the tests' subprocesses too.
asan_options="detect_leaks=1:exitcode=0:abort_on_error=1:verify_asan_link_order=0"
asan_options+=":log_path=$logs/asan:stack_trace_format='    #%n %p %F %L [%m]'"
# clang's runtime symbolizes through an llvm-symbolizer process, which keeps the standard error of
# the process it serves: a compiler that a test starts (ctypes.util.find_library runs gcc) then never
# closes its output pipe, and the test hangs. Its reports keep module and offset ([%m] above).
case $libasan in *libclang_rt*) asan_options+=":symbolize=0" ;; esac

echo "python-leak-check: $lib with $libasan, $("$py" --version)"
start=$(date +%s)
rc=0
(cd "$root" && env LD_PRELOAD="$libasan $libstdcxx" ASAN_OPTIONS="$asan_options" \
    UBSAN_OPTIONS="print_stacktrace=1:log_path=$logs/ubsan" PYTHONMALLOC=malloc PEFT_C_LIB="$lib" \
    "$py" -m pytest -q -rs -p no:cacheprovider --rootdir "$tests" "$tests" "${deselect[@]}") || rc=$?
echo "python-leak-check: pytest exited with $rc after $(( $(date +%s) - start )) s"

# Split the logs into reports: a leak report runs from "Direct leak"/"Indirect leak" to the next
# blank line. Reports with a frame in libpeft_c go to ours.txt; the others are only counted.
shopt -s nullglob
files=("$logs"/asan.* "$logs"/ubsan.*)
read -r n_ours n_other n_errors < <(awk -v ours_file="$logs/ours.txt" -v errors_file="$logs/errors.txt" '
  function close_report() {
    if (ours) { n_ours++; printf "%s\n", rep >> ours_file } else n_other++
    inrep = 0
  }
  FNR == 1 && inrep { close_report() }
  /^(Direct|Indirect) leak of/ { if (inrep) close_report(); inrep = 1; rep = FILENAME ":\n" $0 "\n"; ours = 0; next }
  inrep && /^[[:space:]]*$/ { close_report(); next }
  inrep { rep = rep $0 "\n"; if ($0 ~ /^[[:space:]]*#[0-9]+ / && index($0, "libpeft_c")) ours = 1; next }
  /ERROR: LeakSanitizer: detected memory leaks/ { next }
  /ERROR: [A-Za-z]+Sanitizer|Sanitizer: CHECK failed|runtime error:/ { n_errors++; print FILENAME ": " $0 >> errors_file }
  END { if (inrep) close_report(); printf "%d %d %d\n", n_ours + 0, n_other + 0, n_errors + 0 }
' /dev/null "${files[@]}")

echo "python-leak-check: ${#files[@]} sanitizer log(s) (one per process that reported)"
echo "python-leak-check: $n_other leak report(s) without a libpeft_c frame (the interpreter's, not judged)"
status=0
if [ "$n_errors" -gt 0 ]; then
  echo "python-leak-check: $n_errors sanitizer error report(s):"
  cat "$logs/errors.txt"
  for f in $(cut -d: -f1 "$logs/errors.txt" | sort -u); do echo "== $f"; cat "$f"; done
  status=1
fi
if [ "$n_ours" -gt 0 ]; then
  echo "python-leak-check: $n_ours leak report(s) with a libpeft_c frame:"
  cat "$logs/ours.txt"
  status=1
else
  echo "python-leak-check: no leak report has a libpeft_c frame"
fi
if [ "$rc" -ne 0 ]; then
  echo "python-leak-check: the tests failed (pytest exit code $rc)"
  status=1
fi
[ "$status" -eq 0 ] && echo "python-leak-check: passed"
exit "$status"
