#!/usr/bin/env bash
# peftc adapter combine: cat and linear combinations of fixture adapters (config, ranks, options),
# refusals and usage errors; a failed run writes nothing. Usage: bash export_combine.sh path/to/peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must point at tests/fixtures}
adapters="$data/adapters"
[ -e "$adapters/llama_lora/adapter_config.json" ] || { echo "SKIP: fixtures absent (run tests/fixtures/generate.py)"; exit 0; }
source "$(dirname "$0")/lib/checks.sh"
absent() { [ ! -e "$1" ]; }
fails_naming() {  # fails_naming TEXT COMMAND...: exit 1 and TEXT on stderr
  local text=$1
  shift
  local err
  err=$("$@" 2>&1 >/dev/null)
  [ $? -eq 1 ] && grep -q -- "$text" <<<"$err"
}
ranks_of() { "$peftc" adapter inspect "$1" | awk '$2 == "linear" || $2 == "conv1d" || $2 == "embedding" {print $3}' | sort -u | tr '\n' ' '; }
dtypes_of() { "$peftc" inspect "$1" | awk 'NF >= 4 && $2 ~ /^[A-Z0-9_]+$/ && $3 ~ /^\[/ {print $2}' | sort -u | tr '\n' ' '; }
a="$adapters/llama_lora"
b="$adapters/llama_lora_second"

# ---- usage -------------------------------------------------------------------------------------
check "no arguments is a usage error" exit_is 2 "$peftc" adapter combine
check "--method is required" exit_is 2 "$peftc" adapter combine --adapter "$a:1" --out "$work/u"
check "--out is required" exit_is 2 "$peftc" adapter combine --adapter "$a:1" --method cat
check "an --adapter is required" exit_is 2 "$peftc" adapter combine --method cat --out "$work/u"
check "DIR:WEIGHT needs a weight" exit_is 2 "$peftc" adapter combine --adapter "$a" --method cat --out "$work/u"
check "the weight must be a number" exit_is 2 "$peftc" adapter combine --adapter "$a:x" --method cat --out "$work/u"
check "the weight must be finite" exit_is 2 "$peftc" adapter combine --adapter "$a:nan" --method cat --out "$work/u"
check "the method must be a PEFT combination type" exit_is 2 "$peftc" adapter combine --adapter "$a:1" --method svd2 --out "$work/u"
check "--svd-rank must be at least 1" exit_is 2 "$peftc" adapter combine --adapter "$a:1" --adapter "$b:1" --method svd \
  --svd-rank 0 --out "$work/u"
check "--svd-clamp must be a quantile" exit_is 2 "$peftc" adapter combine --adapter "$a:1" --adapter "$b:1" --method svd \
  --svd-clamp 2 --out "$work/u"
check "a positional argument is a usage error" exit_is 2 "$peftc" adapter combine "$a" --method cat --out "$work/u"
check "usage errors write nothing" absent "$work/u"

# ---- cat: r = 4 + 4, lora_alpha = r, patterns emptied, union of targets -------------------------
check "cat combines" exit_is 0 "$peftc" adapter combine --adapter "$a:0.5" --adapter "$b:-1.5" --method cat --out "$work/cat"
check "cat: r is 8" grep -q '^  "r": 8,$' "$work/cat/adapter_config.json"
check "cat: lora_alpha is 8" grep -q '^  "lora_alpha": 8,$' "$work/cat/adapter_config.json"
check "cat: rank_pattern emptied" grep -q '^  "rank_pattern": {},$' "$work/cat/adapter_config.json"
check "cat: every module has rank 8" [ "$(ranks_of "$work/cat")" = "r=8 " ]
check "cat: target_modules is the sorted union" \
  bash -c "tr -d ' \n' < '$work/cat/adapter_config.json' | grep -q '\"target_modules\":\\[\"down_proj\",\"gate_proj\",\"k_proj\",\"o_proj\",\"q_proj\",\"up_proj\",\"v_proj\"\\]'"

# ---- linear, with options ----------------------------------------------------------------------
check "linear combines" exit_is 0 "$peftc" adapter combine --adapter "$a:0.5" --adapter "$b:1.5" --method linear \
  --out "$work/linear" --dtype bf16 --peft-version 0.13
check "linear: r stays 4" [ "$(ranks_of "$work/linear")" = "r=4 " ]
check "linear: --dtype bf16 applies" [ "$(dtypes_of "$work/linear/adapter_model.safetensors")" = "BF16 " ]
check "linear: --peft-version 0.13 applies" bash -c "! grep -q peft_version '$work/linear/adapter_config.json'"
check "one adapter combines (as linear)" exit_is 0 "$peftc" adapter combine --adapter "$a:2" --method cat --out "$work/one"
check "one adapter keeps its rank" [ "$(ranks_of "$work/one")" = "r=4 " ]
check "the combination can itself be combined" exit_is 0 "$peftc" adapter combine --adapter "$work/cat:1" \
  --adapter "$a:1" --method cat --out "$work/again"
check "ranks add up again" [ "$(ranks_of "$work/again")" = "r=12 " ]

# ---- svd: unequal ranks allowed, the new rank is the largest or --svd-rank ---------------------
check "svd combines unequal ranks" exit_is 0 "$peftc" adapter combine --adapter "$adapters/llama_rank_alpha_pattern:1" \
  --adapter "$a:0.5" --method svd --out "$work/svd"
check "svd: r is the largest rank (a rank_pattern value 8)" [ "$(ranks_of "$work/svd")" = "r=8 " ]
check "ties_svd with --svd-rank and --svd-clamp" exit_is 0 "$peftc" adapter combine --adapter "$a:1" --adapter "$b:-1" \
  --method ties_svd --density 0.5 --svd-rank 2 --svd-clamp 0.95 --out "$work/ties_svd"
check "ties_svd: r is --svd-rank" [ "$(ranks_of "$work/ties_svd")" = "r=2 " ]
check "dare_ties_svd needs a density" fails_naming "INVALID_ARGUMENT: .*density" "$peftc" adapter combine \
  --adapter "$a:1" --adapter "$b:1" --method dare_ties_svd --out "$work/bad"

# ---- --deltas: the true deltas' weighted sum, exact or truncated --------------------------------
check "--deltas combines exactly" exit_is 0 "$peftc" adapter combine --deltas --adapter "$a:0.7" --adapter "$b:-1.3" \
  --method linear --out "$work/deltas"
check "--deltas: ranks add up (4 + 4)" [ "$(ranks_of "$work/deltas")" = "r=8 " ]
check "--deltas --json reports every module" bash -c "'$peftc' adapter combine --deltas --adapter '$a:1' \
  --adapter '$b:1' --method ties --density 0.5 --rank 2 --out '$work/deltas_json' --json | grep -q '\"relative_error\"'"
check "--deltas --rank 2 writes rank 2" [ "$(ranks_of "$work/deltas_json")" = "r=2 " ]
check "--rank needs --deltas" exit_is 2 "$peftc" adapter combine --adapter "$a:1" --method linear --rank 2 --out "$work/bad"
check "--deltas takes no --svd-rank" exit_is 2 "$peftc" adapter combine --deltas --adapter "$a:1" --method linear \
  --svd-rank 2 --out "$work/bad"
check "--deltas exact with pruning is refused" fails_naming "INVALID_ARGUMENT: .*rank or an energy" "$peftc" adapter \
  combine --deltas --adapter "$a:1" --adapter "$b:1" --method ties --density 0.5 --out "$work/bad"

# ---- refusals ----------------------------------------------------------------------------------
check "DoRA is refused" fails_naming "UNSUPPORTED: .*DoRA" "$peftc" adapter combine --adapter "$a:1" \
  --adapter "$adapters/llama_dora:1" --method cat --out "$work/bad"
check "lora_bias is refused" fails_naming "UNSUPPORTED: .*lora_bias" "$peftc" adapter combine \
  --adapter "$adapters/qwen2_lora_bias:1" --adapter "$adapters/qwen2_lora:1" --method cat --out "$work/bad"
check "modules_to_save tensors are refused" fails_naming "UNSUPPORTED" "$peftc" adapter combine \
  --adapter "$adapters/bert_seqcls_lora:1" --adapter "$adapters/bert_seqcls_lora:1" --method cat --out "$work/bad"
check "linear with unequal ranks is refused" fails_naming "INVALID_ARGUMENT: .*rank" "$peftc" adapter combine \
  --adapter "$adapters/llama_rank_alpha_pattern:1" --adapter "$a:1" --method linear --out "$work/bad"
check "regex and list targets are refused" fails_naming "UNSUPPORTED" "$peftc" adapter combine \
  --adapter "$adapters/llama_regex:1" --adapter "$a:1" --method cat --out "$work/bad"
check "an inherited layers_to_transform that drops modules is refused" fails_naming "model.layers.0" "$peftc" \
  adapter combine --adapter "$adapters/llama_layers_to_transform:1" --adapter "$a:1" --method cat --out "$work/bad"
check "a missing adapter fails with 1" exit_is 1 "$peftc" adapter combine --adapter "$work/nope:1" --method cat --out "$work/bad"
check "refusals write nothing" absent "$work/bad"

finish export_combine
