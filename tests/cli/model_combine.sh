#!/usr/bin/env bash
# peftc model combine: whole-model task arithmetic over checkpoints of one base (the numerics against a
# numpy reference are in tests/interop/test_model_combine.py): usage errors, the base combined with itself
# gives its own bytes, sharding, and refusals that write nothing. Usage: bash model_combine.sh path/to/peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must point at tests/fixtures}
base="$data/models/llama"
[ -e "$base/model.safetensors" ] || { echo "SKIP: fixtures absent (run tests/fixtures/generate.py)"; exit 0; }
source "$(dirname "$0")/lib/checks.sh"
absent() { [ ! -e "$1" ]; }
fails_naming() {  # fails_naming TEXT COMMAND...: exit 1 and TEXT on stderr
  local text=$1
  shift
  local err
  err=$("$@" 2>&1 >/dev/null)
  [ $? -eq 1 ] && grep -q -- "$text" <<<"$err"
}

# ---- usage -------------------------------------------------------------------------------------
check "no arguments is a usage error" exit_is 2 "$peftc" model combine
check "--base is required" exit_is 2 "$peftc" model combine --model "$base:1" --method linear --out "$work/u"
check "a --model is required" exit_is 2 "$peftc" model combine --base "$base" --method linear --out "$work/u"
check "--method must be a task-arithmetic type" exit_is 2 "$peftc" model combine --base "$base" --model "$base:1" \
  --method svd --out "$work/u"
check "the weight must be finite" exit_is 2 "$peftc" model combine --base "$base" --model "$base:inf" --method linear \
  --out "$work/u"
check "--density must be from 0 to 1" exit_is 2 "$peftc" model combine --base "$base" --model "$base:1" \
  --method ties --density 2 --out "$work/u"
check "usage errors write nothing" absent "$work/u"

# ---- the base with itself: every difference is 0 -----------------------------------------------
check "linear combines" exit_is 0 "$peftc" model combine --base "$base" --model "$base:0.5" --model "$base:2" \
  --method linear --out "$work/same"
check "the base with itself is the base, byte for byte" cmp -s "$work/same/model.safetensors" "$base/model.safetensors"
check "config.json is copied" cmp -s "$work/same/config.json" "$base/config.json"
check "ties with a density combines" exit_is 0 "$peftc" model combine --base "$base" --model "$base:1" --method ties \
  --density 0.5 --out "$work/ties"
check "--max-shard-size shards the output" exit_is 0 "$peftc" model combine --base "$base" --model "$base:1" \
  --method linear --max-shard-size 10KB --out "$work/sharded"
check "the sharded output has an index" [ -e "$work/sharded/model.safetensors.index.json" ]
check "--dtype bf16 converts" exit_is 0 "$peftc" model combine --base "$base" --model "$base:1" --method linear \
  --dtype bf16 --out "$work/bf16"
check "the bf16 output holds BF16 tensors" bash -c "'$peftc' inspect '$work/bf16/model.safetensors' | grep -q BF16"

# ---- refusals ----------------------------------------------------------------------------------
check "pruning without a density is refused" fails_naming "INVALID_ARGUMENT: .*density" "$peftc" model combine \
  --base "$base" --model "$base:1" --method dare_ties --out "$work/bad"
check "another architecture's tensors are refused" fails_naming "NOT_FOUND" "$peftc" model combine --base "$base" \
  --model "$data/models/gpt2:1" --method linear --out "$work/bad"
cp -r "$base" "$work/copy"
check "an output over an input is refused" fails_naming "INVALID_ARGUMENT" "$peftc" model combine --base "$base" \
  --model "$work/copy:1" --method linear --out "$work/copy"
check "the input is left as it was" cmp -s "$work/copy/model.safetensors" "$base/model.safetensors"
check "a missing model fails with 1" exit_is 1 "$peftc" model combine --base "$base" --model "$work/nope:1" \
  --method linear --out "$work/bad"
check "refusals write nothing" absent "$work/bad"

finish model_combine
