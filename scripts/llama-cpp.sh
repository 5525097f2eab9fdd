#!/usr/bin/env bash
# Builds (once) llama.cpp's own tools from source, as references for the GGUF tests, and prints where they are.
#
#   prefix=$(scripts/llama-cpp.sh)            # build if needed; the prefix (tools in $prefix/bin) on stdout
#   eval "$(scripts/llama-cpp.sh --env)"      # build if needed; export PEFT_LLAMA_CPP_* / PEFT_GGUF_PY
#   scripts/llama-cpp.sh --env --no-build     # the same when everything is there already, else exit 3
#                                             # at once, installing and building nothing (`make check`)
#
# The source is the llama-cpp-python sdist from the Python package index, which vendors the whole llama.cpp
# tree (vendor/llama.cpp: the tools, convert_hf_to_gguf.py, convert_lora_to_gguf.py, gguf-py). It is
# downloaded with the pinned venv's pip (scripts/python-env.sh), checked against the sha256 below and
# unpacked under ${XDG_CACHE_HOME:-$HOME/.cache}/peft_c/llama/<version>/. Nothing is written into the clone.
#
# Build: CMake + Ninja, Release, static, -j2, only the targets in TARGETS. The build folder is keyed by the
# sha256 of everything that decides its output (sdist hash, CMake options, compiler, machine); a stamp
# file is written after a successful build, so a second run returns at once. A lock serialises callers.
#
# Machine independence: GGML_NATIVE=OFF alone would still turn on AVX/AVX2/FMA/F16C/BMI2 (ggml's default
# for non-native x86 builds), which changes rounding (FMA contractions, vector dot-product order) and does
# not run on older CPUs. Every x86 extension, llamafile's sgemm, the Q4_0 repacking, BLAS and OpenMP are
# therefore off: ggml runs its scalar (reference) paths and single rows are reduced in one fixed order, so
# the tools give the same bytes on every x86-64 machine, whatever its CPU. The tools only handle tiny test
# models, so speed does not matter. No network access: LLAMA_OPENSSL=OFF (this llama.cpp version has no
# LLAMA_CURL any more; it is deprecated and ignored), no prebuilt web UI, no server, no tests.
#
# The converters also need the `sentencepiece` package (the tiny test models carry a SentencePiece
# tokenizer.model, the one tokenizer the llama, qwen2, gemma and phi3 converters all accept offline). It is
# not in tests/requirements.txt (changing that rebuilds the venv): it is installed with the venv's pip
# into <version>/python-<cpXY>-sentencepiece-<pin>/ and put on PYTHONPATH for the converters only
# (PEFT_LLAMA_CPP_PYDEPS).
#
# Environment read: PEFT_LLAMA_CPP_CACHE (another cache folder), PEFT_LLAMA_CPP_JOBS (default 2).
# Environment printed by --env:
#   PEFT_LLAMA_CPP_BIN     folder of llama-export-lora, llama-quantize, llama-gguf, llama-simple (a runner),
#                          llama-gguf-split
#   PEFT_LLAMA_CPP_SRC     the llama.cpp source tree (convert_hf_to_gguf.py, convert_lora_to_gguf.py)
#   PEFT_GGUF_PY           gguf-py, the Python package `gguf` of that tree (for PYTHONPATH)
#   PEFT_LLAMA_CPP_PYDEPS  extra Python packages of the converters (sentencepiece), for PYTHONPATH
set -euo pipefail

VERSION=0.3.36
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
SENTENCEPIECE=0.2.1
TARGETS=(llama-export-lora llama-quantize llama-gguf llama-simple llama-gguf-split)
CMAKE_OPTIONS=(
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=OFF
  -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF
  -DGGML_NATIVE=OFF -DGGML_SSE42=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF
  -DGGML_BMI2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF -DGGML_LLAMAFILE=OFF -DGGML_CPU_REPACK=OFF
  -DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DGGML_CCACHE=OFF -DGGML_BACKEND_DL=OFF
)
JOBS=${PEFT_LLAMA_CPP_JOBS:-2}

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${PEFT_LLAMA_CPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/peft_c/llama}
base=$cache/$VERSION
tarball=$cache/llama_cpp_python-$VERSION.tar.gz
src=$base/src/llama_cpp_python-$VERSION/vendor/llama.cpp

log() { printf 'llama-cpp: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

mode=prefix
build=yes
for arg in "$@"; do
  case "$arg" in
    --env) mode=env ;;
    --no-build) build=no ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$arg' (use --env, --no-build or nothing)" ;;
  esac
done

# sentencepiece is a compiled wheel: one folder per interpreter version of the venv.
if [[ $build == no ]]; then
  venv=$(PEFT_C_NO_INSTALL=1 "$root/scripts/python-env.sh") || exit 3
else
  venv=$("$root/scripts/python-env.sh")
fi
py_tag=$("$venv/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
pydeps=$base/python-$py_tag-sentencepiece-$SENTENCEPIECE

compiler=$( (c++ --version 2>/dev/null || echo none) | head -n1)
key=$(printf '%s\n' "$VERSION" "$SHA256" "$(uname -m)" "$compiler" "$(cmake --version 2>/dev/null | head -n1)" \
        "${CMAKE_OPTIONS[@]}" "${TARGETS[@]}" | sha256sum | cut -c1-12)
prefix=$base/build-$key
stamp=$prefix/.peft_c_complete

print_result() {
  if [[ $mode == env ]]; then
    printf 'export PEFT_LLAMA_CPP_BIN=%q\n' "$prefix/bin"
    printf 'export PEFT_LLAMA_CPP_SRC=%q\n' "$src"
    printf 'export PEFT_GGUF_PY=%q\n' "$src/gguf-py"
    printf 'export PEFT_LLAMA_CPP_PYDEPS=%q\n' "$pydeps"
  else
    printf '%s\n' "$prefix"
  fi
}

# Fast path: built, unpacked and the converters' packages present.
if [[ -f $stamp && -f $src/.peft_c_unpacked && -f $pydeps/.peft_c_complete ]]; then
  print_result
  exit 0
fi
[[ $build == yes ]] || exit 3

for tool in cmake ninja c++ sha256sum tar; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found (run scripts/install-deps.sh)"
done
mkdir -p "$base"
exec 9>"$cache/$VERSION.lock"
log "waiting for lock $cache/$VERSION.lock"
flock 9

pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input)

# 1. The sdist, checked against the pinned hash (a file that does not match is replaced, never used).
if [[ -f $tarball ]] && ! echo "$SHA256  $tarball" | sha256sum -c --status; then
  log "$tarball does not match the pinned sha256; downloading it again"
  rm -f "$tarball"
fi
if [[ ! -f $tarball ]]; then
  download=$(mktemp -d "$cache/download.XXXXXX")
  log "downloading llama-cpp-python==$VERSION (source distribution)"
  "${pip[@]}" download --no-deps --no-binary :all: -d "$download" "llama-cpp-python==$VERSION" >&2
  got=$download/llama_cpp_python-$VERSION.tar.gz
  [[ -f $got ]] || die "pip did not produce $got"
  echo "$SHA256  $got" | sha256sum -c --status \
    || die "sha256 of the downloaded sdist is $(sha256sum "$got" | cut -d' ' -f1), expected $SHA256"
  mv "$got" "$tarball"
  rm -rf "$download"
fi

# 2. Unpacked source (an interrupted unpack, without the marker, is removed and redone).
if [[ ! -f $src/.peft_c_unpacked ]]; then
  rm -rf "$base/src"
  mkdir -p "$base/src"
  log "unpacking $tarball"
  tar -xzf "$tarball" -C "$base/src"
  [[ -f $src/convert_hf_to_gguf.py && -d $src/gguf-py/gguf ]] || die "unexpected sdist layout: no $src"
  touch "$src/.peft_c_unpacked"
fi

# 3. The converters' extra Python package.
if [[ ! -f $pydeps/.peft_c_complete ]]; then
  rm -rf "$pydeps"
  log "installing sentencepiece==$SENTENCEPIECE into $pydeps"
  "${pip[@]}" install --no-deps --only-binary :all: --target "$pydeps" "sentencepiece==$SENTENCEPIECE" >&2
  touch "$pydeps/.peft_c_complete"
fi

# 4. The tools.
if [[ ! -f $stamp ]]; then
  log "building ${TARGETS[*]} in $prefix (-j$JOBS; a few minutes the first time)"
  start=$SECONDS
  cmake -S "$src" -B "$prefix" -G Ninja "${CMAKE_OPTIONS[@]}" >&2
  cmake --build "$prefix" -j "$JOBS" --target "${TARGETS[@]}" >&2
  for t in "${TARGETS[@]}"; do
    [[ -x $prefix/bin/$t ]] || die "the build did not produce $prefix/bin/$t"
  done
  touch "$stamp"
  log "built in $((SECONDS - start)) s"
fi

print_result
