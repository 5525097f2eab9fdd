#!/usr/bin/env bash
# peftc adapter export --format gguf --split-into BASE_OUT with a Hugging Face folder base: usage
# errors, the merged base equal to `peftc merge` of the same modules, the exported part equal to the
# plain export, refusals, and that a failed run leaves neither output (or a temporary) behind.
# (Against llama.cpp and PEFT, with GGUF and folder bases: tests/interop/test_gguf_split.py.)
# Usage: bash export_gguf_split.sh path/to/peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must point at tests/fixtures}
adapters="$data/adapters"
models="$data/models"
[ -e "$adapters/llama_dora/adapter_config.json" ] || { echo "SKIP: fixtures absent (run tests/fixtures/generate.py)"; exit 0; }
source "$(dirname "$0")/lib/checks.sh"
absent() { [ ! -e "$1" ]; }
same() { cmp -s "$1" "$2"; }
no_temporaries() { ! ls -A "$work" | grep -q 'peft-tmp'; }
split() {  # split ADAPTER BASE OUT BASE_OUT [more]: peftc's split export, stderr in $work/err
  local adapter=$1 base=$2 out=$3 base_out=$4
  shift 4
  "$peftc" adapter export "$adapter" "$out" --format gguf --base "$base" --split-into "$base_out" "$@" 2>"$work/err" >/dev/null
}
err_has() { grep -qF -- "$1" "$work/err"; }

# ---- usage -------------------------------------------------------------------------------------
check "--split-into needs a value" exit_is 2 "$peftc" adapter export "$adapters/llama_dora" "$work/u.gguf" --format gguf --split-into
check "--split-into is for --format gguf" exit_is 2 "$peftc" adapter export "$adapters/llama_dora" "$work/u" --split-into "$work/b"
check "usage errors write nothing" absent "$work/u.gguf"
check "the usage names --split-into" bash -c "'$peftc' adapter export --help | grep -qF -- '--split-into BASE_OUT'"

# ---- DoRA: merged whole, the same as peftc merge ---------------------------------------------------
split "$adapters/llama_dora" "$models/llama" "$work/dora.gguf" "$work/dora_base"
check "a DoRA adapter splits" test $? -eq 0
check "the adapter part is written" test -s "$work/dora.gguf"
check "it holds no pairs (every module is DoRA)" bash -c "'$peftc' inspect '$work/dora.gguf' | grep -q 'lora_' && exit 1 || exit 0"
"$peftc" merge --base "$models/llama" --adapter "$adapters/llama_dora" --out "$work/dora_merged" >/dev/null 2>&1
check "the merged base equals peftc merge" same "$work/dora_base/model.safetensors" "$work/dora_merged/model.safetensors"
check "the merged base has its config" same "$work/dora_base/config.json" "$work/dora_merged/config.json"

# ---- lora_B.bias: merged whole ----------------------------------------------------------------------
split "$adapters/qwen2_lora_bias" "$models/qwen2" "$work/bias.gguf" "$work/bias_base"
check "a lora_bias adapter splits" test $? -eq 0
"$peftc" merge --base "$models/qwen2" --adapter "$adapters/qwen2_lora_bias" --out "$work/bias_merged" >/dev/null 2>&1
check "its merged base equals peftc merge" same "$work/bias_base/model.safetensors" "$work/bias_merged/model.safetensors"

# ---- nothing to merge: the plain export, and a copy of the base -------------------------------------
split "$adapters/llama_lora" "$models/llama" "$work/plain.gguf" "$work/plain_base"
check "a plain adapter splits" test $? -eq 0
"$peftc" adapter export "$adapters/llama_lora" "$work/plain_want.gguf" --format gguf --base "$models/llama" >/dev/null 2>&1
check "its adapter equals the plain export" same "$work/plain.gguf" "$work/plain_want.gguf"
check "its base is a model folder" test -s "$work/plain_base/model.safetensors"

# ---- trainable tokens into a folder base -----------------------------------------------------------
split "$adapters/llama_trainable_tokens" "$models/llama" "$work/tokens.gguf" "$work/tokens_base"
check "trainable tokens merge into a folder base" test $? -eq 0

# ---- refusals --------------------------------------------------------------------------------------
split "$adapters/llama_dora" "$models/llama" "$work/x.gguf" "$models/llama"
check "BASE_OUT = the base is refused" test $? -eq 1
check "  naming it" err_has "is the base"
split "$adapters/llama_dora" "$models/llama" "$work/x.gguf" "$work/x.gguf"
check "BASE_OUT = OUT is refused" test $? -eq 1
check "  naming both" err_has "same path"
split "$adapters/gpt2_lora" "$models/llama" "$work/x.gguf" "$work/x_base"
check "modules the base lacks are refused" test $? -eq 1
check "refusals write nothing" absent "$work/x.gguf"
check "  nor BASE_OUT" absent "$work/x_base"

# ---- a failed merge leaves neither output --------------------------------------------------------------
printf 'keep' >"$work/in_the_way"
printf 'previous' >"$work/prev.gguf"
split "$adapters/llama_dora" "$models/llama" "$work/prev.gguf" "$work/in_the_way"
check "a merge into a file in the way fails" test $? -eq 1
check "  the previous OUT is unchanged" bash -c "[ \"\$(cat '$work/prev.gguf')\" = previous ]"
check "  the file in the way is unchanged" bash -c "[ \"\$(cat '$work/in_the_way')\" = keep ]"
check "  no temporary is left" no_temporaries

finish export_gguf_split
