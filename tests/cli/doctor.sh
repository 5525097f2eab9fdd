#!/usr/bin/env bash
# peftc doctor: exit statuses (0 clean, 1 problems, 2 errors and usage errors), the JSON report, the
# text report, and --fix (a clean PEFT-written adapter comes out byte for byte; a config problem
# without a fix stays and gives 1). The renamed-key variants and PEFT loading the fixed adapters are
# in tests/interop/test_adapter_doctor.py.
# Usage: bash doctor.sh path/to/peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must point at tests/fixtures}
adapters="$data/adapters"
models="$data/models"
[ -e "$adapters/llama_lora/adapter_config.json" ] || { echo "SKIP: fixtures absent (run tests/fixtures/generate.py)"; exit 0; }
source "$(dirname "$0")/lib/checks.sh"
same() { cmp -s "$1" "$2"; }
absent() { [ ! -e "$1" ]; }
output_has() { local text; text=$("${@:2}" 2>&1); grep -qF -- "$1" <<<"$text"; }

# ---- usage and errors: 2 ---------------------------------------------------------------------------
check "no arguments is a usage error" exit_is 2 "$peftc" doctor
check "--adapter needs a value" exit_is 2 "$peftc" doctor --adapter
check "an unknown option is a usage error" exit_is 2 "$peftc" doctor --adapter "$adapters/llama_lora" --frobnicate
check "a missing adapter folder is an error (2)" exit_is 2 "$peftc" doctor --adapter "$work/absent"
check "the error names its code" output_has "peftc: error: NOT_FOUND:" "$peftc" doctor --adapter "$work/absent"
check "a missing base folder is an error (2)" exit_is 2 "$peftc" doctor --adapter "$adapters/llama_lora" --base "$work/absent"

# ---- clean adapters: 0 -----------------------------------------------------------------------------
check "llama_lora on its base is clean" exit_is 0 "$peftc" doctor --adapter "$adapters/llama_lora" --base "$models/llama"
check "gpt2_lora (Conv1D) on its base is clean" exit_is 0 "$peftc" doctor --adapter "$adapters/gpt2_lora" --base "$models/gpt2"
check "without a base it is clean too" exit_is 0 "$peftc" doctor --adapter "$adapters/llama_lora"
check "the text report says clean" output_has "clean" "$peftc" doctor --adapter "$adapters/llama_lora" --base "$models/llama"
check "the text report names the base tensor" \
  output_has "-> model.layers.0.self_attn.q_proj.weight [16,16] F32" "$peftc" doctor --adapter "$adapters/llama_lora" --base "$models/llama"
check "--json gives the report" output_has '"ok": true' "$peftc" doctor --json --adapter "$adapters/llama_lora" --base "$models/llama"
check "--fix of a clean adapter exits 0" exit_is 0 "$peftc" doctor --adapter "$adapters/llama_lora" --base "$models/llama" --fix "$work/fixed"
check "--fix of a clean adapter: weights byte for byte" same "$adapters/llama_lora/adapter_model.safetensors" "$work/fixed/adapter_model.safetensors"
check "--fix of a clean adapter: config byte for byte" same "$adapters/llama_lora/adapter_config.json" "$work/fixed/adapter_config.json"

# ---- problems: 1 -----------------------------------------------------------------------------------
mkdir -p "$work/rank"
cp "$adapters/llama_lora/adapter_model.safetensors" "$work/rank/"
sed 's/"r": 4,/"r": 2,/' "$adapters/llama_lora/adapter_config.json" >"$work/rank/adapter_config.json"
check "a rank the config does not give is a problem (1)" exit_is 1 "$peftc" doctor --adapter "$work/rank" --base "$models/llama"
check "its kind is rank_mismatch" output_has '"kind": "rank_mismatch"' "$peftc" doctor --json --adapter "$work/rank" --base "$models/llama"
check "--fix cannot fix it: 1" exit_is 1 "$peftc" doctor --adapter "$work/rank" --base "$models/llama" --fix "$work/rank_fixed"
mkdir -p "$work/few"
cp "$adapters/llama_lora/adapter_model.safetensors" "$work/few/"
sed 's/"q_proj"$/"q_proj", "lm_head"/' "$adapters/llama_lora/adapter_config.json" >"$work/few/adapter_config.json"
check "a target without tensors is a problem (1)" exit_is 1 "$peftc" doctor --adapter "$work/few" --base "$models/llama"
check "its kind is target_without_tensors" \
  output_has '"kind": "target_without_tensors"' "$peftc" doctor --json --adapter "$work/few" --base "$models/llama"
check "--fix of a missing adapter is an error (2)" exit_is 2 "$peftc" doctor --adapter "$work/absent" --fix "$work/never"
check "a failed run writes nothing" absent "$work/never"

finish doctor
