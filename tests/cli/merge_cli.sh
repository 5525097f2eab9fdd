#!/usr/bin/env bash
# peftc merge: usage, the summary, weights, dtypes, resharding, threads, and that failures leave the
# output as it was. Usage: bash merge_cli.sh path/to/peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must point at tests/fixtures}
base="$data/models/llama"
lora="$data/adapters/llama_lora"
second="$data/adapters/llama_lora_second"
for f in "$base/model.safetensors" "$lora/adapter_model.safetensors" "$second/adapter_model.safetensors"; do
  [ -e "$f" ] || { echo "SKIP: fixture $f is absent (run tests/fixtures/generate.py)"; exit 0; }
done
source "$(dirname "$0")/lib/checks.sh"
contains() { grep -qF -- "$2" "$1"; }
dtypes_of() { "$peftc" inspect "$1" | awk 'NF >= 4 && $2 ~ /^[A-Z0-9_]+$/ && $3 ~ /^\[/ {print $2}' | sort -u | tr '\n' ' '; }

# ---- usage -------------------------------------------------------------------------------------
check "no arguments is a usage error" exit_is 2 "$peftc" merge
# Without --base the adapter's base_model_name_or_path ("tests/fixtures/models/llama", relative to the
# repository) is used; from another folder, with an empty hub cache, it is neither a path nor an id.
mkdir -p "$work/empty_cache"
check "no --base and an unresolvable base_model_name_or_path is a usage error" \
  bash -c 'cd "$1" && HF_HUB_CACHE="$1/empty_cache" "$2" merge --adapter "$3" --out "$1/x" >/dev/null 2>&1; [ $? -eq 2 ]' _ "$work" "$peftc" "$lora"
check "no --adapter is a usage error" exit_is 2 "$peftc" merge --base "$base" --out "$work/x"
check "no --out is a usage error" exit_is 2 "$peftc" merge --base "$base" --adapter "$lora"
check "--dtype f8 is a usage error" exit_is 2 "$peftc" merge --base "$base" --adapter "$lora" --out "$work/x" --dtype f8
check "--dtype without a value" exit_is 2 "$peftc" merge --base "$base" --adapter "$lora" --out "$work/x" --dtype
check "--max-shard-size 5GiB is a usage error" exit_is 2 "$peftc" merge --base "$base" --adapter "$lora" --out "$work/x" --max-shard-size 5GiB
check "--threads -1 is a usage error" exit_is 2 "$peftc" merge --base "$base" --adapter "$lora" --out "$work/x" --threads -1
check "--threads 1.5 is a usage error" exit_is 2 "$peftc" merge --base "$base" --adapter "$lora" --out "$work/x" --threads 1.5
check "--tied-embeddings both is a usage error" exit_is 2 "$peftc" merge --base "$base" --adapter "$lora" --out "$work/x" --tied-embeddings both
check "--tied-embeddings without a value" exit_is 2 "$peftc" merge --base "$base" --adapter "$lora" --out "$work/x" --tied-embeddings
check "an unknown option is a usage error" exit_is 2 "$peftc" merge --base "$base" --adapter "$lora" --out "$work/x" --fast
check "a positional argument is a usage error" exit_is 2 "$peftc" merge "$base" --adapter "$lora" --out "$work/x"
check "usage errors create nothing" test ! -e "$work/x"
check "--help succeeds" exit_is 0 "$peftc" merge --help

# ---- a merge and its summary ---------------------------------------------------------------------
"$peftc" merge --base "$base" --adapter "$lora" --out "$work/one" >"$work/one.out" 2>"$work/one.err"
check "a merge succeeds" test $? -eq 0
check "the summary counts merged tensors" contains "$work/one.out" "tensors: 14 merged, 0 replaced, 7 copied (21 in all"
check "the summary lists the files" contains "$work/one.out" "files: model.safetensors config.json generation_config.json"
check "the summary names the adapter and its weight" contains "$work/one.out" "adapter $lora (weight 1)"
check "no progress bar when stderr is not a terminal" test ! -s "$work/one.err"
check "the output is a checkpoint" exit_is 0 "$peftc" inspect "$work/one"
check "config.json is copied as it is" cmp -s "$base/config.json" "$work/one/config.json"
check "the merge changes the model" bash -c "! cmp -s '$base/model.safetensors' '$work/one/model.safetensors'"

# A base without tied embeddings: both tied embeddings policies write the same bytes.
check "--tied-embeddings shared merges" exit_is 0 "$peftc" merge --base "$base" --adapter "$lora" --out "$work/one_shared" --tied-embeddings shared
check "... as the default untie on an untied base" cmp -s "$work/one/model.safetensors" "$work/one_shared/model.safetensors"

# DIR:WEIGHT, several adapters, and threads that do not change the result.
check "weighted adapters merge" exit_is 0 "$peftc" merge --base "$base" --adapter "$lora:0.5" --adapter "$second:-1.25" --out "$work/two" --threads 1
check "the same with all threads" exit_is 0 "$peftc" merge --base "$base" --adapter "$lora:0.5" --adapter "$second:-1.25" --out "$work/two_mt" --threads=0
check "threads do not change the bytes" cmp -s "$work/two/model.safetensors" "$work/two_mt/model.safetensors"
check "a weight changes the result" bash -c "! cmp -s '$work/one/model.safetensors' '$work/two/model.safetensors'"
"$peftc" merge --base "$base" --adapter "$lora:1" --out "$work/one_again" >/dev/null 2>&1
check "weight 1 equals no weight" cmp -s "$work/one/model.safetensors" "$work/one_again/model.safetensors"

# ---- dtype and shards ----------------------------------------------------------------------------
check "--dtype bf16 runs" exit_is 0 "$peftc" merge --base "$base" --adapter "$lora" --out "$work/bf16" --dtype bf16
check "every tensor became BF16" test "$(dtypes_of "$work/bf16")" = "BF16 "
check "config.json records the dtype" contains "$work/bf16/config.json" '"dtype": "bfloat16"'
check "--max-shard-size 10KB reshards" exit_is 0 "$peftc" merge --base "$base" --adapter "$lora" --out "$work/shards" --max-shard-size 10KB
check "the resharded output has an index" test -f "$work/shards/model.safetensors.index.json"
check "the resharded output has shards" test -f "$work/shards/model-00001-of-00003.safetensors"
check "the resharded output reads back" exit_is 0 "$peftc" inspect "$work/shards"

# ---- failures ------------------------------------------------------------------------------------
"$peftc" merge --base "$base" --adapter "$data/adapters/gpt2_lora" --out "$work/wrong" >/dev/null 2>"$work/wrong.err"
check "an adapter of another model fails with 1" test $? -eq 1
check "the error names the unresolved tensors" contains "$work/wrong.err" "peftc: error: UNRESOLVED_KEY:"
check "a failed merge creates nothing" test ! -e "$work/wrong"
check "a missing adapter fails with 1" exit_is 1 "$peftc" merge --base "$base" --adapter "$work/none" --out "$work/wrong"
check "a missing base fails with 1" exit_is 1 "$peftc" merge --base "$work/none" --adapter "$lora" --out "$work/wrong"
cp -r "$work/one" "$work/keep"
check "a failed merge into an existing folder fails" exit_is 1 "$peftc" merge --base "$base" --adapter "$data/adapters/gpt2_lora" --out "$work/keep"
check "... and leaves it as it was" cmp -s "$work/one/model.safetensors" "$work/keep/model.safetensors"
check "merging into the base folder is refused" exit_is 1 "$peftc" merge --base "$base" --adapter "$lora" --out "$base"

# ---- inputs that are refused (issue 13) -------------------------------------------------------------
mkdir -p "$work/linked"
cp "$base"/* "$work/linked/"
ln -s /etc/passwd "$work/linked/tokenizer.json"
"$peftc" merge --base "$work/linked" --adapter "$lora" --out "$work/linked_out" >/dev/null 2>"$work/linked.err"
check "a side file linked out of the base folder fails with 1" test $? -eq 1
check "... naming it" contains "$work/linked.err" "peftc: error: INVALID_CHECKPOINT: $work/linked/tokenizer.json"
check "... and writes nothing" test ! -e "$work/linked_out"
mkdir -p "$work/noconfig"
cp "$base/model.safetensors" "$work/noconfig/"
"$peftc" merge --base "$work/noconfig" --adapter "$lora" --out "$work/noconfig_out" >/dev/null 2>"$work/noconfig.err"
check "a base without config.json fails with 1" test $? -eq 1
check "... with NOT_FOUND naming config.json" contains "$work/noconfig.err" "peftc: error: NOT_FOUND:"
check "... unless --no-config" exit_is 0 "$peftc" merge --base "$work/noconfig" --adapter "$lora" --out "$work/noconfig_out" --no-config
check "... which writes no config.json" test ! -e "$work/noconfig_out/config.json"
mkdir -p "$work/huge"
cp "$lora/adapter_model.safetensors" "$work/huge/"
sed 's/"lora_alpha": *[0-9.e+-]*/"lora_alpha": 1e308/' "$lora/adapter_config.json" >"$work/huge/adapter_config.json"
"$peftc" merge --base "$base" --adapter "$work/huge" --out "$work/huge_out" >/dev/null 2>"$work/huge.err"
check "lora_alpha 1e308 fails with 1" test $? -eq 1
check "... with NON_FINITE" contains "$work/huge.err" "peftc: error: NON_FINITE:"
check "... and writes nothing" test ! -e "$work/huge_out"
sed 's/"lora_alpha": *[0-9.e+-]*/"lora_alpha": 4e12/' "$lora/adapter_config.json" >"$work/huge/adapter_config.json"
check "merged weights beyond f16 fail with 1" exit_is 1 "$peftc" merge --base "$base" --adapter "$work/huge" --out "$work/huge_out" --dtype f16
check "... unless --allow-nonfinite" exit_is 0 "$peftc" merge --base "$base" --adapter "$work/huge" --out "$work/huge_out" --dtype f16 --allow-nonfinite
sed 's/"r": *[0-9]*/"r": 9223372036854775808/' "$lora/adapter_config.json" >"$work/huge/adapter_config.json"
"$peftc" merge --base "$base" --adapter "$work/huge" --out "$work/huge_r" >/dev/null 2>"$work/huge_r.err"
check "r = 2^63 fails with 1" test $? -eq 1
check "... printed as written" contains "$work/huge_r.err" "is 9223372036854775808"

finish merge_cli
