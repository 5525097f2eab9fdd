"""`peftc merge` into a GGUF base against llama.cpp's `llama-export-lora`, on the model and adapter of
bench/merge_vs_peft.py (bench/merge_bench_data.py: a 1.3 GB LLaMA-shaped model, rank-16 LoRA on every
linear layer) converted with llama.cpp's own convert_hf_to_gguf.py (F16) and convert_lora_to_gguf.py.

Both run with the same thread count, each in its own process; wall time and peak RSS are measured as
in merge_vs_peft.py, best of --repeat runs. Then the two outputs are compared tensor by tensor: F16
values at most one step of the last bit apart (both add the f32 deltas and round once). Needs the
llama.cpp references (PEFT_LLAMA_CPP_BIN etc.: `eval "$(scripts/llama-cpp.sh --env)"`).

usage: python bench/gguf_merge_vs_llama.py BUILD_DIR [--repeat N] [--threads N]
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "interop"))
import merge_bench_data  # noqa: E402
from merge_vs_peft import run  # noqa: E402


def ordered_f16(x):
    """F16 values (a numpy array) as integers in the order of the values, one apart per step of the last
    bit (-0 and +0 both 0): the steps between two values are the difference, across zero as well."""
    import numpy as np

    bits = x.view(np.int16).astype(np.int32)
    return np.where(bits < 0, -(bits & 0x7FFF), bits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir", type=pathlib.Path)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not os.environ.get("PEFT_LLAMA_CPP_BIN"):
        print("skipped: PEFT_LLAMA_CPP_BIN is not set (eval \"$(scripts/llama-cpp.sh --env)\")")
        return
    import numpy as np
    from gguf_reference import convert_hf_to_gguf, convert_lora_to_gguf, llama_cpp, read_gguf

    peftc = (args.build_dir / "peftc").resolve()
    data = merge_bench_data.ensure()
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="gguf_merge_", dir=data))
    try:
        base = convert_hf_to_gguf(data / "base", scratch / "base.f16.gguf", outtype="f16")
        lora = convert_lora_to_gguf(data / "adapter", data / "base", scratch / "adapter.gguf", outtype="f32")
        tool = llama_cpp().tool("llama-export-lora")
        commands = {
            "peftc": [str(peftc), "merge", "--base", str(base), "--adapter", str(data / "adapter"), "--out",
                      str(scratch / "peftc.gguf"), "--threads", str(args.threads)],
            "llama-export-lora": [str(tool), "-m", str(base), "--lora", str(lora), "-o",
                                  str(scratch / "llama.gguf"), "-t", str(args.threads)],
        }
        results = {name: [run(argv) for _ in range(args.repeat)] for name, argv in commands.items()}
        ours, theirs = read_gguf(scratch / "peftc.gguf"), read_gguf(scratch / "llama.gguf")
        want = {t.name: np.array(t.data) for t in theirs.tensors}
        worst = 0
        for t in ours.tensors:
            a, b = np.array(t.data), want[t.name]
            if a.dtype == np.float16:
                worst = max(worst, int(np.abs(ordered_f16(a) - ordered_f16(b)).max()))
            elif not np.array_equal(a, b):
                worst = max(worst, 10**9)
        agreement = f"{len(want)} tensors, F16 values at most {worst} step(s) of the last bit apart"
        size = base.stat().st_size
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    best = {name: (min(r[0] for r in runs), min(r[1] for r in runs)) for name, runs in results.items()}
    (pt, pm), (lt, lm) = best["peftc"], best["llama-export-lora"]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"## merge into a GGUF base: {size / 1e9:.2f} GB F16 GGUF ({merge_bench_data.LAYERS} layers, hidden "
          f"{merge_bench_data.HIDDEN}), rank-{merge_bench_data.RANK} LoRA on every linear layer, {args.threads} threads")
    print(f"machine: {os.cpu_count()} cores, {cpu}; best of {args.repeat} runs each\n")
    print("| | wall time (s) | peak RSS (MB) |")
    print("|---|---:|---:|")
    print(f"| `peftc merge` | {pt:.2f} | {pm:.0f} |")
    print(f"| `llama-export-lora` | {lt:.2f} | {lm:.0f} |")
    print(f"| ratio | {lt / pt:.1f}x faster | {pm / lm:.3f} of llama-export-lora's |\n")
    print(f"outputs: {agreement}")


if __name__ == "__main__":
    main()
