"""Unmerged apply side by side: peft_c's `peft_lora_apply` (bench_serve's apply table) against what
PEFT's unmerged LoRA layer adds to the base product in torch, on the same LLaMA-7B layer shapes,
batches and ranks, with each ratio beside issue 34's targets.

For each shape (4096 -> 4096, 4096 -> 11008, 11008 -> 4096), batch (1, 16, 256) and rank (8, 16, 64)
a one-layer model gets a LoRA adapter from peft.get_peft_model (f32, lora_B randomised so the
branch is not zero); with torch.inference_mode it times the base product alone (`base_layer(x)`)
and PEFT's LoRA branch as its forward adds it to that output
(`y.add_(lora_B(lora_A(x)) * scaling)`, dropout being the identity at inference), the work
peft_lora_apply does. Timing the branch on its own is steadier than subtracting two noisy forward
times. torch uses every core, as the library does.

The two sides run alternately, ROUNDS times (`BUILD_DIR/bench/bench_serve REPEAT apply`, then torch),
because torch's times vary by up to 2x between runs on a small machine; each side keeps its best time
per row over the repeats and rounds (bench_serve reports the best of its repeats too). Targets: peft_c
no slower than PEFT's branch in every row (ratio = PEFT / peft_c >= 1), and at batch 1 a call whose
factors come from memory within 1.5x of the bytes it moves at the measured bandwidth (bench_serve's
"cold" and "bound"). Mixed rows (three adapters interleaved) have no PEFT counterpart.

usage: python bench/serve_vs_peft.py BUILD_DIR [--repeat N] [--rounds N]
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import pathlib
import subprocess
import time

import torch
from peft import LoraConfig, get_peft_model

SHAPES = (("q_proj", 4096, 4096), ("up_proj", 4096, 11008), ("down_proj", 11008, 4096))
BATCHES = (1, 16, 256)
RANKS = (8, 16, 64)
BOUND_TARGET = 1.5


class OneLayer(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def best_seconds(fn, repeat: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def torch_round(repeat: int) -> dict:
    """{(layer, batch, rank): (base seconds, branch seconds)}"""
    torch.manual_seed(0)
    out = {}
    for name, in_features, out_features in SHAPES:
        for batch in BATCHES:
            x = torch.randn(batch, in_features)
            for rank in RANKS:
                model = get_peft_model(OneLayer(in_features, out_features),
                                       LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["proj"]))
                layer = model.base_model.model.proj
                torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.02)
                model.eval()
                with torch.inference_mode():
                    y = layer.base_layer(x)
                    lora_a, lora_b = layer.lora_A["default"], layer.lora_B["default"]
                    scaling = layer.scaling["default"]
                    base = best_seconds(lambda: layer.base_layer(x), repeat)
                    branch = best_seconds(lambda: y.add_(lora_b(lora_a(x)) * scaling), repeat)
                out[(name, batch, str(rank))] = (base, branch)
    return out


def peft_c_round(bench_serve: pathlib.Path, repeat: int) -> tuple[dict, str]:
    """{(layer, batch, rank or "mixed"): (apply seconds, cold seconds or None, bound seconds or None)}"""
    text = subprocess.run([str(bench_serve), str(repeat), "apply"], check=True, capture_output=True,
                          text=True).stdout
    rows, bandwidth = {}, ""
    for line in text.splitlines():
        if "memory read bandwidth" in line:
            bandwidth = line.split(":", 1)[1].split("GB/s")[0].strip()
        fields = line.split()
        if len(fields) < 6 or not fields[1].isdigit() or not fields[0].startswith(("self_attn.", "mlp.")):
            continue
        layer = fields[0].split(".", 1)[1]
        cold = bound = None
        if len(fields) >= 9:
            cold, bound = float(fields[6]) / 1e3, float(fields[7]) / 1e3
        rows[(layer, int(fields[1]), fields[2])] = (float(fields[4]) / 1e3, cold, bound)
    if not rows:
        raise SystemExit(f"serve_vs_peft.py: no apply rows in the output of {bench_serve}:\n{text}")
    return rows, bandwidth


def keep_best(best: dict, new: dict) -> None:
    for key, values in new.items():
        old = best.get(key)
        best[key] = values if old is None else tuple(
            None if a is None else min(a, b) for a, b in zip(old, values))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    bench_serve = pathlib.Path(args.build_dir) / "bench" / "bench_serve"
    ours, theirs, bandwidths = {}, {}, []
    for _ in range(args.rounds):
        rows, bandwidth = peft_c_round(bench_serve, args.repeat)
        keep_best(ours, rows)
        bandwidths.append(bandwidth)
        keep_best(theirs, torch_round(args.repeat))
    print(f"## unmerged apply: peft_c against PEFT's LoRA branch (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")
    print(f"best of {args.repeat} repeats x {args.rounds} alternating rounds each; memory read bandwidth "
          f"(one thread, per round): {', '.join(bandwidths)} GB/s\n")
    print("| layer | batch | rank | peft_c ms | PEFT branch ms | torch base ms | PEFT / peft_c | >= 1 | "
          "batch 1 from memory: ms / bound ms | <= 1.5x |")
    print("|---|---:|---|---:|---:|---:|---:|---|---|---|")
    missed = []
    for name, _, _ in SHAPES:
        for batch in BATCHES:
            for rank in [str(r) for r in RANKS] + (["mixed"] if batch > 1 else []):
                apply, cold, bound = ours[(name, batch, rank)]
                if rank == "mixed":
                    print(f"| {name} | {batch} | mixed | {apply * 1e3:.3f} | - | - | - | - | - | - |")
                    continue
                base, branch = theirs[(name, batch, rank)]
                ratio = branch / apply
                faster = "met" if ratio >= 1 else "MISSED"
                if ratio < 1:
                    missed.append(f"{name} batch {batch} rank {rank} ({ratio:.2f}x)")
                memory = verdict = "-"
                if cold is not None:
                    memory = f"{cold * 1e3:.3f} / {bound * 1e3:.3f} = {cold / bound:.2f}x"
                    verdict = "met" if cold / bound <= BOUND_TARGET else "MISSED"
                    if cold / bound > BOUND_TARGET:
                        missed.append(f"{name} batch 1 rank {rank} from memory ({cold / bound:.2f}x the bound)")
                print(f"| {name} | {batch} | {rank} | {apply * 1e3:.3f} | {branch * 1e3:.3f} | {base * 1e3:.3f} | "
                      f"{ratio:.2f}x | {faster} | {memory} | {verdict} |")
    print(f"\ntargets missed: {'; '.join(missed) if missed else 'none'}")


if __name__ == "__main__":
    main()
