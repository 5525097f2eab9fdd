#!/usr/bin/env bash
# peftc adapter inspect: every real adapter of the corpus and every fixture adapter inspects (text and
# --json, which must be one valid JSON object with the documented fields); --base validates; errors
# exit 1 with "peftc: error: CODE: ..." and usage errors exit 2. Usage: bash adapter_inspect.sh peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:-}
corpus=${PEFT_CORPUS:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
checked=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# Checks the --json document: required fields, and one entry per module with kind and tensors.
check_json() {
  python3 - "$1" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for field in ("peft_type", "r", "lora_alpha", "use_rslora", "use_dora", "modules"):
    assert field in doc, field
assert doc["peft_type"] == "LORA"
assert doc["modules"], "no modules"
for m in doc["modules"]:
    assert m["kind"] in ("linear", "conv1d", "embedding", "conv2d", "full", "trainable_tokens"), m
    assert m["tensors"], m
    if m["kind"] in ("linear", "conv1d", "embedding", "conv2d"):
        assert m["rank"] > 0 and m["scaling"] is not None, m
    for role, t in m["tensors"].items():
        assert t["dtype"] and isinstance(t["shape"], list), (role, t)
PY
}

inspect_all() {  # folder, then a glob of adapter_config.json files under it
  while IFS= read -r -d '' config; do
    dir=$(dirname "$config")
    checked=$((checked + 1))
    if ! "$peftc" adapter inspect "$dir" >"$work/text" 2>"$work/err"; then
      fail "adapter inspect $dir: $(cat "$work/err")"; continue
    fi
    grep -q "^adapter $dir" "$work/text" || fail "text output of $dir has no header line"
    if ! "$peftc" adapter inspect "$dir" --json >"$work/json" 2>"$work/err"; then
      fail "adapter inspect --json $dir: $(cat "$work/err")"; continue
    fi
    [ "$(wc -l <"$work/json")" -eq 1 ] || fail "--json of $dir is not one line"
    check_json "$work/json" || fail "--json of $dir is not the documented document"
  done < <(find "$1" -name adapter_config.json -print0 | sort -z)
}

if [ -n "$corpus" ] && [ -d "$corpus" ]; then
  inspect_all "$corpus"
else
  echo "SKIP (corpus part): PEFT_CORPUS=${corpus:-unset} is absent"
fi

adapters="$data/adapters"
if [ -d "$adapters" ]; then
  for dir in "$adapters"/*/; do
    dir=${dir%/}
    name=$(basename "$dir")
    base=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]['base'])" \
           "$adapters/MANIFEST.json" "$name")
    checked=$((checked + 1))
    if ! "$peftc" adapter inspect "$dir" --base "$data/$base" --json >"$work/json" 2>"$work/err"; then
      fail "$name --base: $(cat "$work/err")"; continue
    fi
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d['validation']['ok'], d['validation']" \
      "$work/json" || fail "$name: validation not ok"
  done
  inspect_all "$adapters"

  # A base that does not fit: the adapter is still shown, the validation lists what does not fit, exit 1.
  "$peftc" adapter inspect "$adapters/gpt2_lora" --base "$data/models/llama" --json >"$work/json" 2>"$work/err"
  rc=$?
  [ $rc -eq 1 ] || fail "mismatched base: exit $rc, expected 1"
  python3 -c "
import json,sys
d=json.load(open(sys.argv[1]))
v=d['validation']
assert v['ok'] is False and v['code'] == 'UNRESOLVED_KEY' and 'transformer.h.0.attn.c_attn' in v['message'], v
" "$work/json" || fail "mismatched base: validation object wrong"
  grep -q '^peftc: error: UNRESOLVED_KEY: ' "$work/err" || fail "mismatched base: no error line"
else
  echo "SKIP (fixture part): $adapters not generated"
fi

# Errors and usage.
"$peftc" adapter inspect "$work/missing" >/dev/null 2>"$work/err"; rc=$?
[ $rc -eq 1 ] && grep -q '^peftc: error: NOT_FOUND: ' "$work/err" || fail "missing folder: exit $rc: $(cat "$work/err")"
mkdir -p "$work/bad"
printf '{"peft_type": "LORA", "r": "eight"}' >"$work/bad/adapter_config.json"
printf 'x' >"$work/bad/adapter_model.safetensors"
"$peftc" adapter inspect "$work/bad" >/dev/null 2>"$work/err"; rc=$?
[ $rc -eq 1 ] && grep -q '^peftc: error: INVALID_CONFIG: .*"r"' "$work/err" || fail "bad r: exit $rc: $(cat "$work/err")"
printf '{"peft_type": "ROAD"}' >"$work/bad/adapter_config.json"
"$peftc" adapter inspect "$work/bad" >/dev/null 2>"$work/err"; rc=$?
[ $rc -eq 1 ] && grep -q '^peftc: error: UNSUPPORTED: .*"peft_type"' "$work/err" || fail "ROAD: exit $rc: $(cat "$work/err")"
"$peftc" adapter inspect >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "no DIR: exit $rc, expected 2"
"$peftc" adapter inspect "$work" --frobnicate >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "unknown option: exit $rc, expected 2"
"$peftc" adapter inspect "$work" --base >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] || fail "--base without value: exit $rc, expected 2"

echo "adapter inspect: $checked adapters checked, $failed failures"
[ $failed -eq 0 ]
