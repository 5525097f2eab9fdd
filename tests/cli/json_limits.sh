#!/usr/bin/env bash
# Hostile JSON and non-regular files through peftc (issue 13): each JSON input nested 100,000 and
# 1,000,000 levels deep (adapter_config.json, a base config.json in a merge with --dtype bf16, a shard
# index, a translation table) exits 1 with its error code, never a crash; an adapter_config.json that
# is a FIFO exits 1 with IO at once instead of blocking. Usage: bash json_limits.sh peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must name tests/fixtures}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
checked=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

# fails_with CODE COMMAND...: exit status 1 (not a signal, not a hang) and "error: CODE:" on stderr.
fails_with() {
  local code=$1; shift
  checked=$((checked + 1))
  timeout 20 "$@" >/dev/null 2>"$work/err"; local rc=$?
  if [ $rc -ne 1 ] || ! grep -q "^peftc: error: $code: " "$work/err"; then
    fail "$* : exit $rc, expected 1 with $code: $(head -c 300 "$work/err")"
  fi
}

# nested DEPTH OPEN MIDDLE CLOSE: OPEN x DEPTH, MIDDLE, CLOSE x DEPTH
nested() { python3 -c 'import sys; d = int(sys.argv[1]); sys.stdout.write(sys.argv[2] * d + sys.argv[3] + sys.argv[4] * d)' "$@"; }

for depth in 100000 1000000; do
  mkdir -p "$work/adapter" "$work/base" "$work/index"
  cp "$data/adapters/llama_lora/adapter_model.safetensors" "$work/adapter/"
  { printf '{"peft_type": "LORA", "r": 4, "x": '; nested $depth '[' '' ']'; printf '}'; } > "$work/adapter/adapter_config.json"
  fails_with INVALID_CONFIG "$peftc" adapter inspect "$work/adapter"
  fails_with INVALID_CONFIG "$peftc" merge --base "$data/models/llama" --adapter "$work/adapter" --out "$work/out"

  cp "$data/models/llama/model.safetensors" "$work/base/"
  { printf '{"model_type": "llama", "x": '; nested $depth '{"a": ' 1 '}'; printf '}'; } > "$work/base/config.json"
  fails_with INVALID_CONFIG "$peftc" merge --base "$work/base" --adapter "$data/adapters/llama_lora" \
    --out "$work/out" --dtype bf16
  fails_with INVALID_CONFIG "$peftc" adapter inspect "$data/adapters/llama_lora" --base "$work/base"

  cp "$data/models/llama/model.safetensors" "$work/index/"
  { printf '{"weight_map": {"x": "model.safetensors"}, "metadata": '; nested $depth '{"a": ' 1 '}'; printf '}'; } \
    > "$work/index/model.safetensors.index.json"
  fails_with INVALID_CHECKPOINT "$peftc" inspect "$work/index"

  { printf '{"_comment": '; nested $depth '[' '' ']'; printf '}'; } > "$work/table.json"
  fails_with INVALID_CONFIG "$peftc" translate --table "$work/table.json" model.layers.0.self_attn.q_proj
done
[ -e "$work/out" ] && fail "a refused merge left $work/out behind"

# A FIFO as adapter_config.json: nothing ever writes to it, so a blocking open would never return.
mkdir -p "$work/fifo"
cp "$data/adapters/llama_lora/adapter_model.safetensors" "$work/fifo/"
mkfifo "$work/fifo/adapter_config.json"
fails_with IO "$peftc" adapter inspect "$work/fifo"
fails_with IO "$peftc" merge --base "$data/models/llama" --adapter "$work/fifo" --out "$work/out"

echo "json limits: $checked checks, $failed failures"
[ $failed -eq 0 ]
