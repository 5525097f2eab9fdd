#!/usr/bin/env bash
# peftc convert: options, dtype conversion, resharding, layout-preserving folder rewrites, and that
# a failed run leaves OUT as it was. Usage: bash convert_options.sh path/to/peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must point at tests/fixtures}
model="$data/models/llama/model.safetensors"
sharded="$data/safetensors/sharded"
dtypes="$data/safetensors/all_dtypes.safetensors"
for f in "$model" "$sharded/model.safetensors.index.json" "$dtypes"; do
  [ -e "$f" ] || { echo "SKIP: fixture $f is absent (run tests/fixtures/generate.py)"; exit 0; }
done
source "$(dirname "$0")/lib/checks.sh"
# The dtypes of `peftc inspect` output lines, sorted and unique.
dtypes_of() { "$peftc" inspect "$1" | awk 'NF >= 4 && $2 ~ /^[A-Z0-9_]+$/ && $3 ~ /^\[/ {print $2}' | sort -u | tr '\n' ' '; }
tensor_count() { "$peftc" inspect "$1" | head -1 | awk '{print $1}'; }

# ---- usage -------------------------------------------------------------------------------------
check "no arguments is a usage error" exit_is 2 "$peftc" convert
check "one argument is a usage error" exit_is 2 "$peftc" convert "$model"
check "three positionals are a usage error" exit_is 2 "$peftc" convert "$model" a b
check "--dtype f8 is a usage error" exit_is 2 "$peftc" convert "$model" "$work/x" --dtype f8
check "--dtype without a value" exit_is 2 "$peftc" convert "$model" "$work/x" --dtype
check "--max-shard-size 5GiB is a usage error" exit_is 2 "$peftc" convert "$model" "$work/x" --max-shard-size 5GiB
check "--max-shard-size 0 is a usage error" exit_is 2 "$peftc" convert "$model" "$work/x" --max-shard-size 0
check "--max-shard-size abcMB is a usage error" exit_is 2 "$peftc" convert "$model" "$work/x" --max-shard-size abcMB
check "an unknown option is a usage error" exit_is 2 "$peftc" convert "$model" "$work/x" --frobnicate
check "usage errors create nothing" test ! -e "$work/x"
check "a missing input fails with 1" exit_is 1 "$peftc" convert "$work/missing.safetensors" "$work/x"
check "a missing input creates nothing" test ! -e "$work/x"
check "--help succeeds" exit_is 0 "$peftc" convert --help

# ---- dtype conversion ----------------------------------------------------------------------------
check "--dtype bf16 runs" exit_is 0 "$peftc" convert "$model" "$work/bf16.safetensors" --dtype bf16
check "every float tensor became BF16" test "$(dtypes_of "$work/bf16.safetensors")" = "BF16 "
check "bf16 keeps every tensor" test "$(tensor_count "$work/bf16.safetensors")" = "$(tensor_count "$model")"
check "--dtype=f32 (with =) converts back" exit_is 0 "$peftc" convert "$work/bf16.safetensors" "$work/f32.safetensors" --dtype=f32
check "every tensor is F32 again" test "$(dtypes_of "$work/f32.safetensors")" = "F32 "
check "f16 of all dtypes runs" exit_is 0 "$peftc" convert "$dtypes" "$work/f16.safetensors" --dtype f16
# F64/F32/BF16 become F16; integers, BOOL, C64 and the small floats (F8, F4) are copied.
before=$(dtypes_of "$dtypes")
after=$(dtypes_of "$work/f16.safetensors")
expected=$(for d in $before; do case $d in F64|F32|BF16|F16) echo F16 ;; *) echo "$d" ;; esac; done | sort -u | tr '\n' ' ')
check "only floating dtypes convert ($after)" test "$after" = "$expected"
check "metadata is kept" test "$("$peftc" inspect "$model" | grep -c '^  metadata format = pt')" = \
  "$("$peftc" inspect "$work/bf16.safetensors" | grep -c '^  metadata format = pt')"

# ---- resharding ------------------------------------------------------------------------------------
check "--max-shard-size 8KB runs" exit_is 0 "$peftc" convert "$model" "$work/ckpt" --max-shard-size 8KB
check "the folder has an index" test -f "$work/ckpt/model.safetensors.index.json"
check "the shards are named model-XXXXX-of-XXXXX" test "$(ls "$work/ckpt" | grep -c '^model-[0-9]\{5\}-of-[0-9]\{5\}\.safetensors$')" -ge 3
check "the folder holds every tensor" test "$(tensor_count "$work/ckpt")" = "$(tensor_count "$model")"
check "no temporary is left" test -z "$(ls -A "$work/ckpt" | grep peft-tmp)"
# A folder without a limit keeps its layout: every shard and the index come out identical.
check "folder to folder runs" exit_is 0 "$peftc" convert "$work/ckpt" "$work/ckpt_copy"
for f in "$work/ckpt"/*; do
  check "$(basename "$f") is reproduced" cmp -s "$f" "$work/ckpt_copy/$(basename "$f")"
done
check "the copy has no extra file" test "$(ls "$work/ckpt" | wc -l)" = "$(ls "$work/ckpt_copy" | wc -l)"
# Back to one shard: the result is the original model.safetensors, byte for byte, and the old
# layout's shards and index are gone.
check "resharding in place to 1GB runs" exit_is 0 "$peftc" convert "$work/ckpt" "$work/ckpt" --max-shard-size 1GB
check "one model.safetensors is left" test "$(ls "$work/ckpt")" = "model.safetensors"
check "it equals the original" cmp -s "$model" "$work/ckpt/model.safetensors"
check "sizes in any case and with decimals" exit_is 0 "$peftc" convert "$model" "$work/ckpt2" --max-shard-size " 0.0045mb"
check "0.0045mb is 4500 bytes: several shards" test "$(ls "$work/ckpt2" | grep -c '^model-')" -ge 5
check "plain bytes work too" exit_is 0 "$peftc" convert "$model" "$work/ckpt3" --max-shard-size 4500
check "and give the same layout" diff -r "$work/ckpt2" "$work/ckpt3"

# transformers' own sharded save: shards and index reproduced exactly.
check "the transformers fixture converts" exit_is 0 "$peftc" convert "$sharded" "$work/tf"
for f in "$sharded"/*.safetensors "$sharded"/model.safetensors.index.json; do
  check "transformers' $(basename "$f") is reproduced" cmp -s "$f" "$work/tf/$(basename "$f")"
done

# ---- failures leave OUT as it was ----------------------------------------------------------------
cp "$model" "$work/keep.safetensors"
printf 'not a safetensors file' >"$work/bad.safetensors"
check "a bad input fails with 1" exit_is 1 "$peftc" convert "$work/bad.safetensors" "$work/keep.safetensors"
check "OUT is unchanged after a failure" cmp -s "$model" "$work/keep.safetensors"
check "an output in a missing folder fails with 1" exit_is 1 "$peftc" convert "$model" "$work/no/such/dir/x.safetensors"
check "no temporary is left anywhere" test -z "$(find "$work" -name '*.peft-tmp-*')"

finish convert_options
