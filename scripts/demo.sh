#!/usr/bin/env bash
# The main job on the small files the repository ships: builds peftc, then inspects the tiny model and
# its LoRA adapter.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build peftc
model=tests/fixtures/models/llama
adapter=tests/fixtures/adapters/llama_lora
echo "== peftc inspect $model"
build/peftc inspect "$model"
echo "== peftc inspect $adapter/adapter_model.safetensors"
build/peftc inspect "$adapter/adapter_model.safetensors"
