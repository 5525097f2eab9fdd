"""Peak memory and time of the combining paths against the plain merge, on the 1.3 GB LLaMA-shaped bf16
model and rank-16 adapter of bench/merge_bench_data.py (made once under ~/.cache/peft_c/bench).

Two "fine-tuned models" are made first with `peftc merge` (the base plus the adapter at weights 1 and
-0.5). Then, each in its own process, best of --repeat runs:
* `peftc merge` of the adapter (the reference: the streaming merge);
* `peftc merge` of the adapter twice with `--combine ties --density 0.5` (the adapters' deltas
  combined per module before they go in);
* `peftc model combine` of the two models, `linear` and `ties --density 0.5` (whole-model task
  arithmetic, streamed in slices);
wall time and peak RSS (GNU time's %M, else ru_maxrss). The largest tensors are the embedding and
lm_head, 32000 x 2048 (262 MB as f32).

usage: python bench/combine_memory.py BUILD_DIR [--repeat N]
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import merge_bench_data  # noqa: E402
from merge_vs_peft import run  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir", type=pathlib.Path)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    peftc = str(args.build_dir.resolve() / "peftc")
    data = merge_bench_data.ensure()
    base, adapter = data / "base", data / "adapter"
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="peft_c_combine_bench_"))
    try:
        models = []
        for i, weight in enumerate((1.0, -0.5)):
            out = scratch / f"model{i}"
            run([peftc, "merge", "--base", str(base), "--adapter", f"{adapter}:{weight}", "--out", str(out)])
            models.append(out)
        jobs = {
            "`peftc merge` (one adapter)": ["merge", "--base", str(base), "--adapter", str(adapter)],
            "`peftc merge --combine ties` (two adapters)": [
                "merge", "--base", str(base), "--adapter", f"{adapter}:1", "--adapter", f"{adapter}:-0.5",
                "--combine", "ties", "--density", "0.5"],
            "`peftc model combine --method linear` (two models)": [
                "model", "combine", "--base", str(base), "--model", f"{models[0]}:0.5", "--model", f"{models[1]}:0.5",
                "--method", "linear"],
            "`peftc model combine --method ties` (two models)": [
                "model", "combine", "--base", str(base), "--model", f"{models[0]}:0.5", "--model", f"{models[1]}:0.5",
                "--method", "ties", "--density", "0.5"],
        }
        print("| job | wall time | peak RSS |")
        print("|---|---:|---:|")
        for name, argv in jobs.items():
            best = None
            for _ in range(args.repeat):
                out = scratch / "out"
                shutil.rmtree(out, ignore_errors=True)
                seconds, rss = run([peftc, *argv, "--out", str(out)])
                best = (seconds, rss) if best is None or seconds < best[0] else best
            print(f"| {name} | {best[0]:.2f} s | {best[1]:.0f} MB |", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
