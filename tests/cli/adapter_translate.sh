#!/usr/bin/env bash
# peftc translate: one translated key per line in order, both directions, built-in and user tables,
# automatic table choice, and unresolved keys as an error that lists every one.
# Usage: bash adapter_translate.sh path/to/peftc
set -uo pipefail
peftc=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }
expect() {  # expected-output, then the command
  local want=$1; shift
  local got
  got=$("$@" 2>&1) || { fail "$* exited $?: $got"; return; }
  [ "$got" = "$want" ] || fail "$*: got [$got], want [$want]"
}

expect "transformer/layer_4/attention/query/lora_a" \
  "$peftc" translate --arch llama model.layers.4.self_attn.q_proj.lora_A.weight
expect "transformer/layer_4/attention/query/lora_a
transformer/final_norm/weight
lm_head/weight" \
  "$peftc" translate --arch llama base_model.model.model.layers.4.self_attn.q_proj.lora_A.weight \
  model.norm.weight lm_head.weight
expect "model.layers.4.self_attn.q_proj.lora_A.weight" \
  "$peftc" translate --arch llama --reverse transformer/layer_4/attention/query/lora_a
expect "base_model.model.transformer.h.11.attn.c_attn.lora_B.weight" \
  "$peftc" translate --arch gpt2 --reverse --peft-prefix transformer/layer_11/attention/qkv/lora_b
# No table named: the first built-in table that resolves every key.
expect "transformer/layer_0/attention/qkv/lora_a" \
  "$peftc" translate transformer.h.0.attn.c_attn.lora_A.weight

# A user table from a file.
cat >"$work/table.json" <<'JSON'
{"family": "mine", "modules": [{"hf": "blocks.{i}.attn", "native": "b{i}/attn", "kind": "linear"}]}
JSON
expect "b3/attn/lora_b" "$peftc" translate --table "$work/table.json" blocks.3.attn.lora_B.weight
expect "blocks.3.attn.lora_B.weight" "$peftc" translate --table "$work/table.json" --reverse b3/attn/lora_b

# Unresolved keys: exit 1, every one listed, nothing on stdout.
"$peftc" translate --arch llama model.layers.0.self_attn.q_proj.lora_A.weight model.x.weight model.y.weight \
  >"$work/out" 2>"$work/err"
rc=$?
[ $rc -eq 1 ] || fail "unresolved: exit $rc"
[ ! -s "$work/out" ] || fail "unresolved: something was printed: $(cat "$work/out")"
grep -q '^peftc: error: UNRESOLVED_KEY: 2 keys .*"model.x.weight".*"model.y.weight"' "$work/err" \
  || fail "unresolved: $(cat "$work/err")"
"$peftc" translate --arch no_such_family a.weight >/dev/null 2>"$work/err"; rc=$?
[ $rc -eq 1 ] && grep -q '^peftc: error: NOT_FOUND: ' "$work/err" || fail "unknown family: exit $rc"
printf '{"family": "broken", "modules": [{"hf": "a.{i}", "native": "a"}]}' >"$work/broken.json"
"$peftc" translate --table "$work/broken.json" a.0.weight >/dev/null 2>"$work/err"; rc=$?
[ $rc -eq 1 ] && grep -q '^peftc: error: INVALID_CONFIG: ' "$work/err" || fail "broken table: exit $rc"
"$peftc" translate no.such.model.key.weight >/dev/null 2>"$work/err"; rc=$?
[ $rc -eq 1 ] || fail "no table resolves: exit $rc"

# The list of built-in families.
for family in bert bloom distilbert falcon gemma gpt2 gpt_neox llama mistral mixtral phi3 qwen2 roberta t5 vit; do
  "$peftc" translate --list | grep -qx "$family" || fail "--list lacks $family"
done

# Usage errors.
"$peftc" translate --arch llama >/dev/null 2>&1; rc=$?; [ $rc -eq 2 ] || fail "no KEY: exit $rc"
"$peftc" translate --arch llama --table x k >/dev/null 2>&1; rc=$?; [ $rc -eq 2 ] || fail "both tables: exit $rc"
"$peftc" translate --arch >/dev/null 2>&1; rc=$?; [ $rc -eq 2 ] || fail "--arch without value: exit $rc"
"$peftc" translate --peft-prefix --arch llama k >/dev/null 2>&1; rc=$?; [ $rc -eq 2 ] || fail "--peft-prefix alone: exit $rc"

echo "translate: $failed failures"
[ $failed -eq 0 ]
