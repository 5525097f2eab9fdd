#!/usr/bin/env bash
# C and C++ consumers of peft_c (run by scripts/test.sh): a project that takes the source tree with
# add_subdirectory and with FetchContent, and `make dist`'s tarball unpacked elsewhere, used through
# find_package and pkg-config. Each builds examples/c/example.c (shared and static library) and runs it.
# Build folders sit next to build/ (build-consumer-*), so that ccache serves the library's objects.
set -euo pipefail
unset PEFT_C_DATA_DIR
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
. "$ROOT/tests/packaging/check_example.sh"
jobs=${JOBS:-$(nproc)}
export CCACHE_DIR=${CCACHE_DIR:-$HOME/.cache/peft_c/ccache}
export CCACHE_BASEDIR=$ROOT CCACHE_NOHASHDIR=1
peftc=$ROOT/build/peftc
launchers=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

consumer() {  # consumer USE BUILD_DIR EXTRA_CMAKE_ARGS...: configures, builds and runs the consumer
  local use=$1 dir=$2; shift 2
  echo "== $use"
  cmake -S "$ROOT/tests/packaging/consumer" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DPEFT_C_USE="$use" -DEXAMPLE_C="$ROOT/examples/c/example.c" "${launchers[@]}" "$@" >/dev/null
  ninja -C "$dir" -j"$jobs" >/dev/null
  check_example "$peftc" "$dir/example_shared"
  check_example "$peftc" "$dir/example_static"
  if readelf -d "$dir/example_static" | grep -q 'libpeft_c'; then
    echo "example_static links libpeft_c dynamically"; return 1
  fi
}

# The source tree as a subproject (the same flags as build/, so that ccache has every object).
consumer subdirectory "$ROOT/build-consumer-subdir" -DPEFT_C_SOURCE="$ROOT" -DPEFT_WERROR=ON
consumer fetchcontent "$ROOT/build-consumer-fetch" -DPEFT_C_SOURCE="$ROOT" -DPEFT_WERROR=ON

# make dist, unpacked into a temporary folder: find_package and pkg-config from there.
make -C "$ROOT" --no-print-directory dist >/dev/null
version=$(sed -n 's/^project(peft_c VERSION \([0-9.]*\).*/\1/p' "$ROOT/CMakeLists.txt")
tarball=$ROOT/build/dist/peft_c-$version-linux-$(uname -m).tar.gz
[ -f "$tarball" ] || { echo "make dist did not write $tarball"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
tar -xzf "$tarball" -C "$tmp"
prefix=$tmp/peft_c-$version-linux-$(uname -m)
for f in include/peft_c.h lib/libpeft_c.so lib/libpeft_c.a lib/cmake/peft_c/peft_cConfig.cmake \
    lib/pkgconfig/peft_c.pc bin/peftc share/peft_c/arch/llama.json share/doc/peft_c/README.md; do
  [ -e "$prefix/$f" ] || { echo "the tarball lacks $f"; exit 1; }
done
echo "== $(basename "$tarball"): $(tar -tzf "$tarball" | wc -l) entries"
# Its own peftc runs from the unpacked folder, and looks for the tables there first.
"$prefix/bin/peftc" --version
"$prefix/bin/peftc" translate --arch llama model.layers.0.self_attn.q_proj.weight >/dev/null
looked=$("$prefix/bin/peftc" translate --arch no_such_family x 2>&1 || true)
case $looked in
  *"(looked for $prefix/share/peft_c/arch/no_such_family.json,"*) ;;
  *) echo "the unpacked library does not look for its tables in $prefix/share/peft_c: $looked"; exit 1 ;;
esac
consumer find_package "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix"
echo "== pkg-config"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
[ "$(pkg-config --variable=prefix peft_c)" -ef "$prefix" ] || { echo "peft_c.pc: prefix is not relocated"; exit 1; }
# shellcheck disable=SC2046
cc -std=c99 -Wall -Wextra -pedantic -Werror -o "$tmp/example_pc" "$ROOT/examples/c/example.c" \
  $(pkg-config --cflags --libs peft_c) -Wl,-rpath,"$(pkg-config --variable=libdir peft_c)"
check_example "$prefix/bin/peftc" "$tmp/example_pc"
# shellcheck disable=SC2046
cc -std=c99 -Wall -Wextra -pedantic -Werror -o "$tmp/example_pc_static" "$ROOT/examples/c/example.c" \
  $(pkg-config --cflags peft_c) "$prefix/lib/libpeft_c.a" $(pkg-config --libs-only-l --static peft_c | sed 's/-lpeft_c//')
check_example "$prefix/bin/peftc" "$tmp/example_pc_static"
echo "C/C++ consumers: ok"
