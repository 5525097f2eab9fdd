"""Opening a sharded checkpoint whose index names many tensors, and an adapter_config.json with many
keys: peft_c (peftc inspect / peftc adapter inspect --config) beside Python (json.load of the index and
safetensors.safe_open of each shard's keys; json.load of the config), at growing sizes. The time must
grow linearly with the size (issue 13: the index took quadratic time before).

usage: python bench/index_scale_vs_python.py BUILD_DIR [SIZES...]   (default sizes 160000 1000000)
"""
import json
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def child_seconds(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = timed(lambda: subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def make_checkpoint(folder: pathlib.Path, tensors: int):
    one = np.zeros((1,), dtype=np.float32)
    weight_map = {}
    for shard in range(2):
        name = f"model-{shard + 1:05d}-of-00002.safetensors"
        keys = [f"layer.{i}.weight" for i in range(shard, tensors, 2)]
        save_file({k: one for k in keys}, str(folder / name))
        weight_map.update({k: name for k in keys})
    index = {"metadata": {"total_size": 4 * tensors}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def python_open(folder: pathlib.Path):
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    for shard in sorted(set(index["weight_map"].values())):
        with safe_open(str(folder / shard), "np") as f:
            list(f.keys())


def main():
    build = pathlib.Path(sys.argv[1])
    sizes = [int(s) for s in sys.argv[2:]] or [160_000, 1_000_000]
    peftc = str(build / "peftc")
    print("| tensors in the index | peftc inspect: wall s (CPU s) | Python json + safe_open: s | ratio |")
    print("|---|---|---|---|")
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            folder = pathlib.Path(tmp)
            make_checkpoint(folder, n)
            wall, cpu = child_seconds([peftc, "inspect", str(folder)])
            py = timed(lambda: python_open(folder))
            print(f"| {n:,} | {wall:.2f} ({cpu:.2f}) | {py:.2f} | {wall / py:.2f} |")


if __name__ == "__main__":
    main()
