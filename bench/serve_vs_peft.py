"""The reference for bench_serve's unmerged-apply table: what PEFT's unmerged LoRA layer adds to the
base product in torch, on the same LLaMA-7B layer shapes, batches and ranks.

For each shape (4096 -> 4096, 4096 -> 11008, 11008 -> 4096), batch (1, 16, 256) and rank (8, 16, 64)
a one-layer model gets a LoRA adapter from peft.get_peft_model (f32, lora_B randomised so the
branch is not zero); with torch.inference_mode it times the base product alone (`base_layer(x)`)
and PEFT's LoRA branch as its forward adds it to that output
(`y.add_(lora_B(lora_A(x)) * scaling)`, dropout being the identity at inference), the work
peft_lora_apply does. Timing the branch on its own is steadier than subtracting two noisy forward
times. torch uses every core, as OpenBLAS does in bench_serve.

usage: python bench/serve_vs_peft.py BUILD_DIR [--repeat N]   (BUILD_DIR is unused; scripts/bench.sh passes it)
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from peft import LoraConfig, get_peft_model


class OneLayer(torch.nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(in_features, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def median_seconds(fn, repeat: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir", nargs="?")
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, median of {args.repeat}")
    print("| layer | batch | rank | torch base ms | PEFT branch ms | overhead |")
    print("|---|---|---|---|---|---|")
    for name, in_features, out_features in (("q_proj", 4096, 4096), ("up_proj", 4096, 11008),
                                            ("down_proj", 11008, 4096)):
        for batch in (1, 16, 256):
            x = torch.randn(batch, in_features)
            for rank in (8, 16, 64):
                model = get_peft_model(OneLayer(in_features, out_features),
                                       LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["proj"]))
                layer = model.base_model.model.proj
                torch.nn.init.normal_(layer.lora_B["default"].weight, std=0.02)
                model.eval()
                with torch.inference_mode():
                    y = layer.base_layer(x)
                    lora_a, lora_b = layer.lora_A["default"], layer.lora_B["default"]
                    scaling = layer.scaling["default"]
                    base = median_seconds(lambda: layer.base_layer(x), args.repeat)
                    branch = median_seconds(lambda: y.add_(lora_b(lora_a(x)) * scaling), args.repeat)
                print(f"| {name} | {batch} | {rank} | {base * 1e3:.3f} | {branch * 1e3:.3f} | "
                      f"{100 * branch / base:.1f}% |")


if __name__ == "__main__":
    main()
