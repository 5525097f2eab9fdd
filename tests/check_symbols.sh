#!/usr/bin/env bash
# Fails when the shared library exports a symbol that is not part of the public peft_* API.
set -euo pipefail
lib=$1
nm=${NM:-nm}  # the build's nm: a cross build's reads the target's format
leaks=$("$nm" -D --defined-only "$lib" | awk '$2 ~ /[TDBRWVi]/ {print $3}' | grep -v '^peft_' || true)
count=$("$nm" -D --defined-only "$lib" | awk '$2 ~ /[TDBRWVi]/ {print $3}' | grep -c '^peft_' || true)
if [ -n "$leaks" ]; then
  echo "non-peft symbols exported from $lib:"; echo "$leaks" | head -20; exit 1
fi
if [ "$count" -lt 10 ]; then echo "only $count peft_* symbols exported from $lib"; exit 1; fi
echo "$count peft_* symbols exported, nothing else"
