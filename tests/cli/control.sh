#!/usr/bin/env bash
# peftc control combine and peftc inspect on control vectors: a safetensors steering vector made here
# byte by byte, converted to llama.cpp's GGUF and back (the same bytes each way), summed at strengths,
# cut to a layer range; usage errors exit 2, bad files exit 1 with the error's code. (Byte equality
# with gguf-py and safetensors, and llama.cpp's reading, are tests/interop/test_control_vector.py.)
# Usage: bash control.sh path/to/peftc
set -uo pipefail
peftc=$1
source "$(dirname "$0")/lib/checks.sh"
contains() { grep -qF -- "$2" "$1"; }

# A safetensors file: an 8-byte little-endian header length, the header padded with spaces to a
# multiple of 8, then the data. Two F32 directions of 2 values: layer 1 = (1, 2), layer 3 = (3, 4).
safetensors() {  # safetensors OUT HEADER_JSON DATA_PRINTF_ESCAPES
  local header=$2
  while [ $(( ${#header} % 8 )) -ne 0 ]; do header="$header "; done
  local n=${#header}
  printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x\\x00\\x00\\x00\\x00' $((n & 255)) $((n >> 8 & 255)) $((n >> 16 & 255)) $((n >> 24 & 255)))" >"$1"
  printf '%s' "$header" >>"$1"
  printf "$3" >>"$1"
}
one=$'\\x00\\x00\\x80\\x3f' two=$'\\x00\\x00\\x00\\x40' three=$'\\x00\\x00\\x40\\x40' four=$'\\x00\\x00\\x80\\x40'
safetensors "$work/in.safetensors" \
  '{"__metadata__":{"model_hint":"tiny"},"model.layers.1":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"model.layers.3":{"dtype":"F32","shape":[1,2],"data_offsets":[8,16]}}' \
  "$one$two$three$four"

"$peftc" control combine "$work/a.gguf" "$work/in.safetensors" >"$work/a.out"
check "a safetensors steering vector converts to GGUF" test $? -eq 0
check "it reports the layers and values" contains "$work/a.out" "2 layer(s) of 2 values"
"$peftc" inspect "$work/a.gguf" >"$work/inspect.txt"
check "inspect shows a control vector" contains "$work/inspect.txt" 'control vector: 2 layer(s) of 2 values, model hint "tiny"'
check "inspect shows layer 1's norm" contains "$work/inspect.txt" "layer 1: norm 2.23607"
check "inspect shows layer 3's norm" contains "$work/inspect.txt" "layer 3: norm 5"
"$peftc" inspect --json "$work/a.gguf" >"$work/inspect.json"
check "inspect --json has the control_vector section" contains "$work/inspect.json" '"control_vector":{"n_embd":2,"model_hint":"tiny","layers":[{"layer":1,"norm":2.2360679774997898},{"layer":3,"norm":5}]}'

"$peftc" control combine "$work/b.safetensors" "$work/a.gguf" >/dev/null
"$peftc" control combine "$work/c.gguf" "$work/b.safetensors" >/dev/null
check "GGUF -> safetensors -> GGUF gives the same bytes" cmp -s "$work/a.gguf" "$work/c.gguf"

# Strengths: 2 x (1, 2) + -0.5 x (1, 2) = (1.5, 3); layer 3 likewise (4.5, 6); --layers 2-9 keeps layer 3.
"$peftc" control combine "$work/sum.gguf" "$work/a.gguf:2" "$work/b.safetensors:-0.5" --layers 2-9 >/dev/null
"$peftc" inspect --json "$work/sum.gguf" >"$work/sum.json"
check "the sum keeps only layer 3, of norm 7.5" contains "$work/sum.json" '"layers":[{"layer":3,"norm":7.5}]'
"$peftc" control combine "$work/hint.safetensors" "$work/a.gguf" --model-hint other >/dev/null
"$peftc" inspect "$work/hint.safetensors" >"$work/hint.txt"
check "--model-hint replaces the hint" contains "$work/hint.txt" 'model hint "other"'

# Usage errors exit 2 and write nothing.
check "no input is a usage error" exit_is 2 "$peftc" control combine "$work/x.gguf"
check "another extension is a usage error" exit_is 2 "$peftc" control combine "$work/x.bin" "$work/a.gguf"
check "--layers 5-2 is a usage error" exit_is 2 "$peftc" control combine "$work/x.gguf" "$work/a.gguf" --layers 5-2
check "an unknown option is a usage error" exit_is 2 "$peftc" control combine "$work/x.gguf" "$work/a.gguf" --strength 2
check "nothing was written" test ! -e "$work/x.gguf"

# Bad files exit 1 with the error's code.
"$peftc" control combine "$work/x.gguf" "$work/missing.gguf" 2>"$work/missing.err"
check "a missing input exits 1" test $? -eq 1
check "a missing input is IO" contains "$work/missing.err" "peftc: error: IO: "
safetensors "$work/zero.safetensors" '{"direction.0":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' "$one$two"
"$peftc" control combine "$work/x.gguf" "$work/zero.safetensors" 2>"$work/zero.err"
check "layer 0 cannot be written as GGUF" contains "$work/zero.err" "INVALID_ARGUMENT: the control vector has a direction for layer 0"
safetensors "$work/odd.safetensors" '{"weights.1":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}' "$one$two"
"$peftc" control combine "$work/x.gguf" "$work/odd.safetensors" 2>"$work/odd.err"
check "another tensor name is INVALID_CHECKPOINT naming it" contains "$work/odd.err" 'INVALID_CHECKPOINT: '
check "the message names the tensor" contains "$work/odd.err" '"weights.1"'
"$peftc" control combine "$work/x.gguf" "$work/a.gguf" "$work/odd.safetensors" 2>/dev/null
check "nothing was written after a failed input" test ! -e "$work/x.gguf"

finish control
