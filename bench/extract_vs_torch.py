"""`peftc adapter extract` against the Python way (torch.linalg.svd over the same modules) on a
synthetic LLaMA-shaped f32 pair (hidden 1024, intermediate 2816, 2 layers: 2 x 101 MB; tuned = base +
a rank-16 change + noise on every linear layer of the decoder), made once under
~/.cache/peft_c/bench/extract.

The torch side does what a script would: load both checkpoints with safetensors.torch.load_file,
for each of the 14 linear weights dW = W_t - W_b, U, S, Vh = torch.linalg.svd(dW, full_matrices=False),
B = U[:, :r] * S[:r], A = Vh[:r], and save_file the factors. peftc runs
`peftc adapter extract --base B --tuned T --out O --rank 16 --threads N`. Each runs in its own process;
wall time and peak RSS (ru_maxrss of the child) are measured, best of --repeat runs. Afterwards the
products B A of the two outputs are compared.

usage: python bench/extract_vs_torch.py BUILD_DIR [--repeat N] [--threads N]
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

import numpy as np

DATA = pathlib.Path(os.environ.get("PEFT_BENCH_DATA") or pathlib.Path.home() / ".cache" / "peft_c" / "bench" / "extract")
HIDDEN, INTER, LAYERS, RANK = 1024, 2816, 2, 16

TORCH_EXTRACT = r"""
import sys, torch
from safetensors.torch import load_file, save_file
base, tuned, out, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.set_num_threads(int(sys.argv[5]))
wb, wt = load_file(base + "/model.safetensors"), load_file(tuned + "/model.safetensors")
factors = {}
for name, w in wb.items():
    if w.dim() != 2 or ".layers." not in name:
        continue
    delta = wt[name].float() - w.float()
    U, S, Vh = torch.linalg.svd(delta, full_matrices=False)
    module = "base_model.model." + name[: -len(".weight")]
    factors[module + ".lora_B.weight"] = (U[:, :rank] * S[:rank]).contiguous()
    factors[module + ".lora_A.weight"] = Vh[:rank].contiguous()
save_file(factors, out, metadata={"format": "pt"})
"""


def make_data() -> tuple[pathlib.Path, pathlib.Path]:
    base, tuned = DATA / "base", DATA / "tuned"
    if (tuned / "model.safetensors").exists():
        return base, tuned
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    shapes = {"self_attn.q_proj": (HIDDEN, HIDDEN), "self_attn.k_proj": (HIDDEN, HIDDEN),
              "self_attn.v_proj": (HIDDEN, HIDDEN), "self_attn.o_proj": (HIDDEN, HIDDEN),
              "mlp.gate_proj": (INTER, HIDDEN), "mlp.up_proj": (INTER, HIDDEN), "mlp.down_proj": (HIDDEN, INTER)}
    wb, wt = {"model.embed_tokens.weight": rng.standard_normal((256, HIDDEN), dtype=np.float32) * 0.02}, {}
    for i in range(LAYERS):
        for name, shape in shapes.items():
            w = rng.standard_normal(shape, dtype=np.float32) * 0.02
            u = rng.standard_normal((shape[0], RANK), dtype=np.float32)
            v = rng.standard_normal((RANK, shape[1]), dtype=np.float32)
            wb[f"model.layers.{i}.{name}.weight"] = w
            wt[f"model.layers.{i}.{name}.weight"] = w + 1e-3 * (u @ v) + 1e-4 * rng.standard_normal(shape, dtype=np.float32)
    wt["model.embed_tokens.weight"] = wb["model.embed_tokens.weight"]
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
              "intermediate_size": INTER, "num_hidden_layers": LAYERS, "num_attention_heads": 16,
              "num_key_value_heads": 16, "vocab_size": 256, "torch_dtype": "float32"}
    for folder, tensors in ((base, wb), (tuned, wt)):
        folder.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config))
    return base, tuned


def timed(args: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args[0]} failed: {proc.stderr.read().decode()}")
    return elapsed, usage.ru_maxrss * 1024


def compare(ours: pathlib.Path, ref: pathlib.Path) -> float:
    from safetensors.numpy import load_file

    a, b = load_file(str(ours)), load_file(str(ref))
    assert sorted(a) == sorted(b), "tensor names differ"
    worst = 0.0
    for k in a:
        if k.endswith("lora_A.weight"):
            m = k[: -len("lora_A.weight")]
            pa = a[m + "lora_B.weight"].astype(np.float64) @ a[k].astype(np.float64)
            pb = b[m + "lora_B.weight"].astype(np.float64) @ b[k].astype(np.float64)
            worst = max(worst, float(np.linalg.norm(pa - pb) / np.linalg.norm(pb)))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("build", type=pathlib.Path)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    base, tuned = make_data()
    out = DATA / "out"
    out.mkdir(exist_ok=True)
    runs = {
        "peftc adapter extract (exact sgesdd)": [str(args.build / "peftc"), "adapter", "extract", "--base", str(base),
                                                 "--tuned", str(tuned), "--out", str(out / "peftc"), "--rank",
                                                 str(RANK), "--threads", str(args.threads)],
        "peftc adapter extract --svd randomized": [str(args.build / "peftc"), "adapter", "extract", "--base",
                                                   str(base), "--tuned", str(tuned), "--out", str(out / "peftc-rand"),
                                                   "--rank", str(RANK), "--threads", str(args.threads), "--svd",
                                                   "randomized"],
        "torch.linalg.svd (Python)": [sys.executable, "-c", TORCH_EXTRACT, str(base), str(tuned),
                                      str(out / "torch.safetensors"), str(RANK), str(args.threads)],
    }
    results = {}
    for name, cmd in runs.items():
        best = None
        for _ in range(args.repeat):
            t, rss = timed(cmd)
            best = (t, rss) if best is None or t < best[0] else best
        results[name] = best
    size = sum(f.stat().st_size for f in (base / "model.safetensors", tuned / "model.safetensors"))
    print(f"pair: {size / 1e6:.0f} MB, {LAYERS * 7} modules, rank {RANK}, {args.threads} threads\n")
    print("| tool | wall s | peak RSS MB |")
    print("|---|---|---|")
    for name, (t, rss) in results.items():
        print(f"| {name} | {t:.2f} | {rss / 1e6:.0f} |")
    for name in ("peftc", "peftc-rand"):
        err = compare(out / name / "adapter_model.safetensors", out / "torch.safetensors")
        print(f"\n{name}: largest relative difference of B A from torch's: {err:.2e}")


if __name__ == "__main__":
    main()
