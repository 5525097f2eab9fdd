#!/usr/bin/env bash
# Tests of the Rust binding and the Rust example. scripts/test.sh runs it from the repository root as
# `bash bindings/rust/test.sh`, after installing the library into build/prefix with PKG_CONFIG_PATH and
# LD_LIBRARY_PATH pointing there. Steps: cargo fmt --check, cargo clippy, cargo test --locked (the
# header check of peft-c-sys, the peft-c tests and doctests), cargo doc, the README snippet check,
# then build and run examples/rust on the fixtures and compare its merged model byte for byte with
# `peftc merge`. (scripts/test.sh runs bindings/rust/package.sh, the packaging test, as a step of its own.)
# Exits nonzero if any step fails.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

cargo=$(command -v cargo || true)
if [ -z "$cargo" ] && [ -x "$HOME/.cargo/bin/cargo" ]; then cargo=$HOME/.cargo/bin/cargo; fi
if [ -z "$cargo" ]; then
  echo "bindings/rust/test.sh: no Rust toolchain (looked for cargo on PATH and ~/.cargo/bin/cargo)" >&2
  exit 1
fi
export PATH=$(dirname "$cargo"):$PATH
# Build output stays outside the repository.
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/peft_c/cargo-target}
export PEFT_TEST_DATA=${PEFT_TEST_DATA:-$root/tests/fixtures}
peftc=${PEFTC:-$root/build/peftc}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if ! pkg-config --exists peft_c; then
  echo "bindings/rust/test.sh: pkg-config does not find peft_c (PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-})" >&2
  exit 1
fi
# peft-c-sys links through pkg-config (and copes with a .pc file whose prefix is not where it was
# installed); the tests and the example load the library from the .pc file's folder at run time.
libdir=$(cd "$(pkg-config --variable=pcfiledir peft_c)/.." && pwd)
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

failures=()
step() {  # step NAME CMD...: runs CMD, records a failure, continues
  local name=$1; shift
  echo "-- rust: $name"
  if ! "$@"; then
    echo "-- rust: $name: FAILED"
    failures+=("$name")
  fi
}

in_workspace() { (cd "$root/bindings/rust" && "$@"); }

# cargo test, printing the totals and, on failure, the failing tests.
cargo_test() {
  local log=$work/test.log
  in_workspace "$cargo" test --locked --workspace --no-fail-fast >"$log" 2>&1
  local rc=$?
  awk '/^test result:/ {p+=$4; f+=$6; i+=$8} END {printf "   tests: %d passed, %d failed, %d ignored\n", p, f, i}' "$log"
  if [ $rc -ne 0 ]; then
    grep -E -- '^test .* FAILED|panicked at|^error|^failures:' "$log" | head -60
    tail -30 "$log"
  fi
  return $rc
}

# The README's example snippets must be examples/rust/src/main.rs and the quickstart, verbatim.
readme_snippet() {
  local file
  for file in examples/rust/src/main.rs examples/rust/src/bin/quickstart.rs; do
    awk -v marker="<!-- example: $file -->" '$0 == marker {f=1; next} f && /^```rust$/{g=1; next} g && /^```$/{exit} g' \
      "$root/bindings/rust/README.md" > "$work/snippet.rs"
    if ! diff -u "$root/$file" "$work/snippet.rs"; then
      echo "bindings/rust/README.md's snippet differs from $file"
      return 1
    fi
  done
}

# Runs the example on the fixtures; its merged model must be byte-identical to what peftc writes.
example() {
  in_workspace "$cargo" build --locked -q -p peft-c-example || return 1
  local base=tests/fixtures/models/llama adapter=tests/fixtures/adapters/llama_lora
  (cd "$root" && "$CARGO_TARGET_DIR/debug/peft-c-example" "$base" "$adapter" "$work/example") || return 1
  if [ ! -x "$peftc" ]; then
    echo "no peftc at $peftc (set PEFTC) to compare the example's merge with"
    return 1
  fi
  (cd "$root" && "$peftc" merge --base "$base" --adapter "$adapter" --out "$work/peftc") || return 1
  local want got f
  want=$(cd "$work/peftc" && ls ./*.safetensors | sort)
  got=$(cd "$work/example/merged" && ls ./*.safetensors | sort)
  if [ -z "$want" ] || [ "$want" != "$got" ]; then
    echo "safetensors files differ: peftc wrote [$want], the example [$got]"
    return 1
  fi
  for f in $want; do
    cmp "$work/peftc/$f" "$work/example/merged/$f" || return 1
  done
  for f in adapter/adapter_model.safetensors adapter/adapter_config.json; do
    [ -s "$work/example/$f" ] || { echo "the example did not write $f"; return 1; }
  done
  echo "   the example's merge is byte-identical to peftc merge ($(echo "$want" | wc -w) safetensors file(s))"
}

echo "-- rust: $("$cargo" --version), peft_c $(pkg-config --modversion peft_c) from $libdir"
# rustfmt and clippy are rustup components a minimal toolchain may lack: then say so and go on.
if "$cargo" fmt --version >/dev/null 2>&1; then
  step "cargo fmt --check" in_workspace "$cargo" fmt --all --check
else
  echo "-- rust: cargo fmt: skipped (no rustfmt component)"
fi
if "$cargo" clippy --version >/dev/null 2>&1; then
  step "cargo clippy" in_workspace "$cargo" clippy --locked --workspace --all-targets -q -- -D warnings
else
  echo "-- rust: cargo clippy: skipped (no clippy component)"
fi
step "cargo test" cargo_test
step "cargo doc (warnings are errors)" env RUSTDOCFLAGS="-D warnings" bash -c \
  'cd "$1" && "$2" doc --locked --no-deps --workspace -q' _ "$root/bindings/rust" "$cargo"
step "README snippet" readme_snippet
step "examples/rust" example

if [ ${#failures[@]} -gt 0 ]; then
  printf 'rust: failed: %s\n' "${failures[@]}"
  exit 1
fi
echo "-- rust: every step passed"
