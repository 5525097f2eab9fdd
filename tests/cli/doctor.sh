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

# ---- what the doctor cannot read or write is a problem or an error, never a crash -------------------
# Safetensors files built with the standard library: (key, dtype, shape, raw bytes) in order.
write_st() {
  python3 - "$@" <<'EOF'
import json, struct, sys
out, mode, source = sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None
tensors = []
if mode == "duplicate":  # source's tensors plus an unprefixed lora_B holding other values
    blob = open(source, "rb").read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    header.pop("__metadata__", None)
    for key, info in header.items():
        start, end = info["data_offsets"]
        tensors.append((key, info["dtype"], info["shape"], blob[8 + n + start:8 + n + end]))
    tensors.append(("model.layers.0.self_attn.q_proj.lora_B.weight", "F32", [16, 4], struct.pack("<f", 1.5) * 64))
elif mode == "huge":  # zero-byte factors of rank 2^64-1
    tensors = [("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", "F32", [2**64 - 1, 0], b""),
               ("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", "F32", [0, 2**64 - 1], b"")]
else:  # kohya q_proj with alpha = float(mode)
    m = "lora_te_model_layers_0_self_attn_q_proj"
    tensors = [(m + ".lora_down.weight", "F32", [4, 16], bytes(256)), (m + ".lora_up.weight", "F32", [16, 4], bytes(256)),
               (m + ".alpha", "F32", [], struct.pack("<f", float(mode)))]
header, offset, data = {}, 0, b""
for key, dtype, shape, raw in tensors:
    header[key] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
    offset += len(raw)
    data += raw
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(out, "wb").write(struct.pack("<Q", len(text)) + text + data)
EOF
}
is_json() { local text; text=$("$@" 2>/dev/null); python3 -c 'import json, sys; json.loads(sys.stdin.read(), parse_constant=lambda c: sys.exit(1))' <<<"$text" 2>/dev/null; }
mkdir -p "$work/inf" "$work/nan" "$work/huge"
write_st "$work/inf/adapter_model.safetensors" inf
cp "$adapters/llama_lora/adapter_config.json" "$work/inf/"
write_st "$work/nan/adapter_model.safetensors" nan
write_st "$work/huge/adapter_model.safetensors" huge
sed 's/"use_rslora": false/"use_rslora": true/' "$adapters/llama_lora/adapter_config.json" >"$work/huge/adapter_config.json"
check "an infinite kohya alpha is a problem (1), not a crash" exit_is 1 "$peftc" doctor --adapter "$work/inf" --base "$models/llama"
check "its kind is invalid_value" output_has '"kind": "invalid_value"' "$peftc" doctor --json --adapter "$work/inf" --base "$models/llama"
check "the report is JSON (no Infinity)" is_json "$peftc" doctor --json --adapter "$work/inf" --base "$models/llama"
check "--fix of it: 1" exit_is 1 "$peftc" doctor --adapter "$work/inf" --base "$models/llama" --fix "$work/inf_fixed"
check "--fix writes no Infinity" bash -c "! grep -q Infinity '$work/inf_fixed/adapter_config.json'"
check "a NaN alpha without a config is a problem (1)" exit_is 1 "$peftc" doctor --adapter "$work/nan" --base "$models/llama"
check "the report is JSON (no NaN)" is_json "$peftc" doctor --json --adapter "$work/nan" --base "$models/llama"
check "a rank of 2^64-1 is a problem (1)" exit_is 1 "$peftc" doctor --adapter "$work/huge" --base "$models/llama"
check "the report is JSON" is_json "$peftc" doctor --json --adapter "$work/huge" --base "$models/llama"

# ---- --fix writes a copy elsewhere: never over the adapter, the base or a hub snapshot --------------
cp -r "$adapters/llama_lora" "$work/own"
cp -r "$models/llama" "$work/base_copy"
mkdir -p "$work/hub/models--org--name/snapshots/0123abcd"
check "--fix onto the adapter folder is an error (2)" exit_is 2 "$peftc" doctor --adapter "$work/own" --fix "$work/own"
check "it says why" output_has "is the adapter folder itself" "$peftc" doctor --adapter "$work/own" --fix "$work/own/"
check "--fix onto the base folder is an error (2)" exit_is 2 "$peftc" doctor --adapter "$work/own" --base "$work/base_copy" --fix "$work/base_copy"
check "nothing written into the base" absent "$work/base_copy/adapter_config.json"
check "--fix into a hub snapshot is an error (2)" \
  exit_is 2 "$peftc" doctor --adapter "$work/own" --fix "$work/hub/models--org--name/snapshots/0123abcd/x"
check "nothing written into the snapshot" absent "$work/hub/models--org--name/snapshots/0123abcd/x"

# ---- keys whose renames collide stay as found ---------------------------------------------------------
mkdir -p "$work/dup"
cp "$adapters/llama_lora/adapter_config.json" "$work/dup/"
write_st "$work/dup/adapter_model.safetensors" duplicate "$adapters/llama_lora/adapter_model.safetensors"
check "a duplicate key is a problem (1)" exit_is 1 "$peftc" doctor --adapter "$work/dup" --base "$models/llama"
check "--fix keeps both and the copy reports it (1)" exit_is 1 "$peftc" doctor --adapter "$work/dup" --base "$models/llama" --fix "$work/dup_fixed"
check "the copy's remaining problem is duplicate_key" \
  output_has '"kind": "duplicate_key"' "$peftc" doctor --json --adapter "$work/dup_fixed" --base "$models/llama"

finish doctor
