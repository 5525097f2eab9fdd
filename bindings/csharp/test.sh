#!/usr/bin/env bash
# Tests of the C# binding and the C# example, with Debian's mono (mcs + mono; no dotnet SDK, no NuGet).
# scripts/test.sh runs it from the repository root as `bash bindings/csharp/test.sh`, after installing the
# library into build/prefix with PKG_CONFIG_PATH and LD_LIBRARY_PATH pointing there. Steps: compile PeftC.dll
# (warnings are errors), compile and run the tests (bindings/csharp/tests, one exe with the library sources),
# check that the README snippet is examples/csharp/Example.cs, then build and run the example on the fixtures
# and compare its merged model byte for byte with `peftc merge`. Build output goes to
# $PEFT_CSHARP_BUILD (default ~/.cache/peft_c/csharp), never into the repository. Exits nonzero on any failure.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
here=$root/bindings/csharp

for tool in mcs mono pkg-config; do
  if ! command -v "$tool" >/dev/null; then
    echo "bindings/csharp/test.sh: $tool not found (Debian: apt-get install mono-mcs mono-runtime pkg-config)" >&2
    exit 1
  fi
done
if ! pkg-config --exists peft_c; then
  echo "bindings/csharp/test.sh: pkg-config does not find peft_c (PKG_CONFIG_PATH=${PKG_CONFIG_PATH:-})" >&2
  exit 1
fi
# The library is loaded from the .pc file's folder (which copes with a prefix moved after installing).
libdir=$(cd "$(pkg-config --variable=pcfiledir peft_c)/.." && pwd)
export LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PEFT_TEST_DATA=${PEFT_TEST_DATA:-$root/tests/fixtures}
peftc=${PEFTC:-$root/build/peftc}

out=${PEFT_CSHARP_BUILD:-$HOME/.cache/peft_c/csharp}
mkdir -p "$out" || exit 1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

failures=()
step() {  # step NAME CMD...: runs CMD, records a failure, continues
  local name=$1; shift
  echo "-- csharp: $name"
  if ! "$@"; then
    echo "-- csharp: $name: FAILED"
    failures+=("$name")
  fi
}

mcs_flags=(-unsafe -langversion:7.2 -warn:4 -warnaserror -debug -nologo)

build_library() {
  mcs "${mcs_flags[@]}" -target:library -out:"$out/PeftC.dll" -doc:"$out/PeftC.xml" -nowarn:1591 "$here"/src/*.cs &&
    cp "$here/PeftC.dll.config" "$out/PeftC.dll.config"
}

run_tests() {
  mcs "${mcs_flags[@]}" -r:System.Json.dll -out:"$out/PeftC.Tests.exe" "$here"/src/*.cs "$here"/tests/*.cs || return 1
  cp "$here/PeftC.dll.config" "$out/PeftC.Tests.exe.config"
  local log=$work/tests.log
  (cd "$root" && mono --debug "$out/PeftC.Tests.exe") >"$log" 2>&1
  local rc=$?
  grep -E '^(FAIL|SKIP) ' "$log" | head -80
  local summary
  summary=$(tail -1 "$log")
  echo "   tests: $summary"
  if ! [[ "$summary" =~ ^[0-9]+\ passed,\ [0-9]+\ failed$ ]]; then
    echo "   the test program did not finish:"; tail -30 "$log"; return 1
  fi
  return $rc
}

# The README's snippet must be examples/csharp/Example.cs, verbatim.
readme_snippet() {
  awk '/<!-- example: examples\/csharp\/Example.cs -->/{f=1; next} f && /^```csharp$/{g=1; next} g && /^```$/{exit} g' \
    "$here/README.md" > "$work/snippet.cs"
  if ! diff -u "$root/examples/csharp/Example.cs" "$work/snippet.cs"; then
    echo "bindings/csharp/README.md's snippet differs from examples/csharp/Example.cs"
    return 1
  fi
}

# Runs the example on the fixtures; its merged model must be byte-identical to what peftc writes.
example() {
  mcs "${mcs_flags[@]}" -r:"$out/PeftC.dll" -out:"$out/Example.exe" "$root/examples/csharp/Example.cs" || return 1
  local base=tests/fixtures/models/llama adapter=tests/fixtures/adapters/llama_lora
  (cd "$root" && MONO_PATH=$out mono --debug "$out/Example.exe" "$base" "$adapter" "$work/example") || return 1
  if [ ! -x "$peftc" ]; then
    echo "no peftc at $peftc (set PEFTC) to compare the example's merge with"
    return 1
  fi
  (cd "$root" && "$peftc" merge --base "$base" --adapter "$adapter" --out "$work/peftc") >/dev/null || return 1
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

echo "-- csharp: $(mono --version | head -1), peft_c $(pkg-config --modversion peft_c) from $libdir"
step "build PeftC.dll" build_library
step "tests" run_tests
step "README snippet" readme_snippet
step "examples/csharp" example

if [ ${#failures[@]} -gt 0 ]; then
  printf 'csharp: failed: %s\n' "${failures[@]}"
  exit 1
fi
echo "-- csharp: every step passed"
