"""`peftc merge` into a block-quantized (Q4_K_M) GGUF base against llama.cpp's `llama-export-lora`, on the
model and adapter of bench/merge_vs_peft.py (bench/merge_bench_data.py: a LLaMA-shaped model with
synthetic weights, rank-16 LoRA on every linear layer), converted with convert_hf_to_gguf.py (F16),
quantized with `llama-quantize ... Q4_K_M`, the adapter with convert_lora_to_gguf.py.

peftc keeps every merged tensor's type (dequantize, add the delta in f32, quantize again as ggml does);
llama-export-lora writes merged quantized tensors as F16. Both run with the same thread count, each in
its own process; wall time and peak RSS as in merge_vs_peft.py, best of --repeat runs; output sizes.
Needs the llama.cpp references (PEFT_LLAMA_CPP_BIN etc.: `eval "$(scripts/llama-cpp.sh --env)"`).

usage: python bench/gguf_quant_merge_vs_llama.py BUILD_DIR [--repeat N] [--threads N]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir", type=pathlib.Path)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if not os.environ.get("PEFT_LLAMA_CPP_BIN"):
        print("skipped: PEFT_LLAMA_CPP_BIN is not set (eval \"$(scripts/llama-cpp.sh --env)\")")
        return
    from gguf_reference import convert_hf_to_gguf, convert_lora_to_gguf, llama_cpp, quantize, read_gguf

    peftc = (args.build_dir / "peftc").resolve()
    data = merge_bench_data.ensure()
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="gguf_quant_merge_", dir=data))
    try:
        f16 = convert_hf_to_gguf(data / "base", scratch / "base.f16.gguf", outtype="f16")
        base = quantize(f16, scratch / "base.Q4_K_M.gguf", type="Q4_K_M", threads=args.threads)
        f16.unlink()
        lora = convert_lora_to_gguf(data / "adapter", data / "base", scratch / "adapter.gguf", outtype="f32")
        tool = llama_cpp().tool("llama-export-lora")
        outs = {"peftc": scratch / "peftc.gguf", "llama-export-lora": scratch / "llama.gguf"}
        commands = {
            "peftc": [str(peftc), "merge", "--base", str(base), "--adapter", str(data / "adapter"), "--out",
                      str(outs["peftc"]), "--threads", str(args.threads)],
            "llama-export-lora": [str(tool), "-m", str(base), "--lora", str(lora), "-o",
                                  str(outs["llama-export-lora"]), "-t", str(args.threads)],
        }
        results = {name: [run(argv) for _ in range(args.repeat)] for name, argv in commands.items()}
        sizes = {name: path.stat().st_size for name, path in outs.items()}
        types = {}
        for t in read_gguf(outs["peftc"]).tensors:
            types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
        base_size = base.stat().st_size
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    best = {name: (min(r[0] for r in runs), min(r[1] for r in runs)) for name, runs in results.items()}
    (pt, pm), (lt, lm) = best["peftc"], best["llama-export-lora"]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"## merge into a Q4_K_M GGUF base: {base_size / 1e9:.2f} GB ({merge_bench_data.LAYERS} layers, hidden "
          f"{merge_bench_data.HIDDEN}), rank-{merge_bench_data.RANK} LoRA on every linear layer, {args.threads} threads")
    print(f"machine: {os.cpu_count()} cores, {cpu}; best of {args.repeat} runs each\n")
    print("| | wall time (s) | peak RSS (MB) | output (GB) |")
    print("|---|---:|---:|---:|")
    print(f"| `peftc merge` | {pt:.2f} | {pm:.0f} | {sizes['peftc'] / 1e9:.3f} |")
    print(f"| `llama-export-lora` | {lt:.2f} | {lm:.0f} | {sizes['llama-export-lora'] / 1e9:.3f} |")
    print(f"| ratio | {lt / pt:.1f}x faster | {pm / lm:.3f} of llama-export-lora's | "
          f"{sizes['peftc'] / sizes['llama-export-lora']:.2f} |\n")
    print(f"peftc's output tensor types: {', '.join(f'{n} {k}' for k, n in sorted(types.items()))}")
    target = 3.0  # issue 34: quantized merges 3x llama-export-lora
    print(f"target: >= {target:.0f}x llama-export-lora's wall time: {'met' if lt / pt >= target else 'MISSED'} "
          f"({lt / pt:.2f}x)")


if __name__ == "__main__":
    main()
