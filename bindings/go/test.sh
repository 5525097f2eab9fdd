#!/usr/bin/env bash
# Tests of the Go binding and the Go example. scripts/test.sh runs it from the repository root as
# `bash bindings/go/test.sh`, after installing the library into build/prefix with PKG_CONFIG_PATH and
# LD_LIBRARY_PATH pointing there. Steps: gofmt, go vet, go test, go test -race, a run that forces
# garbage collection inside every few calls (-tags debug, PEFTC_TEST_GC=1),
# go test -asan (AddressSanitizer and LeakSanitizer), the README snippet check, then build and run
# examples/go on the fixtures and compare its merged model byte for byte with `peftc merge` (PEFTC,
# default build/peftc).
# Exits nonzero if any step fails.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
peftc=${PEFTC:-$root/build/peftc}

go=$(command -v go || true)
if [ -z "$go" ] && [ -x /usr/local/go/bin/go ]; then go=/usr/local/go/bin/go; fi
if [ -z "$go" ]; then
  echo "bindings/go/test.sh: no Go toolchain (looked for go on PATH and /usr/local/go/bin/go)" >&2
  exit 1
fi

# Go's caches live outside the repository; the binding has no dependencies, so no network is needed.
cache=${XDG_CACHE_HOME:-$HOME/.cache}/peft_c/go
export GOPATH=$cache/gopath GOMODCACHE=$cache/gopath/pkg/mod GOCACHE=$cache/build
export GOFLAGS=-buildvcs=false GOTOOLCHAIN=local GOPROXY=off CGO_ENABLED=1
mkdir -p "$GOPATH" "$GOCACHE"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The binding finds the library with pkg-config. If the installed peft_c.pc names a prefix other
# than the one it was installed into (cmake --install --prefix does not rewrite it), use a copy
# that points at the folder the .pc file is in.
if ! pkg-config --exists peft_c; then
  echo "bindings/go/test.sh: pkg-config does not find peft_c (PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-})" >&2
  exit 1
fi
includedir=$(pkg-config --variable=includedir peft_c)
if [ ! -f "$includedir/peft_c.h" ]; then
  pcdir=$(pkg-config --variable=pcfiledir peft_c)
  prefix=$(cd "$pcdir/../.." && pwd)
  mkdir -p "$work/pkgconfig"
  sed -e "s#^prefix=.*#prefix=$prefix#" -e 's#^exec_prefix=.*#exec_prefix=${prefix}#' \
      -e 's#^libdir=.*#libdir=${prefix}/lib#' -e 's#^includedir=.*#includedir=${prefix}/include#' \
      -e 's#^datadir=.*#datadir=${prefix}/share/peft_c#' "$pcdir/peft_c.pc" > "$work/pkgconfig/peft_c.pc"
  export PKG_CONFIG_PATH=$work/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  echo "note: $pcdir/peft_c.pc points at $includedir, where peft_c.h is not; using prefix $prefix"
fi
libdir=$(pkg-config --variable=libdir peft_c)
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

failures=()
step() {  # step NAME CMD...: runs CMD, records a failure, continues
  local name=$1; shift
  echo "-- go: $name"
  if ! "$@"; then
    echo "-- go: $name: FAILED"
    failures+=("$name")
  fi
}

# gotest LOGNAME ARGS...: go test -v ARGS, printing the counts and, on failure, the failures.
gotest() {
  local log=$work/$1.log; shift
  (cd "$root/bindings/go" && "$go" test -count=1 -v "$@" ./... >"$log" 2>&1)
  local rc=$?
  local pass fail skip
  pass=$(grep -c -- '--- PASS' "$log"); fail=$(grep -c -- '--- FAIL' "$log"); skip=$(grep -c -- '--- SKIP' "$log")
  echo "   tests and subtests: $pass passed, $fail failed, $skip skipped"
  if [ $rc -ne 0 ]; then
    grep -E -- '--- FAIL|_test.go:[0-9]+:|panic:|^FAIL' "$log" | head -60
    tail -20 "$log"
  fi
  return $rc
}

# The forced-GC run: the library collects garbage inside every few calls (build tag "debug") and the
# tests between their calls (PEFTC_TEST_GC=1).
gotest_forced_gc() { (export PEFTC_TEST_GC=1; gotest debug -tags debug); }

gofmt_clean() {
  local files
  files=$("${go%/go}/gofmt" -l "$root/bindings/go" "$root/examples/go" 2>/dev/null || gofmt -l "$root/bindings/go" "$root/examples/go")
  [ -z "$files" ] || { echo "not gofmt-formatted: $files"; return 1; }
}

vet() {
  (cd "$root/bindings/go" && "$go" vet ./... && "$go" vet -tags debug ./...) &&
    (cd "$root/examples/go" && "$go" vet ./...)
}

# The README's example snippets must be examples/go/main.go and the quickstart, verbatim.
readme_snippet() {
  local file
  for file in examples/go/main.go examples/go/quickstart/main.go; do
    awk -v marker="<!-- example: $file -->" '$0 == marker {f=1; next} f && /^```go$/{g=1; next} g && /^```$/{exit} g' \
      "$root/bindings/go/README.md" > "$work/snippet.go"
    if ! diff -u "$root/$file" "$work/snippet.go"; then
      echo "bindings/go/README.md's snippet differs from $file"
      return 1
    fi
  done
}

# Runs the example on the fixtures; its merged model (every safetensors file and config.json) must be
# byte-identical to what `peftc merge` writes from the same base and adapter.
example() {
  local base=tests/fixtures/models/llama adapter=tests/fixtures/adapters/llama_lora
  (cd "$root/examples/go" && "$go" build -o "$work/example" .) || return 1
  (cd "$root" && "$work/example" -base "$base" -adapter "$adapter" -out "$work/example-out") || return 1
  for f in merged/config.json adapter/adapter_model.safetensors adapter/adapter_config.json; do
    [ -s "$work/example-out/$f" ] || { echo "the example did not write $f"; return 1; }
  done
  if [ ! -x "$peftc" ]; then
    echo "no peftc at $peftc (set PEFTC) to compare the example's merge with"
    return 1
  fi
  (cd "$root" && "$peftc" merge --base "$base" --adapter "$adapter" --out "$work/peftc-out" >/dev/null) || return 1
  local expected actual name
  expected=$(cd "$work/peftc-out" && ls -- *.safetensors 2>/dev/null | sort)
  actual=$(cd "$work/example-out/merged" && ls -- *.safetensors 2>/dev/null | sort)
  if [ -z "$expected" ] || [ "$expected" != "$actual" ]; then
    echo "the safetensors files differ: peftc merge wrote [$expected], the Go example [$actual]"
    return 1
  fi
  for name in $expected config.json; do
    cmp -- "$work/peftc-out/$name" "$work/example-out/merged/$name" || return 1
  done
  echo "   the Go example's merge is byte-identical to peftc merge ($(echo "$expected" | wc -w) safetensors file(s) and config.json)"
}

echo "-- go: $("$go" version), peft_c $(pkg-config --modversion peft_c) from $libdir"
step "gofmt" gofmt_clean
step "go vet" vet
step "go test" gotest plain
step "go test -race" gotest race -race
step "go test -tags debug (forced GC)" gotest_forced_gc
# AddressSanitizer, with LeakSanitizer at exit reporting C memory that nothing frees; TestMain also
# waits for every handle's release before exiting.
step "go test -asan (leaks)" gotest asan -asan
step "README snippet" readme_snippet
step "examples/go" example

if [ ${#failures[@]} -gt 0 ]; then
  printf 'go: failed: %s\n' "${failures[@]}"
  exit 1
fi
echo "-- go: every step passed"
