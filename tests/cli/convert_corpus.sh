#!/usr/bin/env bash
# peftc convert without --dtype reproduces, byte for byte, every real safetensors file of the corpus
# that has at most one metadata key (the reference orders several keys randomly), and a rewrite in
# place gives the same bytes again. Usage: bash convert_corpus.sh path/to/peftc
set -euo pipefail
peftc=$1
corpus=${PEFT_CORPUS:-}
if [ -z "$corpus" ] || [ ! -d "$corpus" ]; then
  echo "SKIP: the real corpus (PEFT_CORPUS=${corpus:-unset}) is absent"
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Number of keys in a file's __metadata__ (0 when absent), as peftc inspect lists them.
metadata_keys() {
  "$peftc" inspect "$1" | grep -c '^  metadata .* = ' || true
}

checked=0
skipped=0
failed=0
while IFS= read -r -d '' file; do
  keys=$(metadata_keys "$file")
  if [ "$keys" -gt 1 ]; then
    skipped=$((skipped + 1))
    continue
  fi
  out="$work/out.safetensors"
  rm -f "$out"
  if ! "$peftc" convert "$file" "$out" >/dev/null; then
    echo "FAIL: peftc convert failed on $file"
    failed=$((failed + 1))
    continue
  fi
  if ! cmp -s "$file" "$out"; then
    echo "FAIL: $file is not reproduced byte for byte"
    failed=$((failed + 1))
    continue
  fi
  # In place: the output replaces its own input atomically and stays identical.
  cp "$out" "$work/inplace.safetensors"
  "$peftc" convert "$work/inplace.safetensors" "$work/inplace.safetensors" >/dev/null
  if ! cmp -s "$file" "$work/inplace.safetensors"; then
    echo "FAIL: an in-place rewrite of $file changed it"
    failed=$((failed + 1))
    continue
  fi
  checked=$((checked + 1))
done < <(find "$corpus" -name '*.safetensors' -type f -print0 | sort -z)

echo "convert_corpus: $checked file(s) reproduced byte for byte, $skipped skipped (2+ metadata keys), $failed failed"
if [ "$checked" -eq 0 ]; then
  echo "FAIL: no corpus file was checked"
  exit 1
fi
[ "$failed" -eq 0 ]
