#!/usr/bin/env bash
# The everyday test loop (`make check`): the release build and its CTest suite (doctest unit tests, the
# C99 tests of the public API, the CLI tests, the exported-symbol, ABI and layer checks, Doxygen). A few
# minutes warm on 2 cores; `make test` runs everything else (other compilers and kernel tables, interop
# against the real Python packages, bindings, packaging, sanitizers, fuzzing).
# Installs the Debian packages it needs first; uses llama.cpp's reference tools when scripts/llama-cpp.sh
# has built them already (the ggml comparison test skips otherwise), and never builds them itself.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/peft_c/ccache}
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
PEFT_WITH_BINDINGS=0 scripts/install-deps.sh
if llama_env=$(scripts/llama-cpp.sh --env --no-build 2>/dev/null); then eval "$llama_env"; fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPEFT_WERROR=ON \
  -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache >/dev/null
ninja -C build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"
echo "make check: passed in $SECONDS s"
