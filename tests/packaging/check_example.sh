# check_example PEFTC EXAMPLE...: runs the C or Python example (EXAMPLE... BASE ADAPTER OUT) on the test
# fixtures, then PEFTC merge of the same inputs, and requires byte-identical safetensors files and
# config.json. Sourced by the packaging tests; ROOT is the repository.
check_example() {
  local peftc=$1; shift
  local base=$ROOT/tests/fixtures/models/llama adapter=$ROOT/tests/fixtures/adapters/llama_lora
  local out
  out=$(mktemp -d)
  "$@" "$base" "$adapter" "$out" >"$out/log" || { cat "$out/log"; rm -rf "$out"; return 1; }
  "$peftc" merge --base "$base" --adapter "$adapter" --out "$out/peftc" >/dev/null
  local f n=0
  for f in "$out"/peftc/*.safetensors "$out/peftc/config.json"; do
    cmp -- "$f" "$out/merged/$(basename "$f")" || { rm -rf "$out"; return 1; }
    n=$((n + 1))
  done
  [ -s "$out/adapter/adapter_model.safetensors" ] || { echo "no exported adapter"; rm -rf "$out"; return 1; }
  echo "  $* -> merge byte-identical to peftc merge ($n files)"
  rm -rf "$out"
}
