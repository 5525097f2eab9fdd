#!/usr/bin/env bash
# make dist: a relocatable binary tarball, build/dist/peft_c-<version>-linux-<arch>.tar.gz, holding
#   bin/peftc, lib/libpeft_c.so* and libpeft_c.a, include/peft_c.h, lib/cmake/peft_c (find_package),
#   lib/pkgconfig/peft_c.pc (prefix taken from the .pc file's own place), share/peft_c/arch (the
#   architecture tables, found next to the library) and share/doc/peft_c (README and docs).
# Unpacked anywhere, it is used with CMAKE_PREFIX_PATH=<folder> or PKG_CONFIG_PATH=<folder>/lib/pkgconfig.
# Uses the release build in build/ (configured here if it is not yet), like `make`.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ ! -f build/CMakeCache.txt ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
ninja -C build peft_c peft_c_static peftc
version=$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' build/CMakeCache.txt)
name=peft_c-$version-linux-$(uname -m)
stage=build/dist/$name
rm -rf "$stage" "build/dist/$name.tar.gz"
# LIBDIR is fixed to lib: the tarball's layout does not depend on the prefix the build was configured for.
cmake --install build --prefix "$root/$stage" >/dev/null
if [ ! -d "$stage/lib/cmake/peft_c" ]; then
  echo "dist: the build installs its library outside lib/ (CMAKE_INSTALL_LIBDIR); configure build/ without it" >&2
  exit 1
fi
mkdir -p "$stage/share/doc/peft_c"
cp README.md "$stage/share/doc/peft_c/"
cp docs/*.md "$stage/share/doc/peft_c/"
[ -f LICENSE ] && cp LICENSE "$stage/share/doc/peft_c/"
tar -czf "build/dist/$name.tar.gz" -C build/dist --owner=0 --group=0 "$name"
echo "build/dist/$name.tar.gz"
