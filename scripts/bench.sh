#!/usr/bin/env bash
# Builds the benchmarks and runs them side by side with the reference implementations.
# The figures in docs/benchmarks.md come from this script.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
py=$(scripts/python-env.sh)/bin/python
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build peftc $(ninja -C build -t targets all | sed -n 's/^\(bench_[a-z_]*\):.*/\1/p' | sort -u)
echo "## machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for b in build/bench/bench_*; do
  [ -x "$b" ] || continue
  case $(basename "$b") in bench_open) continue ;; esac   # driven by open_vs_python.py
  echo "### $(basename "$b")"; "$b"
done
eval "$(scripts/llama-cpp.sh --env)"   # llama.cpp's tools for bench/gguf_merge_vs_llama.py and gguf_quant_merge_vs_llama.py
for s in bench/*.py; do
  echo "### $s"; "$py" "$s" build
done
# The merge against the device into GGUF bases as well: F16, and Q4_K_M (merged and quantized again).
echo "### bench/merge_vs_device.py --gguf"; "$py" bench/merge_vs_device.py build --gguf
echo "### bench/merge_vs_device.py --gguf --quant Q4_K_M"; "$py" bench/merge_vs_device.py build --gguf --quant Q4_K_M
