#!/usr/bin/env bash
# Installs the Debian packages peft_c builds and tests with. Does nothing when all are present.
set -euo pipefail
packages=(cmake ninja-build g++ pkg-config ccache
          nlohmann-json3-dev libxtensor-dev libxtensor-blas-dev libopenblas-dev doctest-dev libpcre2-dev
          doxygen clang libclang-rt-14-dev llvm valgrind python3-venv)
if [ "${PEFT_WITH_BINDINGS:-1}" = 1 ]; then packages+=(mono-complete mono-mcs); fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
echo "installing Debian packages: ${missing[*]}" >&2
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q >&2
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
