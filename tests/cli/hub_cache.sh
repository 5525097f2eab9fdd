#!/usr/bin/env bash
# Model ids in the Hugging Face hub cache through peftc: `peftc resolve`, ids wherever a folder is
# taken (inspect, adapter inspect, merge), merge without --base, incomplete downloads, links leaving
# the repository, and the cache found through HF_HUB_CACHE, HF_HOME and ~/.cache. The cache is laid
# out here as huggingface_hub lays it out: blobs/<sha256>, snapshots/<commit>/<file> ->
# ../../blobs/<sha256>, refs/<name> holding the commit. Usage: bash hub_cache.sh path/to/peftc
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
same_model() { cmp -s "$1/model.safetensors" "$2/model.safetensors" && cmp -s "$1/config.json" "$2/config.json"; }
unset HF_HUB_CACHE HUGGINGFACE_HUB_CACHE HF_HOME XDG_CACHE_HOME

main=0123456789abcdef0123456789abcdef01234567
old=89abcdef0123456789abcdef0123456789abcdef

# lay CACHE REPO COMMIT FOLDER [REF...]: the files of FOLDER as snapshot COMMIT of REPO (org/name).
lay() {
  local cache=$1 repo=$2 commit=$3 folder=$4
  shift 4
  local root="$cache/models--${repo/\//--}" f blob
  mkdir -p "$root/blobs" "$root/refs" "$root/snapshots/$commit"
  for f in "$folder"/*; do
    blob=$(sha256sum "$f" | cut -d' ' -f1)
    cp "$f" "$root/blobs/$blob"
    ln -s "../../blobs/$blob" "$root/snapshots/$commit/$(basename "$f")"
  done
  for ref in "$@"; do printf %s "$commit" >"$root/refs/$ref"; done
}

hub="$work/hub"
lay "$hub" org/tiny "$main" "$base" main
lay "$hub" org/tiny-lora "$main" "$lora" main
lay "$hub" org/tiny-lora "$old" "$second" v1
# A sharded model, written by peftc itself (a merge resharded to 10 KB shards), and laid out too.
"$peftc" merge --base "$base" --adapter "$lora" --out "$work/sharded" --max-shard-size 10KB >/dev/null
lay "$hub" org/sharded "$main" "$work/sharded" main
# An adapter whose base_model_name_or_path is the id org/tiny.
mkdir -p "$work/by_id"
cp "$lora/adapter_model.safetensors" "$work/by_id/"
sed 's#"base_model_name_or_path": *"[^"]*"#"base_model_name_or_path": "org/tiny"#' "$lora/adapter_config.json" >"$work/by_id/adapter_config.json"
lay "$hub" org/by-id "$main" "$work/by_id" main
export HF_HUB_CACHE=$hub

# ---- peftc resolve ----------------------------------------------------------------------------------
check "resolve needs an argument" exit_is 2 "$peftc" resolve
check "resolve --help succeeds" exit_is 0 "$peftc" resolve --help
check "resolve org/name" test "$("$peftc" resolve org/tiny)" = "$hub/models--org--tiny/snapshots/$main"
check "resolve a tag" test "$("$peftc" resolve org/tiny-lora@v1)" = "$hub/models--org--tiny-lora/snapshots/$old"
check "resolve a short hash" test "$("$peftc" resolve org/tiny-lora@89abcde)" = "$hub/models--org--tiny-lora/snapshots/$old"
check "resolve a full hash" test "$("$peftc" resolve "org/tiny-lora@$main")" = "$hub/models--org--tiny-lora/snapshots/$main"
check "resolve an existing path" test "$("$peftc" resolve "$base")" = "$base"
"$peftc" resolve org/absent >/dev/null 2>"$work/absent.err"
check "an absent model fails with 1" test $? -eq 1
check "... NOT_FOUND naming the cache" contains "$work/absent.err" "peftc: error: NOT_FOUND: model \"org/absent\" is not in the Hugging Face hub cache \"$hub\""
check "... saying nothing is downloaded" contains "$work/absent.err" "downloads nothing"
"$peftc" resolve ../up >/dev/null 2>"$work/invalid.err"
check "a text that is no id fails with 1" test $? -eq 1
check "... INVALID_ARGUMENT" contains "$work/invalid.err" "peftc: error: INVALID_ARGUMENT: \"../up\" is neither an existing path nor a model id"

# ---- ids where folders are taken --------------------------------------------------------------------
check "inspect an id" exit_is 0 "$peftc" inspect org/tiny
check "inspect a sharded id" exit_is 0 "$peftc" inspect org/sharded
check "adapter inspect an id" exit_is 0 "$peftc" adapter inspect org/tiny-lora@v1
"$peftc" merge --base org/tiny --adapter org/tiny-lora --adapter org/tiny-lora@v1:0.5 --out "$work/ids" >/dev/null 2>"$work/ids.err"
check "a merge from ids succeeds" test $? -eq 0
check "... saying where the base id leads" contains "$work/ids.err" "base: org/tiny -> $hub/models--org--tiny/snapshots/$main"
check "... and where each adapter id leads" contains "$work/ids.err" "adapter: org/tiny-lora@v1 -> $hub/models--org--tiny-lora/snapshots/$old"
"$peftc" merge --base "$base" --adapter "$lora" --adapter "$second:0.5" --out "$work/paths" >/dev/null 2>"$work/paths.err"
check "the same merge from folders" test $? -eq 0
check "... says nothing on stderr" test ! -s "$work/paths.err"
check "merges from ids equal merges from folders" same_model "$work/ids" "$work/paths"
check "a merge from a sharded id" exit_is 0 "$peftc" merge --base org/sharded --adapter org/tiny-lora@v1 --out "$work/sharded_ids"
check "the same from the sharded folder" exit_is 0 "$peftc" merge --base "$work/sharded" --adapter "$second" --out "$work/sharded_paths"
check "... are equal shard by shard" diff -r "$work/sharded_ids" "$work/sharded_paths"

# ---- merge without --base -------------------------------------------------------------------------
"$peftc" merge --adapter org/by-id --out "$work/auto" >/dev/null 2>"$work/auto.err"
check "merge without --base uses base_model_name_or_path" test $? -eq 0
check "... and says which folder it resolved" contains "$work/auto.err" "base: org/tiny -> $hub/models--org--tiny/snapshots/$main"
"$peftc" merge --base "$base" --adapter "$lora" --out "$work/plain" >/dev/null
check "... which is the same merge as with --base" same_model "$work/auto" "$work/plain"
(cd "$work" && "$peftc" merge --adapter "$lora" --out "$work/none" >/dev/null 2>"$work/none.err")
check "an adapter naming a base found nowhere is a usage error" test $? -eq 2
check "... that says to pass --base" contains "$work/none.err" "merge needs --base"
check "... and names the base" contains "$work/none.err" "tests/fixtures/models/llama"

# ---- bare names (no namespace): merge takes them as ids as it takes base_model_name_or_path ---------
root_tiny="$hub/models--tinyllama"
mkdir -p "$root_tiny/snapshots" "$root_tiny/refs"
cp -r "$hub/models--org--tiny/blobs" "$root_tiny/blobs"
cp -P -r "$hub/models--org--tiny/snapshots/$main" "$root_tiny/snapshots/$main"
printf %s "$main" >"$root_tiny/refs/main"
(cd "$work" && "$peftc" merge --base tinyllama --adapter "$lora" --out "$work/bare" >/dev/null 2>"$work/bare.err")
check "merge --base with a bare name in the cache succeeds" test $? -eq 0
check "... says where it leads" contains "$work/bare.err" "base: tinyllama -> $root_tiny/snapshots/$main"
check "... and is the same merge" same_model "$work/bare" "$work/plain"

# ---- incomplete downloads and escapes ---------------------------------------------------------------
cp -r "$hub" "$work/broken"
snap="$work/broken/models--org--sharded/snapshots/$main"
blob=$(readlink -f "$snap/model-00002-of-00003.safetensors")
rm "$blob"
HF_HUB_CACHE="$work/broken" "$peftc" inspect org/sharded >/dev/null 2>"$work/blob.err"
check "a shard whose blob is missing fails with 1" test $? -eq 1
check "... NOT_FOUND naming the shard" contains "$work/blob.err" "peftc: error: NOT_FOUND: $snap/model-00002-of-00003.safetensors"
check "... saying the download is incomplete" contains "$work/blob.err" "into the Hugging Face hub cache is incomplete"
printf 'partial' >"$blob.incomplete"
HF_HUB_CACHE="$work/broken" "$peftc" merge --base org/sharded --adapter "$lora" --out "$work/partial_out" >/dev/null 2>"$work/partial.err"
check "with the partial blob beside it the merge fails with 1" test $? -eq 1
check "... naming the partial download" contains "$work/partial.err" "$blob.incomplete is a partial download"
check "... and writes nothing" test ! -e "$work/partial_out"
cp "$work/sharded/model-00002-of-00003.safetensors" "$blob" && rm "$blob.incomplete"
check "(with its blob back the snapshot reads)" exit_is 0 "$peftc" inspect "$snap"
rm "$snap/model-00003-of-00003.safetensors"
"$peftc" inspect "$snap" >/dev/null 2>"$work/missing.err"
check "a shard missing from the snapshot (by path) fails with 1" test $? -eq 1
check "... NOT_FOUND saying so" contains "$work/missing.err" "model-00003-of-00003.safetensors: the shard named by the index is missing from the snapshot"
mkdir -p "$work/plain_sharded"
cp "$work/sharded"/* "$work/plain_sharded/"
rm "$work/plain_sharded/model-00003-of-00003.safetensors"
"$peftc" inspect "$work/plain_sharded" >/dev/null 2>"$work/plain.err"
check "the same shard missing from a plain folder keeps its error" contains "$work/plain.err" "peftc: error: INVALID_CHECKPOINT: $work/plain_sharded/model-00003-of-00003.safetensors: the shard named by the index does not exist"
rm "$(readlink -f "$work/broken/models--org--tiny/snapshots/$main/model.safetensors")"
HF_HUB_CACHE="$work/broken" "$peftc" merge --base org/tiny --adapter "$lora" --out "$work/single_out" >/dev/null 2>"$work/single.err"
check "a single-file model whose blob is missing fails with 1" test $? -eq 1
check "... NOT_FOUND naming model.safetensors" contains "$work/single.err" "peftc: error: NOT_FOUND: $work/broken/models--org--tiny/snapshots/$main/model.safetensors: the weight file links to ../../blobs/"
check "... saying the download is incomplete" contains "$work/single.err" "the download of \"org/tiny\" into the Hugging Face hub cache is incomplete"
cp "$work/sharded/model-00001-of-00003.safetensors" "$work/outside.safetensors"
esc="$work/escape/models--org--sharded/snapshots/$main"
cp -r "$hub" "$work/escape"
rm "$esc/model-00001-of-00003.safetensors"
ln -s "../../../../outside.safetensors" "$esc/model-00001-of-00003.safetensors"
check "(the escaping link leads to a file)" test -f "$esc/model-00001-of-00003.safetensors"
HF_HUB_CACHE="$work/escape" "$peftc" inspect org/sharded >/dev/null 2>"$work/escape.err"
check "a link leaving the repository fails with 1" test $? -eq 1
check "... INVALID_CHECKPOINT saying where it leads" contains "$work/escape.err" "outside the hub cache repository folder"

# ---- where the cache is -----------------------------------------------------------------------------
mkdir -p "$work/home" "$work/hf_home"
lay "$work/home/.cache/huggingface/hub" org/at-home "$main" "$base" main
lay "$work/hf_home/hub" org/in-hf-home "$main" "$base" main
lay "$work/xdg/huggingface/hub" org/in-xdg "$main" "$base" main
unset HF_HUB_CACHE
check "~/.cache/huggingface/hub by default" test "$(HOME=$work/home "$peftc" resolve org/at-home)" = "$work/home/.cache/huggingface/hub/models--org--at-home/snapshots/$main"
check "HF_HOME/hub" test "$(HOME=$work/home HF_HOME=$work/hf_home "$peftc" resolve org/in-hf-home)" = "$work/hf_home/hub/models--org--in-hf-home/snapshots/$main"
check "HF_HOME replaces the default" exit_is 1 env HOME="$work/home" HF_HOME="$work/hf_home" "$peftc" resolve org/at-home
check "XDG_CACHE_HOME/huggingface/hub" test "$(HOME=$work/home XDG_CACHE_HOME=$work/xdg "$peftc" resolve org/in-xdg)" = "$work/xdg/huggingface/hub/models--org--in-xdg/snapshots/$main"
check "HF_HUB_CACHE with ~" test "$(HOME=$work HF_HUB_CACHE='~/hub' "$peftc" resolve org/tiny)" = "$hub/models--org--tiny/snapshots/$main"
check "a merge by id from the default cache" exit_is 0 env HOME="$work/home" "$peftc" merge --base org/at-home --adapter "$lora" --out "$work/home_out"
check "... equals the merge from the folder" same_model "$work/home_out" "$work/plain"

finish hub_cache
