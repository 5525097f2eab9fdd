"""Side by side on the same ~1 GB checkpoint: peft_c's streaming rewrite (`peftc convert`) against
Python `safetensors.torch.save_file` and against `cp` of the same bytes (plain, and followed by an
fsync, since peft_c flushes its output to disk before renaming it into place).

Each contender runs in its own process; peak RSS is that process's ru_maxrss.

usage: python bench/write_vs_python.py [BUILD_DIR] [--peftc build/peftc] [--source FILE] [--folder DIR] [--repeat N]
Without --source, the checkpoint of bench_write (FOLDER/source.safetensors) is used; build and run
`bench_write FOLDER` first, or pass any safetensors file.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]

PYTHON_SAVE = r"""
import sys, torch
from safetensors.torch import load_file, save_file
from safetensors import safe_open
src, dst, dtype = sys.argv[1], sys.argv[2], sys.argv[3]
with safe_open(src, "pt") as f:
    metadata = f.metadata()
tensors = load_file(src)
if dtype != "keep":
    tensors = {k: (v.to(getattr(torch, dtype)) if v.is_floating_point() else v) for k, v in tensors.items()}
save_file(tensors, dst, metadata=metadata)
"""

COPY_FSYNC = r"""
import os, shutil, sys
shutil.copyfile(sys.argv[1], sys.argv[2])
fd = os.open(sys.argv[2], os.O_RDONLY); os.fsync(fd); os.close(fd)
"""


GNU_TIME = "/usr/bin/time"


def run(argv):
    """Runs argv; returns (seconds, peak RSS in MB, ok). With GNU time available, the peak is the
    program's own (%M); otherwise it is ru_maxrss from wait4, which never drops below this Python
    process's RSS at fork time (a floor of about 11 MB)."""
    timed = os.path.exists(GNU_TIME)
    if timed:
        argv = [GNU_TIME, "-f", "%M", *argv]
    start = time.perf_counter()
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    rss_mb = usage.ru_maxrss / 1024.0
    if timed and stderr.strip():
        rss_mb = int(stderr.strip().splitlines()[-1]) / 1024.0
    return seconds, rss_mb, os.waitstatus_to_exitcode(status) == 0


def largest_tensor_mb(path: pathlib.Path) -> float:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return max(e["data_offsets"][1] - e["data_offsets"][0] for e in header.values()) / 1048576.0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("build_dir", nargs="?", help="the build folder (scripts/bench.sh passes it): its peftc")
    parser.add_argument("--peftc", default=None, help="default: BUILD_DIR/peftc, else build/peftc")
    parser.add_argument("--folder", default="/tmp/peft_bench_write")
    parser.add_argument("--source", default=None)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    if args.peftc is None:
        args.peftc = str(pathlib.Path(args.build_dir or REPO / "build") / "peftc")
    folder = pathlib.Path(args.folder)
    source = pathlib.Path(args.source) if args.source else folder / "source.safetensors"
    if not source.exists():
        sys.exit(f"{source} does not exist: run bench_write {folder} first, or pass --source")
    size_mb = source.stat().st_size / 1e6
    largest = largest_tensor_mb(source)
    out = folder / "contender.safetensors"
    contenders = {
        "cp": ["cp", str(source), str(out)],
        "cp+fsync": [sys.executable, "-c", COPY_FSYNC, str(source), str(out)],
        "peftc convert": [args.peftc, "convert", str(source), str(out)],
        "python save_file": [sys.executable, "-c", PYTHON_SAVE, str(source), str(out), "keep"],
        "peftc convert --dtype bf16": [args.peftc, "convert", str(source), str(out), "--dtype", "bf16"],
        "python .to(bf16) + save_file": [sys.executable, "-c", PYTHON_SAVE, str(source), str(out), "bfloat16"],
    }
    print(f"source: {source} ({size_mb:.0f} MB, largest tensor {largest:.0f} MiB), best of {args.repeat}")
    for name, argv in contenders.items():
        best = None
        for _ in range(args.repeat):
            if out.exists():
                out.unlink()
            seconds, rss, ok = run(argv)
            if not ok:
                print(f"{name}: FAILED")
                break
            best = min(best or (seconds, rss), (seconds, rss))
        if best:
            written = out.stat().st_size / 1e6
            print(json.dumps({"contender": name, "seconds": round(best[0], 3),
                              "mb_per_s_written": round(written / best[0], 1),
                              "peak_rss_mb": round(best[1], 1),
                              "peak_rss_over_largest": round(best[1] / largest, 3)}))
    if out.exists():
        out.unlink()


if __name__ == "__main__":
    main()
