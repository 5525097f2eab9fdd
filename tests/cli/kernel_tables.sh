#!/usr/bin/env bash
# Every kernel table the machine has (PEFT_C_KERNELS = portable, avx2, avx512; see peft_kernels in
# include/peft_c.h) writes the same bytes as the portable one: merges (f32, bf16 and f16 outputs,
# DoRA, GPT-2 Conv1D, two weighted adapters, an f16 base) and dtype conversions of the fixtures.
# Prints which tables ran. Usage: bash kernel_tables.sh peftc
set -uo pipefail
peftc=$1
data=${PEFT_TEST_DATA:?PEFT_TEST_DATA must name tests/fixtures}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failed=0
fail() { echo "FAIL: $*"; failed=$((failed + 1)); }

m=$data/models a=$data/adapters
# name | peftc arguments (OUT stands for the output folder)
jobs=(
  "merge_f16|merge --base $m/llama --adapter $a/llama_lora --dtype f16 --out OUT"
  "merge_dora_bf16|merge --base $m/llama --adapter $a/llama_dora --dtype bf16 --out OUT"
  "merge_rslora_f32|merge --base $m/llama --adapter $a/llama_rslora --out OUT"
  "merge_two_weighted|merge --base $m/llama --adapter $a/llama_lora:0.7 --adapter $a/llama_lora_second:-1.25 --dtype bf16 --out OUT"
  "merge_conv1d|merge --base $m/gpt2 --adapter $a/gpt2_lora --dtype f16 --out OUT"
  "merge_f16_base|merge --base $m/llama_f16 --adapter $a/llama_f16_lora --out OUT"
  "convert_bf16|convert $m/llama OUT --dtype bf16"
  "convert_f16|convert $m/llama OUT --dtype f16"
  "convert_f32|convert $m/llama_bf16 OUT --dtype f32"
)

ran=()
for table in portable avx2 avx512; do
  got=$(PEFT_C_KERNELS=$table "$peftc" --version | sed -n 's/.*(kernels: \(.*\))$/\1/p')
  [ "$got" = "$table" ] || continue  # the CPU lacks it
  ran+=("$table")
  for job in "${jobs[@]}"; do
    name=${job%%|*} args=${job#*|}
    out=$work/$table/$name
    # shellcheck disable=SC2086  # the arguments are words without spaces
    if ! PEFT_C_KERNELS=$table "$peftc" ${args//OUT/$out} >/dev/null 2>"$work/stderr"; then
      fail "$table $name: $(cat "$work/stderr")"
      continue
    fi
    [ "$table" = portable ] && continue
    if ! diff -r "$work/portable/$name" "$out" >/dev/null; then
      fail "$table $name: output differs from the portable table's"
    fi
  done
done
[ ${#ran[@]} -ge 1 ] && [ "${ran[0]}" = portable ] || fail "the portable table did not run (ran: ${ran[*]})"
echo "kernel tables compared byte for byte with portable: ${ran[*]} (${#jobs[@]} jobs each)"
[ "$failed" -eq 0 ] && echo "ok" || { echo "$failed failure(s)"; exit 1; }
