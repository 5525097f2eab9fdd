#!/usr/bin/env bash
# --lenient on every command that opens an adapter: strict refuses an adapter whose target_modules
# leaves out modules it has tensors for; --lenient loads it as PEFT does, drops those tensors and
# prints one "warning: unexpected key ..." line per key on stderr. (The comparison with PEFT itself
# is tests/interop/test_adapter_lenient.py.) Usage: bash lenient.sh path/to/peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must point at tests/fixtures}
base="$data/models/llama"
lora="$data/adapters/llama_lora"
for f in "$base/model.safetensors" "$lora/adapter_model.safetensors"; do
  [ -e "$f" ] || { echo "SKIP: fixture $f is absent (run tests/fixtures/generate.py)"; exit 0; }
done
source "$(dirname "$0")/lib/checks.sh"
contains() { grep -qF -- "$2" "$1"; }
lines() { grep -c -- "$2" "$1"; }

# llama_lora without "down_proj" in target_modules: its 4 down_proj tensors are PEFT's unexpected keys.
adapter="$work/adapter"
mkdir -p "$adapter"
cp "$lora/adapter_model.safetensors" "$adapter/"
sed 's/"down_proj",//' "$lora/adapter_config.json" >"$adapter/adapter_config.json"
check "the test adapter leaves down_proj out" bash -c "! grep -q down_proj '$adapter/adapter_config.json'"

# ---- merge ---------------------------------------------------------------------------------------
"$peftc" merge --base "$base" --adapter "$adapter" --out "$work/strict" >/dev/null 2>"$work/strict.err"
check "strict merge fails (exit 1)" test $? -eq 1
check "strict merge says INVALID_CONFIG" contains "$work/strict.err" "peftc: error: INVALID_CONFIG: "
check "strict merge prints no warning" bash -c "! grep -q '^warning: ' '$work/strict.err'"
check "strict merge writes nothing" test ! -e "$work/strict"

"$peftc" merge --base "$base" --adapter "$adapter" --out "$work/lenient" --lenient >"$work/lenient.out" 2>"$work/lenient.err"
check "lenient merge succeeds" test $? -eq 0
check "one warning per ignored key" test "$(lines "$work/lenient.err" '^warning: ')" -eq 4
check "every stderr line is a warning" test "$(wc -l <"$work/lenient.err")" -eq 4
check "the warnings name the keys" test "$(lines "$work/lenient.err" '^warning: unexpected key "base_model.model.model.layers.[01].mlp.down_proj.lora_[AB].weight": ')" -eq 4
check "the summary counts 12 merged tensors" contains "$work/lenient.out" "tensors: 12 merged, 0 replaced, 9 copied"
check "--lenient=x is a usage error" exit_is 2 "$peftc" merge --base "$base" --adapter "$adapter" --out "$work/x" --lenient=1

# ---- adapter export, then a strict merge of what it wrote ----------------------------------------
check "strict export fails" exit_is 1 "$peftc" adapter export "$adapter" "$work/exported_strict"
"$peftc" adapter export "$adapter" "$work/exported" --lenient >"$work/export.out" 2>"$work/export.err"
check "lenient export succeeds" test $? -eq 0
check "lenient export warns 4 times" test "$(lines "$work/export.err" '^warning: unexpected key ')" -eq 4
check "lenient export writes 12 modules" contains "$work/export.out" "exported 12 module(s)"
check "the export opens strictly" exit_is 0 "$peftc" adapter inspect "$work/exported" --base "$base"
check "and merges strictly" exit_is 0 "$peftc" merge --base "$base" --adapter "$work/exported" --out "$work/from_export"
check "to the bytes of the lenient merge" cmp -s "$work/lenient/model.safetensors" "$work/from_export/model.safetensors"
check "export takes --base with --lenient" exit_is 0 "$peftc" adapter export "$adapter" "$work/exported_base" --base "$base" --lenient

# ---- adapter inspect and combine ----------------------------------------------------------------
check "strict inspect fails" exit_is 1 "$peftc" adapter inspect "$adapter"
"$peftc" adapter inspect "$adapter" --base "$base" --lenient >"$work/inspect.out" 2>"$work/inspect.err"
check "lenient inspect succeeds" test $? -eq 0
check "lenient inspect warns on stderr" test "$(lines "$work/inspect.err" '^warning: unexpected key ')" -eq 4
check "and keeps stdout for the adapter" bash -c "! grep -q '^warning: ' '$work/inspect.out'"
check "lenient inspect --json is JSON on stdout" bash -c "'$peftc' adapter inspect '$adapter' --lenient --json 2>/dev/null | python3 -m json.tool >/dev/null"
check "strict combine fails" exit_is 1 "$peftc" adapter combine --adapter "$adapter:1" --method cat --out "$work/combined_strict"
check "lenient combine succeeds" exit_is 0 "$peftc" adapter combine --adapter "$adapter:1" --adapter "$lora:0.5" --method cat --out "$work/combined" --lenient

finish lenient
