#!/usr/bin/env bash
# Runs every parser's fuzzer (safetensors header, shard index, adapter config, translation table, GGUF
# header, GGUF LoRA adapter, bitsandbytes/FP8 quantization state) for a bounded time, SECONDS split
# between them, each over a copy of its committed seed corpus.
#   tests/fuzz/run.sh BUILD_DIR SECONDS
# BUILD_DIR is a build configured with clang and -DPEFT_FUZZ=ON (missing fuzzers are built).
# Exits nonzero when the fuzzer finds a crash, a sanitizer report, a timeout or a memory blow-up;
# the reproducer is left in BUILD_DIR/fuzz-artifacts/ and its path printed. Every finding should
# become a seed in tests/fuzz/corpus/<target>/ and a unit test.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR SECONDS" >&2
  exit 2
fi
build_dir=$1
seconds=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Each target gets an equal share of the time (at least a second); the header fuzzer the remainder.
targets=(header index adapter_config arch_table gguf_header gguf_lora bnb_state)
share=$((seconds / ${#targets[@]}))
[[ $share -ge 1 ]] || share=1

for target in "${targets[@]}"; do
  if [[ ! -x $build_dir/tests/fuzz/${target}_fuzzer ]]; then
    cmake --build "$build_dir" --target "${target}_fuzzer"
  fi
  if [[ ! -d $here/corpus/$target ]]; then
    echo "run.sh: missing seed corpus $here/corpus/$target" >&2
    exit 1
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/peft-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$build_dir/fuzz-artifacts"

findings=0
for target in "${targets[@]}"; do
  time_for=$share
  [[ $target == header ]] && time_for=$((seconds - share * (${#targets[@]} - 1)))
  [[ $time_for -ge 1 ]] || time_for=1
  case $target in
    header) dict=$here/header.dict ;;
    gguf_header) dict=$here/gguf.dict ;;
    gguf_lora) dict=$work/gguf_lora.dict && cat "$here/gguf.dict" "$here/gguf_lora.dict" > "$dict" ;;
    bnb_state) dict=$here/bnb_state.dict ;;
    *) dict=$here/json.dict ;;
  esac
  mkdir -p "$work/$target"
  cp "$here"/corpus/"$target"/* "$work/$target/"
  # -timeout: one input taking a second is a hang (inputs here are at most 8 KB);
  # -rss_limit_mb / -malloc_limit_mb: any large allocation is a finding.
  status=0
  "$build_dir/tests/fuzz/${target}_fuzzer" "$work/$target" \
    -dict="$dict" \
    -max_total_time="$time_for" \
    -max_len=8192 \
    -timeout=1 \
    -rss_limit_mb=1024 \
    -malloc_limit_mb=256 \
    -print_final_stats=1 \
    -artifact_prefix="$build_dir/fuzz-artifacts/${target}-" \
    2> "$work/$target.log" || status=$?
  echo "== ${target}_fuzzer (${time_for}s)"
  grep -E "^(#[0-9]+ +DONE|stat::number_of_executed_units|stat::average_exec_per_sec|Done [0-9]+ runs)" "$work/$target.log" || true
  if [[ $status -ne 0 ]]; then
    tail -n 60 "$work/$target.log" >&2
    echo "run.sh: ${target}_fuzzer failed (exit $status)" >&2
    findings=$((findings + 1))
  fi
done
if [[ $findings -ne 0 ]]; then
  echo "run.sh: reproducers:" >&2
  ls -1 "$build_dir"/fuzz-artifacts/ >&2 || true
  exit 1
fi
echo "run.sh: no findings in ${seconds}s"
