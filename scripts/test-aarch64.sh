#!/usr/bin/env bash
# Cross-builds peft_c for aarch64 (Debian's g++-aarch64-linux-gnu, cmake/aarch64-linux-gnu.cmake) and
# runs its tests under qemu-user: the unit tests (doctest), the C99 tests of the public API, the
# exported-symbol check and the ABI check. Not run here: the CLI tests and the examples (shell
# scripts that would start aarch64 programs without the emulator) and everything that needs Python
# packages or other languages. On aarch64 the library has one kernel table, "portable" (NEON through
# the compiler's vectoriser).
#
# Installs what it needs (the arm64 architecture in dpkg, the cross compilers, qemu-user and the
# arm64 OpenBLAS and PCRE2), builds into build-aarch64/ and exits 0 only when every test passed.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build=${PEFT_AARCH64_BUILD:-build-aarch64}

SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
packages=(g++-aarch64-linux-gnu qemu-user file libopenblas-dev:arm64 libpcre2-dev:arm64)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "test-aarch64: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  dpkg --print-foreign-architectures | grep -qx arm64 || $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update -q >&2
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPEFT_WERROR=ON \
  -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64-linux-gnu.cmake" "${launcher[@]}" >/dev/null
ninja -C "$build" -j"$(nproc)" peft_c peftc peft_unit $(cd tests/capi && ls -- *.c | sed 's/\.c$//')

file -L "$build/libpeft_c.so" | grep -q 'ARM aarch64' || { echo "test-aarch64: $build/libpeft_c.so is not an aarch64 library"; exit 1; }
echo "test-aarch64: $(qemu-aarch64 --version | head -1)"
# Tests that start target programs through CTest's emulator, and the checks of the library file.
ctest --test-dir "$build" --output-on-failure -j"$(nproc)" -R '^(unit|test_[a-z_]+|exported_symbols|abi)$'
