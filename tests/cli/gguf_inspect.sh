#!/usr/bin/env bash
# peftc inspect on GGUF files: the typed metadata and the tensors (text and --json), a
# block-quantized tensor shown by its ggml type, malformed files refused with their codes, and the
# adapter conversions refusing a base that does not exist.
# (Merges and exports against llama.cpp are tests/interop/test_gguf_lora.py.)
# Usage: bash gguf_inspect.sh path/to/peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must point at tests/fixtures}
sample="$data/gguf/bindings_sample.gguf"
[ -e "$sample" ] || { echo "SKIP: fixture $sample is absent"; exit 0; }
source "$(dirname "$0")/lib/checks.sh"
contains() { grep -qF -- "$2" "$1"; }

"$peftc" inspect "$sample" >"$work/text" 2>"$work/text.err"
check "inspect succeeds" test $? -eq 0
check "the version and entry count" contains "$work/text" "GGUF version 3, 14 metadata entries"
check "a typed string" contains "$work/text" 'general.architecture (string) = "llama"'
check "a u64 beyond int64" contains "$work/text" "a.u64 (u64) = 18446744073709551615"
check "an array of strings" contains "$work/text" 'a.tokens (array of string) = ["<s>","","hello"]'
check "the F16 tensor, outermost first" bash -c "grep -E '^w +F16 +\[2, 3\]' '$work/text' >/dev/null"
check "the Q8_0 tensor by its ggml type" bash -c "grep -E '^q +Q8_0 +\[1, 32\] +\[64, 98\)' '$work/text' >/dev/null"

"$peftc" inspect "$sample" --json >"$work/json"
check "inspect --json succeeds" test $? -eq 0
check "the JSON says what the file holds" python3 - "$work/json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
meta = doc["metadata"]
assert doc["format"] == "gguf" and doc["version"] == 3, doc
assert list(meta)[:2] == ["general.architecture", "general.alignment"], list(meta)
assert meta["general.alignment"] == {"type": "u32", "value": 64}
assert meta["a.f32"] == {"type": "f32", "value": 1.5}
assert meta["a.bool"] == {"type": "bool", "value": True}
assert meta["a.i64"] == {"type": "i64", "value": -5}
assert meta["a.ids"] == {"type": "array", "element_type": "i32", "value": [10, -20]}
q = doc["tensors"][1]
assert q == {"name": "q", "dtype": "Q8_0", "shape": [1, 32], "data_offsets": [64, 98], "ggml_type": "Q8_0"}, q
PY

malformed="$data/malformed/gguf"
"$peftc" inspect "$malformed/offset_overlap.gguf" >/dev/null 2>"$work/overlap.err"
check "overlapping offsets: exit 1" test $? -eq 1
check "overlapping offsets: INVALID_OFFSET" contains "$work/overlap.err" "peftc: error: INVALID_OFFSET: "
"$peftc" inspect "$malformed/truncated_at_28.gguf" >/dev/null 2>"$work/trunc.err"
check "a truncated header: exit 1" test $? -eq 1
check "a truncated header names the file" contains "$work/trunc.err" "truncated_at_28.gguf"

# The adapter conversions name a base that is neither a GGUF file nor a model folder.
adapter="$data/adapters/llama_lora"
"$peftc" adapter export "$adapter" "$work/out.gguf" --format gguf --base "$work/no-such-base" >/dev/null 2>"$work/nobase.err"
check "export with a missing base: exit 1" test $? -eq 1
check "export with a missing base: NOT_FOUND naming it" contains "$work/nobase.err" "NOT_FOUND: base model"
check "export with a missing base writes nothing" test ! -e "$work/out.gguf"
"$peftc" adapter export "$adapter" "$work/lora.gguf" --format gguf --base "$data/models/llama" >/dev/null 2>&1
check "export with the fixture base succeeds" test $? -eq 0
"$peftc" adapter export "$work/lora.gguf" "$work/out_dir" --format peft --base "$work/no-such-base.gguf" \
  >/dev/null 2>"$work/nobase2.err"
check "import with a missing base: exit 1" test $? -eq 1
check "import with a missing base: NOT_FOUND naming it" contains "$work/nobase2.err" \
  "NOT_FOUND: base model \"$work/no-such-base.gguf\""

finish gguf_inspect
