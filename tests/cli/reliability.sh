#!/usr/bin/env bash
# The second hostile pass over peftc (docs/reliability.md): FIFOs where a file is sniffed, reports of
# non-finite merges, outputs that are inputs, non-finite results of conversions, JSON output of
# strings that are not UTF-8, and temporaries of killed single-file writes.
# Usage: bash reliability.sh path/to/peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must point at tests/fixtures}
models="$data/models"
adapters="$data/adapters"
q8="$data/gguf/bindings_q8_0.gguf"
q8_lora="$data/gguf/bindings_q8_0_lora"
for f in "$models/llama/model.safetensors" "$adapters/llama_lora/adapter_model.safetensors" "$q8"; do
  [ -e "$f" ] || { echo "SKIP: fixture $f is absent (run tests/fixtures/generate.py)"; exit 0; }
done
source "$(dirname "$0")/lib/checks.sh"
err_has() { grep -qF -- "$2" "$1"; }
# exits_within CODE COMMAND...: COMMAND ends within 20 s with CODE (124 means it hung)
exits_within() {
  local want=$1
  shift
  timeout 20 "$@" >/dev/null 2>&1 </dev/null
  [ $? -eq "$want" ]
}

# ---- 1. a FIFO named *.gguf is never sniffed with a blocking open --------------------------------
mkfifo "$work/fifo.gguf"
check "a FIFO as --base is refused at once" exits_within 1 "$peftc" merge --base "$work/fifo.gguf" --adapter "$q8_lora" --out "$work/f1.gguf"
check "a FIFO as a lenient adapter is refused at once" exits_within 1 "$peftc" merge --base "$q8" --adapter "$work/fifo.gguf" --lenient --out "$work/f2.gguf"
check "a FIFO as the input of a GGUF import is refused at once" exits_within 1 "$peftc" adapter export "$work/fifo.gguf" "$work/f3" --base "$q8"
check "a FIFO as the adapter of a merge is refused at once" exits_within 1 "$peftc" merge --base "$q8" --adapter "$work/fifo.gguf" --out "$work/f4.gguf"

# ---- 2. merge --allow-nonfinite --report with a NaN figure --------------------------------------
lora_b=base_model.model.model.layers.0.mlp.down_proj.lora_B.weight
nan_lora() {  # nan_lora DIR VALUE INDEX...: the Q8_0 fixture's LoRA with lora_B elements set to VALUE
  local dir=$1 value=$2
  shift 2
  mkdir -p "$dir"
  cp "$q8_lora/adapter_config.json" "$dir/"
  python3 "$(dirname "$0")/lib/hostile_files.py" set-values "$q8_lora/adapter_model.safetensors" \
    "$dir/adapter_model.safetensors" "$lora_b" "$value" "$@"
}
nan_lora "$work/nan_row" nan 0
"$peftc" merge --base "$q8" --adapter "$work/nan_row" --out "$work/r.gguf" --allow-nonfinite --report >"$work/r.out" 2>"$work/r.err"
check "--report with a NaN figure exits 0" test $? -eq 0
check "and prints the figure as nan" err_has "$work/r.out" "nan"
check "and writes the output" test -s "$work/r.gguf"

# ---- 6. a declared expert count is not trusted to size anything ---------------------------------
cp -r "$models/mixtral" "$work/mx"
python3 -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c['num_local_experts']=2**32-1; json.dump(c,open(p,'w'))" "$work/mx/config.json"
python3 "$(dirname "$0")/lib/hostile_files.py" lora "$work/expert0" model.layers.0.block_sparse_moe.experts.0.w1 32 16
timeout 20 "$peftc" adapter export "$work/expert0" "$work/mx.gguf" --format gguf --base "$work/mx" >/dev/null 2>"$work/mx.err"
check "num_local_experts = 2^32-1 is refused at once" test $? -eq 1
check "naming a few missing experts and counting the rest" err_has "$work/mx.err" "expert(s) 1, 2, 3, 4, 5, 6, 7, 8 and 4294967286 more"

# ---- 7. an output that is an input is refused, by file identity ----------------------------------
refused_as_input() {  # refused_as_input FILE COMMAND...: exit 1, INVALID_ARGUMENT, FILE unchanged
  local file=$1
  shift
  local before
  before=$(cksum <"$file")
  "$@" >/dev/null 2>"$work/same.err"
  [ $? -eq 1 ] && grep -qF "INVALID_ARGUMENT" "$work/same.err" && [ "$(cksum <"$file")" = "$before" ]
}
cp -r "$adapters/llama_lora" "$work/lora_in"
cp "$q8" "$work/q8.gguf"
"$peftc" adapter export "$q8_lora" "$work/q8_lora.gguf" --format gguf --base "$work/q8.gguf" >/dev/null 2>&1
check "merge --out = the GGUF LoRA merged" refused_as_input "$work/q8_lora.gguf" \
  "$peftc" merge --base "$work/q8.gguf" --adapter "$work/q8_lora.gguf" --out "$work/q8_lora.gguf"
ln "$work/q8_lora.gguf" "$work/q8_lora_link.gguf"
check "merge --out = a second link of the GGUF LoRA" refused_as_input "$work/q8_lora.gguf" \
  "$peftc" merge --base "$work/q8.gguf" --adapter "$work/q8_lora.gguf" --out "$work/q8_lora_link.gguf"
cp -r "$q8_lora" "$work/q8_lora_dir"
check "export --format gguf with OUT = the --base GGUF" refused_as_input "$work/q8.gguf" \
  "$peftc" adapter export "$work/q8_lora_dir" "$work/q8.gguf" --format gguf --base "$work/q8.gguf"
check "export --format gguf with OUT = the adapter's own safetensors" refused_as_input "$work/q8_lora_dir/adapter_model.safetensors" \
  "$peftc" adapter export "$work/q8_lora_dir" "$work/q8_lora_dir/adapter_model.safetensors" --format gguf --base "$work/q8.gguf"
check "adapter export with OUT = IN" refused_as_input "$work/lora_in/adapter_model.safetensors" \
  "$peftc" adapter export "$work/lora_in" "$work/lora_in" --dtype bf16
ln -s "$work/lora_in" "$work/lora_in_link"
check "adapter export with OUT = a link to IN" refused_as_input "$work/lora_in/adapter_model.safetensors" \
  "$peftc" adapter export "$work/lora_in" "$work/lora_in_link" --dtype bf16
check "adapter convert with OUT = IN" refused_as_input "$work/lora_in/adapter_model.safetensors" \
  "$peftc" adapter convert "$work/lora_in" "$work/lora_in" --to lora --rank 2
check "adapter combine with OUT = an input" refused_as_input "$work/lora_in/adapter_model.safetensors" \
  "$peftc" adapter combine --adapter "$work/lora_in:1" --method cat --out "$work/lora_in"
cp -r "$models/llama" "$work/llama_in"
"$peftc" merge --base "$models/llama" --adapter "$adapters/llama_lora" --out "$work/tuned" >/dev/null 2>&1
check "extract --out into the base folder" refused_as_input "$work/llama_in/model.safetensors" \
  "$peftc" adapter extract --base "$work/llama_in" --tuned "$work/tuned" --out "$work/llama_in" --rank 2
check "and nothing is added beside the model" test ! -e "$work/llama_in/adapter_config.json"
check "merge --out = the adapter folder" refused_as_input "$work/lora_in/adapter_model.safetensors" \
  "$peftc" merge --base "$models/llama" --adapter "$work/lora_in" --out "$work/lora_in"
check "import of a GGUF LoRA into the folder of its base" refused_as_input "$work/q8.gguf" \
  "$peftc" adapter export "$work/q8_lora.gguf" "$(dirname "$work/q8.gguf")" --base "$work/q8.gguf"

# ---- 8. a GGUF LoRA whose alpha is not finite is refused ----------------------------------------
for alpha in nan inf; do
  python3 "$(dirname "$0")/lib/hostile_files.py" gguf-f32 "$work/q8_lora.gguf" "$work/alpha_$alpha.gguf" adapter.lora.alpha "$alpha"
  "$peftc" adapter export "$work/alpha_$alpha.gguf" "$work/imported_$alpha" --base "$work/q8.gguf" >/dev/null 2>"$work/alpha.err"
  check "importing a GGUF LoRA with alpha $alpha fails" test $? -eq 1
  check "as INVALID_CHECKPOINT naming adapter.lora.alpha" err_has "$work/alpha.err" "adapter.lora.alpha"
  check "and writes no config" test ! -e "$work/imported_$alpha/adapter_config.json"
  check "merging it fails too" exit_is 1 "$peftc" merge --base "$work/q8.gguf" --adapter "$work/alpha_$alpha.gguf" --out "$work/alpha_$alpha.out.gguf"
done

# ---- 10. inspect --json prints valid UTF-8 for a GGUF string value that is not -------------------
# "llama" -> "ll\xffma" (a byte that is never UTF-8) and "\xc0\xae" (an overlong form)
python3 "$(dirname "$0")/lib/hostile_files.py" replace "$q8" "$work/bad_utf8.gguf" 6c6c616d61 6c6cffc0ae
"$peftc" inspect "$work/bad_utf8.gguf" --json >"$work/bad_utf8.json" 2>/dev/null
check "inspect --json of a non-UTF-8 GGUF string succeeds" test $? -eq 0
check "and prints strict UTF-8 JSON" python3 -c "import json,sys; json.loads(open(sys.argv[1],'rb').read().decode('utf-8','strict'))" "$work/bad_utf8.json"
check "with U+FFFD for each bad byte" python3 -c "import json,sys; t=open(sys.argv[1],'rb').read().decode(); assert 'll\ufffd\ufffd\ufffd' in t, t" "$work/bad_utf8.json"

# ---- 9. non-finite results of conversions from finite input are refused -------------------------
hostile="$(dirname "$0")/lib/hostile_files.py"
q_proj=model.layers.0.self_attn.q_proj.weight
# every element of a 16 x 16 delta 2e38 (finite): its singular value 3.2e39 is not
cp -r "$models/llama" "$work/huge_tuned"
python3 "$hostile" set-values "$models/llama/model.safetensors" "$work/huge_tuned/model.safetensors" "$q_proj" 2e38 $(seq 0 255)
"$peftc" adapter extract --base "$models/llama" --tuned "$work/huge_tuned" --out "$work/huge_lora" --rank 2 --modules q_proj >/dev/null 2>"$work/huge.err"
check "extract with a singular value beyond f32 fails" test $? -eq 1
check "as NON_FINITE" err_has "$work/huge.err" "NON_FINITE"
check "and writes nothing" test ! -e "$work/huge_lora/adapter_model.safetensors"
cp -r "$adapters/llama_lora" "$work/big_lora"
python3 "$hostile" set-values "$adapters/llama_lora/adapter_model.safetensors" "$work/big_lora/adapter_model.safetensors" \
  base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight 1e5 3
"$peftc" adapter export "$work/big_lora" "$work/big_f16" --dtype f16 >/dev/null 2>"$work/big.err"
check "export --dtype f16 of a factor beyond 65504 fails" test $? -eq 1
check "as NON_FINITE naming the tensor" err_has "$work/big.err" "NON_FINITE: tensor \"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight\" holds 100000.0, which is not finite in F16"
check "and writes nothing" test ! -e "$work/big_f16/adapter_model.safetensors"
check "the same export to bf16 succeeds" exit_is 0 "$peftc" adapter export "$work/big_lora" "$work/big_bf16" --dtype bf16

# ---- 3. the finiteness rule on the merged values before any quantizer -----------------------------
# lora_A[0][0] = NaN: column 0 of the merged [16, 32] weight is NaN, the first of each 32-value Q8_0
# block (the quantizer stored it as 0 and the merge exited 0)
mkdir -p "$work/nan_col"
cp "$q8_lora/adapter_config.json" "$work/nan_col/"
python3 "$(dirname "$0")/lib/hostile_files.py" set-values "$q8_lora/adapter_model.safetensors" \
  "$work/nan_col/adapter_model.safetensors" base_model.model.model.layers.0.mlp.down_proj.lora_A.weight nan 0
for quant in keep q8_0 q4_0 iq4_nl; do
  extra=()
  [ $quant = keep ] || extra=(--quant "$quant")
  "$peftc" merge --base "$q8" --adapter "$work/nan_col" --out "$work/nan_$quant.gguf" "${extra[@]}" >/dev/null 2>"$work/nan.err"
  check "a NaN inside a block ($quant) fails" test $? -eq 1
  check "as NON_FINITE ($quant)" err_has "$work/nan.err" "NON_FINITE"
  check "writing nothing ($quant)" test ! -e "$work/nan_$quant.gguf"
  check "--allow-nonfinite writes it ($quant)" exit_is 0 "$peftc" merge --base "$q8" --adapter "$work/nan_col" --out "$work/nan_$quant.gguf" "${extra[@]}" --allow-nonfinite
done

# ---- 11. a single-file write removes the temporaries killed writes to it left --------------------
# (what `kill -9` during a GGUF write leaves: ".<name>.peft-tmp-XXXXXX" beside the target)
head -c 4096 /dev/zero >"$work/.stale.gguf.peft-tmp-Ab12cD"
head -c 4096 /dev/zero >"$work/.other.gguf.peft-tmp-Ab12cD"
check "a merge into stale.gguf succeeds" exit_is 0 "$peftc" merge --base "$q8" --adapter "$q8_lora" --out "$work/stale.gguf"
check "and removes the old temporary of stale.gguf" test ! -e "$work/.stale.gguf.peft-tmp-Ab12cD"
check "but not that of another file" test -e "$work/.other.gguf.peft-tmp-Ab12cD"

# ---- 13. caveats ---------------------------------------------------------------------------------
"$peftc" adapter extract --base "$models/llama" --tuned "$work/tuned" --out "$work/t" --rank 2 --threads 100000 >/dev/null 2>"$work/threads.err"
check "--threads 100000 is a usage error (2)" test $? -eq 2
check "that names the range" err_has "$work/threads.err" "from 0 (all cores) to 4096, not '100000'"

# a GGUF bool stored as a byte other than 0 and 1 is refused, naming the key (it read as true and
# was written back as 1)
for shape in scalar array; do
  python3 "$hostile" gguf-bool "$work/bool_$shape.gguf" 2 $([ $shape = array ] && echo array)
  "$peftc" inspect "$work/bool_$shape.gguf" >/dev/null 2>"$work/bool.err"
  check "a GGUF bool $shape holding 2 is refused" test $? -eq 1
  check "as INVALID_HEADER ($shape)" err_has "$work/bool.err" "INVALID_HEADER"
  check "naming the key ($shape)" err_has "$work/bool.err" "key \"flag\""
done
python3 "$hostile" gguf-bool "$work/bool_ok.gguf" 1 array
check "a GGUF bool array of 0 and 1 is read" exit_is 0 "$peftc" inspect "$work/bool_ok.gguf"

# a GGUF LoRA is not a base: import, export and merge refuse it as --base
"$peftc" adapter export "$work/q8_lora.gguf" "$work/lora_base" --base "$work/q8_lora.gguf" >/dev/null 2>"$work/lb.err"
check "importing a GGUF LoRA against a GGUF LoRA as --base fails" test $? -eq 1
check "as INVALID_ARGUMENT saying the base is an adapter" err_has "$work/lb.err" "INVALID_ARGUMENT: \"$work/q8_lora.gguf\" is a GGUF adapter (general.type is \"adapter\"), not a model"
check "and writes nothing" test ! -e "$work/lora_base/adapter_config.json"
check "export --format gguf with a GGUF LoRA as --base fails" exit_is 1 "$peftc" adapter export "$q8_lora" "$work/lb.gguf" --format gguf --base "$work/q8_lora.gguf"
"$peftc" merge --base "$work/q8_lora.gguf" --adapter "$q8_lora" --out "$work/lb_merged.gguf" >/dev/null 2>"$work/lb.err"
check "merge with a GGUF LoRA as --base fails as INVALID_ARGUMENT" err_has "$work/lb.err" "is a GGUF adapter"

# a merge weight beyond the f32 range is refused as INVALID_ARGUMENT naming it (it was reported as
# "weight 1.0 times scale inf"); a weight in range whose llama.cpp scale overflows is NON_FINITE, named
for base_adapter in "$q8:$work/q8_lora.gguf" "$q8:$q8_lora" "$models/llama:$adapters/llama_lora"; do
  "$peftc" merge --base "${base_adapter%%:*}" --adapter "${base_adapter#*:}:1e39" --out "$work/w.out" >/dev/null 2>"$work/w.err"
  check "a merge weight of 1e39 fails (${base_adapter#*:})" test $? -eq 1
  check "as INVALID_ARGUMENT naming it (${base_adapter#*:})" err_has "$work/w.err" "INVALID_ARGUMENT: the merge weight 1e+39 is not a finite 32-bit float"
done
"$peftc" merge --base "$q8" --adapter "$work/q8_lora.gguf:3e38" --out "$work/w.out" >/dev/null 2>"$work/w.err"
check "a weight of 3e38 whose GGUF scale overflows names the weight and alpha" err_has "$work/w.err" "merge weight 3e+38 times adapter.lora.alpha"

# peak memory of a 99 MB GGUF header of the smallest key-value pairs (docs/gguf.md, "Memory": under
# 1 GB); not measured under the sanitizers, whose allocator has its own overheads. ldd's answer is
# read whole first: `ldd | grep -q` under pipefail fails when grep stops reading early (SIGPIPE).
linked=$(ldd "$peftc" 2>/dev/null || true)
if command -v /usr/bin/time >/dev/null && ! grep -q "libasan\|libtsan\|libclang_rt\.[at]san" <<<"$linked"; then
  python3 "$hostile" gguf-many-kv "$work/many_kv.gguf" 99000000
  for mode in text json; do
    /usr/bin/time -f "%M" -o "$work/rss" "$peftc" inspect "$work/many_kv.gguf" $([ $mode = json ] && echo --json) >/dev/null 2>&1
    check "inspect ($mode) of a 99 MB header of minimal key-value pairs succeeds" test $? -eq 0
    check "in under 1 GB (peak RSS $(cat "$work/rss") KB)" test "$(cat "$work/rss")" -lt 1000000
  done
  rm -f "$work/many_kv.gguf"
fi

finish reliability
