#!/usr/bin/env bash
# The main job on the small files the repository ships: installs what the build needs, builds peftc,
# merges the tiny LLaMA model's LoRA adapter into it with `peftc merge`, and inspects the result.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build peftc
model=tests/fixtures/models/llama
adapter=tests/fixtures/adapters/llama_lora
out=$(mktemp -d "${TMPDIR:-/tmp}/peftc-demo-XXXXXX")
trap 'rm -rf "$out"' EXIT

echo
echo "== the adapter: $adapter"
build/peftc adapter inspect "$adapter" | sed -n 1,8p
echo
echo "== peftc merge --base $model --adapter $adapter --out $out/merged"
build/peftc merge --base "$model" --adapter "$adapter" --out "$out/merged"
echo
echo "== peftc inspect $out/merged (first tensors)"
build/peftc inspect "$out/merged" | sed -n 1,10p
echo
cmp -s "$model/model.safetensors" "$out/merged/model.safetensors" ||
  echo "model.safetensors holds the base's tensors, names and order, with the adapter merged into the targeted weights"
