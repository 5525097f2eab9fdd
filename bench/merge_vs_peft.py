"""`peftc merge` against PEFT on a 1.3 GB LLaMA-shaped bf16 model with a rank-16 adapter on every
linear layer (bench/merge_bench_data.py makes them once, under ~/.cache/peft_c/bench).

PEFT does what a user does: AutoModelForCausalLM.from_pretrained(base, dtype=bfloat16),
PeftModel.from_pretrained(model, adapter), merge_and_unload(), save_pretrained(out). peftc does
`peftc merge --base BASE --adapter ADAPTER --out OUT`. Each runs in its own process; wall time and
peak RSS (GNU time's %M when /usr/bin/time exists, else ru_maxrss from wait4) are measured, best of
--repeat runs. peftc flushes its output to disk before renaming it into place; PEFT does not, so the
PEFT times are the cheaper kind. Afterwards the two outputs are compared: same tensor names, and the
bf16 weights at most 1 ulp apart.

usage: python bench/merge_vs_peft.py BUILD_DIR [--repeat N] [--threads N]
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import merge_bench_data  # noqa: E402

GNU_TIME = "/usr/bin/time"

PEFT_MERGE = r"""
import sys, warnings, torch
warnings.simplefilter("ignore")
from transformers import AutoModelForCausalLM
from peft import PeftModel
base, adapter, out = sys.argv[1:4]
model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
model.save_pretrained(out)
"""

COMPARE = r"""
import sys, torch
from safetensors.torch import load_file
from pathlib import Path
def load(folder):
    tensors = {}
    for p in sorted(Path(folder).glob("*.safetensors")):
        tensors.update(load_file(str(p)))
    return tensors
a, b = load(sys.argv[1]), load(sys.argv[2])
assert sorted(a) == sorted(b), "tensor names differ"
worst, same, total = 0, 0, 0
for k in a:
    x = a[k].view(torch.int16).to(torch.int32); y = b[k].view(torch.int16).to(torch.int32)
    x = torch.where(x < 0, -(x & 0x7FFF), x); y = torch.where(y < 0, -(y & 0x7FFF), y)
    d = (x - y).abs()
    worst = max(worst, int(d.max())); same += int((d == 0).sum()); total += d.numel()
print(f"{len(a)} tensors, max {worst} ulp apart, {100.0 * same / total:.4f}% identical")
"""


def run(argv: list[str]) -> tuple[float, float]:
    """(seconds, peak RSS in MB) of one run; exits on failure."""
    timed = os.path.exists(GNU_TIME)
    full = [GNU_TIME, "-f", "%M", *argv] if timed else argv
    start = time.perf_counter()
    process = subprocess.Popen(full, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    if status != 0:
        sys.exit(f"failed: {' '.join(argv)}\n{stderr}")
    rss_mb = usage.ru_maxrss / 1024.0
    if timed:
        rss_mb = int(stderr.strip().splitlines()[-1]) / 1024.0
    return seconds, rss_mb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir", type=pathlib.Path)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", type=int, default=0, help="peftc --threads (0: all cores)")
    args = parser.parse_args()
    peftc = (args.build_dir / "peftc").resolve()
    if not peftc.exists():
        sys.exit(f"{peftc} does not exist: build the peftc target first")
    data = merge_bench_data.ensure()
    base, adapter = data / "base", data / "adapter"
    size = sum(p.stat().st_size for p in base.glob("*.safetensors"))

    scratch = pathlib.Path(tempfile.mkdtemp(prefix="merge_vs_peft_", dir=data))
    try:
        results = {"peftc": [], "peft": []}
        for _ in range(args.repeat):
            for name in ("peftc", "peft"):
                out = scratch / name
                shutil.rmtree(out, ignore_errors=True)
                if name == "peftc":
                    argv = [str(peftc), "merge", "--base", str(base), "--adapter", str(adapter), "--out", str(out),
                            "--threads", str(args.threads)]
                else:
                    argv = [sys.executable, "-c", PEFT_MERGE, str(base), str(adapter), str(out)]
                results[name].append(run(argv))
        check = subprocess.run([sys.executable, "-c", COMPARE, str(scratch / "peftc"), str(scratch / "peft")],
                               capture_output=True, text=True)
        agreement = check.stdout.strip() if check.returncode == 0 else "outputs differ: " + check.stderr.strip()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    best = {name: (min(r[0] for r in runs), min(r[1] for r in runs)) for name, runs in results.items()}
    (pt, pm), (rt, rm) = best["peftc"], best["peft"]
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    print(f"## merge: {size / 1e9:.2f} GB bf16 LLaMA-shaped model ({merge_bench_data.LAYERS} layers, hidden "
          f"{merge_bench_data.HIDDEN}), rank-{merge_bench_data.RANK} LoRA on every linear layer")
    print(f"machine: {os.cpu_count()} cores, {cpu}; best of {args.repeat} runs each\n")
    print("| | wall time (s) | peak RSS (MB) |")
    print("|---|---:|---:|")
    print(f"| peftc merge | {pt:.2f} | {pm:.0f} |")
    print(f"| PEFT load + merge_and_unload + save_pretrained | {rt:.2f} | {rm:.0f} |")
    print(f"| peftc / PEFT | {rt / pt:.1f}x faster | {pm / rm:.3f} of PEFT's memory |")
    print(f"\nagreement: {agreement}")


if __name__ == "__main__":
    main()
