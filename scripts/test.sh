#!/usr/bin/env bash
# Builds peft_c and runs every test: unit and C API tests, CLI tests, Doxygen, interop tests against the
# real Python packages, the sanitizer build, a bounded fuzzing run, and the language bindings.
# Installs what it needs first (Debian packages, a Python virtual environment under ~/.cache).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
fuzz_seconds=${PEFT_FUZZ_SECONDS:-60}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/peft_c/ccache}
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1   # a fresh clone elsewhere reuses the cache
# Toolchains the machine brings outside the system PATH (Go, Rust through rustup).
export PATH=$PATH:/usr/local/go/bin:$HOME/.cargo/bin

# Each step's wall time, printed again at the end with the total (a step lasts until the next begins).
timings=()
step_name="" step_start=0
step() {
  [ -n "$step_name" ] && timings+=("$(printf '%6d s  %s' $((SECONDS - step_start)) "$step_name")")
  step_name=$*; step_start=$SECONDS
  printf '\n==== %s (at %d s) ====\n' "$*" "$SECONDS"
}
failures=()
run() {  # run NAME CMD...: records a failure and continues, so one report lists everything that failed
  local name=$1; shift
  step "$name"
  local start=$SECONDS
  if "$@"; then echo "---- $name: ok ($((SECONDS - start)) s)"; else echo "---- $name: FAILED"; failures+=("$name"); fi
}

step "dependencies"
scripts/install-deps.sh
# The Python environment (pinned reference packages, under ~/.cache; a download of several GB the first
# time, mostly network and disk) installs beside the release build.
mkdir -p build
scripts/python-env.sh >build/venv-path 2>build/venv.log &
venv_install=$!

step "build (release; the Python environment installs beside it)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPEFT_WERROR=ON \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
ninja -C build -j"$jobs"
rm -rf build/prefix && cmake --install build --prefix "$root/build/prefix" >/dev/null
if ! wait "$venv_install"; then cat build/venv.log; echo "the Python environment failed"; exit 1; fi
tail -n 2 build/venv.log
venv=$(cat build/venv-path)
py=$venv/bin/python

step "llama.cpp reference tools"
# llama.cpp's own tools and converters, the references of the GGUF interop tests: built once per machine
# into ~/.cache/peft_c/llama (scripts/llama-cpp.sh), then instant. Exported here, so that ctest and pytest
# both see PEFT_LLAMA_CPP_BIN / _SRC / _PYDEPS and PEFT_GGUF_PY. Those tests skip without them, so a failed
# build is a failed step.
if llama_env=$(scripts/llama-cpp.sh --env); then
  eval "$llama_env"
  # The release build was configured before these paths existed: configured again, it adds the test
  # drivers that link llama.cpp (tests/interop/CMakeLists.txt), which the interop tests and ctest's
  # ggml_quants would otherwise skip.
  cmake -S . -B build >/dev/null
  ninja -C build -j"$jobs"
  if [ ! -x build/tests/interop/llama_cvec_driver ]; then
    echo "---- llama.cpp test drivers: not built"; failures+=("llama.cpp test drivers")
  fi
else
  echo "---- llama.cpp reference tools: FAILED"; failures+=("llama.cpp reference tools")
fi

export PEFTC=$root/build/peftc
export PEFT_C_LIB=$root/build/libpeft_c.so
export PEFT_CORPUS=${PEFT_CORPUS:-$root/../shared/corpus/real}
export PKG_CONFIG_PATH=$root/build/prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
export LD_LIBRARY_PATH=$root/build/prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

# The kernel table a process uses is the highest the CPU supports unless PEFT_C_KERNELS names a lower
# one (include/peft_c.h, peft_kernels). The first ctest runs the highest; then the unit and C API
# tests run again on each lower table that the machine has.
kernels_of() { PEFT_C_KERNELS=$1 build/peftc --version | sed -n 's/.*(kernels: \(.*\))$/\1/p'; }
top=$(kernels_of auto)
run "ctest (release, kernels $top)" ctest --test-dir build --output-on-failure -j"$jobs"
tables_run=("$top")
for table in portable avx2 avx512; do
  [ "$table" = "$top" ] && break
  if [ "$(kernels_of "$table")" = "$table" ]; then
    run "unit and C API tests (kernels $table)" env PEFT_C_KERNELS=$table \
      ctest --test-dir build --output-on-failure -j"$jobs" -R '^(unit|test_[a-z_]+)$'
    tables_run+=("$table")
  fi
done
echo "kernel tables tested on this machine: ${tables_run[*]}"

run "aarch64 (cross-built, qemu-user)" scripts/test-aarch64.sh

# The ThreadSanitizer build runs beside the Python and binding tests, which leave one core mostly
# idle (on a cold 2-core machine: its 288 s left the serial path and the interop tests took 140 s
# longer); its output is shown at its step below.
# Sanitizer builds keep line tables only (-g1), which is enough for symbolized reports.
mkdir -p build-tsan
( cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1" \
    -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1" -DPEFT_TSAN=ON -DCMAKE_C_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null && ninja -C build-tsan -j"$jobs" peft_unit
) >build-tsan/build.log 2>&1 &
tsan_build=$!
trap 'pkill -P "$tsan_build" 2>/dev/null || true; kill "$tsan_build" 2>/dev/null || true' EXIT  # a step that stops the script stops the build

# Each suite runs on its own: pytest would take bindings/python/pyproject.toml as the config of both.
for d in tests/interop bindings/python/tests; do
  [ -d "$d" ] && run "pytest $d" "$py" -m pytest -q -p no:cacheprovider --rootdir "$d" "$d"
done

for t in bindings/*/test.sh examples/test.sh; do
  [ -f "$t" ] && run "$t" bash "$t"
done
# The native packages without an installed library (each compiles the C++ once per change of the
# sources; the caches under ~/.cache/peft_c keep it): Rust: both crates packaged, the packaged
# peft-c-sys built with `bundled` and run; the Go wrappers (and the Rust crate's copy) of src/ in
# step; Go: a fresh module built with -tags peftc_bundled and run. (C#: the NuGet package is a step of
# bindings/csharp/test.sh.)
run "Rust: cargo package + bundled build" bash bindings/rust/package.sh
run "native sources in sync" scripts/sync-native-sources.sh --check   # after package.sh refreshed the Rust copy
run "Go: bundled build (fresh module)" bash bindings/go/bundled-test.sh

# Packaging: projects that use the source tree (add_subdirectory, FetchContent) and `make dist`'s tarball
# (find_package, pkg-config); the Python wheel built, repaired and installed into a fresh venv.
run "C/C++ consumers and make dist" env -u LD_LIBRARY_PATH -u PEFT_C_LIB JOBS="$jobs" bash tests/packaging/consumers.sh
run "Python wheel" env PYTHON="$py" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" bash tests/packaging/wheel.sh

# The sanitizer build is also the clang build: the whole tree with -Werror under clang, and the whole
# CTest suite on clang's code (GCC's is the release build above). One build where there were two: on a
# cold 2-core machine a clang release build took 297 s and GCC's sanitizer build 790 s; clang's
# sanitizer build, with the tests' own code unoptimised (tests/CMakeLists.txt), 341 s from an empty
# cache. clang's UndefinedBehaviorSanitizer also checks float-to-integer conversions, which GCC's
# does not.
step "build (clang, AddressSanitizer + UndefinedBehaviorSanitizer)"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS=-O1 -DCMAKE_C_FLAGS=-O1 \
  -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DCMAKE_C_FLAGS_DEBUG=-g1 -DPEFT_SANITIZE=ON -DPEFT_WERROR=ON \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
ninja -C build-asan -j"$jobs"
run "ctest (clang, sanitizers)" env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -E 'doxygen|exported_symbols'
# The Python binding's tests on the sanitizer build: no leak report may have a frame in libpeft_c.
run "python leak check (LeakSanitizer)" scripts/python-leak-check.sh build-asan

step "build (ThreadSanitizer, started beside the Python tests)"
tsan_ok=true
wait "$tsan_build" || tsan_ok=false
tail -n 30 build-tsan/build.log
# The cases tests/CMakeLists.txt lists for it: the registry's concurrency test (threads acquiring,
# releasing, replacing, trimming and re-budgeting at once) and its soak test, the worker pool, and
# unmerged apply from many threads; ThreadSanitizer exits nonzero on any report.
if $tsan_ok; then
  run "registry, worker pool and apply threads (ThreadSanitizer)" \
    ctest --test-dir build-tsan --output-on-failure -R '^unit$'
else
  echo "---- build (ThreadSanitizer): FAILED"; failures+=("build (ThreadSanitizer)")
fi

if [ -f tests/fuzz/run.sh ]; then
  step "build (libFuzzer)"
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DPEFT_FUZZ=ON -DPEFT_BUILD_TESTS=OFF -DCMAKE_C_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
  # Only the fuzz programs: they compile the parser sources themselves with the fuzzer's instrumentation.
  ninja -C build-fuzz -j"$jobs" header_fuzzer index_fuzzer adapter_config_fuzzer arch_table_fuzzer gguf_header_fuzzer \
    gguf_lora_fuzzer bnb_state_fuzzer header_check
  run "fuzzing for ${fuzz_seconds}s" bash tests/fuzz/run.sh build-fuzz "$fuzz_seconds"
fi

step "summary"
printf '%s\n' "${timings[@]}"
printf '%6d s  total\n' "$SECONDS"
if [ ${#failures[@]} -gt 0 ]; then
  printf 'failed: %s\n' "${failures[@]}"
  exit 1
fi
echo "every test step passed"
