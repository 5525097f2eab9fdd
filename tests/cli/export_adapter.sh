#!/usr/bin/env bash
# peftc adapter export: byte-identical re-export of PEFT-written adapters (fixtures and the real
# corpus), --dtype, --peft-version, refusals, usage errors, and that a failed run writes nothing.
# Usage: bash export_adapter.sh path/to/peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must point at tests/fixtures}
corpus=${PEFT_CORPUS:-}
adapters="$data/adapters"
[ -e "$adapters/llama_lora/adapter_config.json" ] || { echo "SKIP: fixtures absent (run tests/fixtures/generate.py)"; exit 0; }
source "$(dirname "$0")/lib/checks.sh"
same() { cmp -s "$1" "$2"; }
absent() { [ ! -e "$1" ]; }
# The dtypes of `peftc inspect` output lines, sorted and unique.
dtypes_of() { "$peftc" inspect "$1" | awk 'NF >= 4 && $2 ~ /^[A-Z0-9_]+$/ && $3 ~ /^\[/ {print $2}' | sort -u | tr '\n' ' '; }
has_metadata_format_pt_only() {  # (output captured first: grep -q closing the pipe early would fail peftc)
  local text
  text=$("$peftc" inspect "$1") || return 1
  [ "$(grep -c '^  metadata ' <<<"$text")" -eq 1 ] && grep -qx '  metadata format = pt' <<<"$text"
}

# ---- usage -------------------------------------------------------------------------------------
check "no arguments is a usage error" exit_is 2 "$peftc" adapter export
check "one argument is a usage error" exit_is 2 "$peftc" adapter export "$adapters/llama_lora"
check "three positionals are a usage error" exit_is 2 "$peftc" adapter export "$adapters/llama_lora" a b
check "an unknown option is a usage error" exit_is 2 "$peftc" adapter export "$adapters/llama_lora" "$work/u" --frobnicate
check "a bad dtype is a usage error" exit_is 2 "$peftc" adapter export "$adapters/llama_lora" "$work/u" --dtype i32
check "--peft-version needs a value" exit_is 2 "$peftc" adapter export "$adapters/llama_lora" "$work/u" --peft-version
check "usage errors write nothing" absent "$work/u"

# ---- every fixture adapter: both files byte for byte (PEFT 0.21.2 wrote them) -------------------
for dir in "$adapters"/*/; do
  name=$(basename "$dir")
  out="$work/fixtures/$name"
  check "$name exports" exit_is 0 "$peftc" adapter export "$dir" "$out"
  check "$name: adapter_model.safetensors identical" same "$dir/adapter_model.safetensors" "$out/adapter_model.safetensors"
  check "$name: adapter_config.json identical" same "$dir/adapter_config.json" "$out/adapter_config.json"
done

# ---- the real corpus: identical safetensors where the source has {"format":"pt"} ----------------
if [ -n "$corpus" ] && [ -d "$corpus" ]; then
  n=0
  while IFS= read -r config; do
    dir=$(dirname "$config")
    [ -e "$dir/adapter_model.safetensors" ] || continue
    n=$((n + 1))
    out="$work/corpus/$n"
    check "corpus $dir exports" exit_is 0 "$peftc" adapter export "$dir" "$out"
    if has_metadata_format_pt_only "$dir/adapter_model.safetensors"; then
      check "corpus $dir: safetensors identical" same "$dir/adapter_model.safetensors" "$out/adapter_model.safetensors"
    fi
    check "corpus $dir: export writes {\"format\":\"pt\"}" has_metadata_format_pt_only "$out/adapter_model.safetensors"
    check "corpus $dir: the export re-exports to itself" exit_is 0 "$peftc" adapter export "$out" "$out.again"
    check "corpus $dir: second export identical" same "$out/adapter_model.safetensors" "$out.again/adapter_model.safetensors"
    check "corpus $dir: second config identical" same "$out/adapter_config.json" "$out.again/adapter_config.json"
  done < <(find "$corpus" -name adapter_config.json | sort)
  check "the corpus has adapters" [ "$n" -gt 5 ]
else
  echo "note: corpus checks skipped (PEFT_CORPUS not set or absent)"
fi

# ---- options -----------------------------------------------------------------------------------
check "--dtype bf16 exports" exit_is 0 "$peftc" adapter export "$adapters/llama_lora" "$work/bf16" --dtype bf16
check "--dtype bf16 writes BF16" [ "$(dtypes_of "$work/bf16/adapter_model.safetensors")" = "BF16 " ]
check "--dtype=f16 exports" exit_is 0 "$peftc" adapter export "$adapters/llama_lora" "$work/f16" --dtype=f16
check "--dtype f16 writes F16" [ "$(dtypes_of "$work/f16/adapter_model.safetensors")" = "F16 " ]
check "bf16 -> f32 exports" exit_is 0 "$peftc" adapter export "$adapters/llama_bf16_lora" "$work/f32" --dtype f32
check "bf16 -> f32 writes F32" [ "$(dtypes_of "$work/f32/adapter_model.safetensors")" = "F32 " ]
check "the converted adapter opens" exit_is 0 "$peftc" adapter inspect "$work/f32"

check "--peft-version 0.13 exports" exit_is 0 "$peftc" adapter export "$adapters/llama_lora" "$work/v13" --peft-version 0.13
check "0.13 config has no peft_version" bash -c "! grep -q '\"peft_version\"' '$work/v13/adapter_config.json'"
check "0.13 config has no lora_bias" bash -c "! grep -q '\"lora_bias\"' '$work/v13/adapter_config.json'"
check "0.13 config keeps r" grep -q '"r": 4' "$work/v13/adapter_config.json"
check "0.13 tensors unchanged" same "$adapters/llama_lora/adapter_model.safetensors" "$work/v13/adapter_model.safetensors"
check "--peft-version 0.21 is the fixture's own config" \
  bash -c "'$peftc' adapter export '$adapters/llama_lora' '$work/v21' --peft-version 0.21 >/dev/null && cmp -s '$adapters/llama_lora/adapter_config.json' '$work/v21/adapter_config.json'"

# ---- refusals write nothing --------------------------------------------------------------------
check "lora_bias for 0.13 fails with 1" exit_is 1 "$peftc" adapter export "$adapters/qwen2_lora_bias" "$work/bias13" --peft-version 0.13
check "the refusal names UNSUPPORTED and the field" \
  bash -c "'$peftc' adapter export '$adapters/qwen2_lora_bias' '$work/bias13' --peft-version 0.13 2>&1 | grep -q 'UNSUPPORTED: .*\"lora_bias\"'"
check "a refused export creates nothing" absent "$work/bias13"
check "a malformed version fails with 1" exit_is 1 "$peftc" adapter export "$adapters/llama_lora" "$work/bad" --peft-version zero
check "a version before 0.13 fails with 1" exit_is 1 "$peftc" adapter export "$adapters/llama_lora" "$work/bad" --peft-version 0.12
check "a missing adapter fails with 1" exit_is 1 "$peftc" adapter export "$work/nope" "$work/bad"
check "failed runs create nothing" absent "$work/bad"
echo "not a folder" > "$work/file"
check "an output path that is a file fails with 1" exit_is 1 "$peftc" adapter export "$adapters/llama_lora" "$work/file"
check "that file is untouched" grep -qx "not a folder" "$work/file"

finish export_adapter
