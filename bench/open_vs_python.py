"""Header parse + index of a 10,000-tensor safetensors file: peft_c (bench_open) against Python
safetensors.safe_open on the same file, in one run. Prints a Markdown table row set.

usage: python bench/open_vs_python.py BUILD_DIR
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

N_TENSORS = 10_000
ITERATIONS = 50


def python_open_index(path):
    times = []
    for _ in range(ITERATIONS):
        start = time.perf_counter()
        with safe_open(path, framework="np") as f:
            names = f.keys()
            for name in names:  # the same work as bench_open: every tensor's dtype and shape
                sl = f.get_slice(name)
                sl.get_dtype(), sl.get_shape()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times), min(times)


def main():
    build = sys.argv[1]
    rng = np.random.default_rng(0)
    dtypes = [np.float32, np.float16, np.int64, np.uint8]
    tensors = {
        f"model.layers.{i // 10}.block.weight_{i % 10}": rng.random((4, 3)).astype(dtypes[i % 4])
        for i in range(N_TENSORS)
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "many.safetensors")
        save_file(tensors, path, metadata={"format": "pt"})
        header_bytes = int.from_bytes(open(path, "rb").read(8), "little")
        py_median, py_best = python_open_index(path)
        out = subprocess.run([os.path.join(build, "bench", "bench_open"), path, str(ITERATIONS)],
                             check=True, capture_output=True, text=True).stdout
        c = json.loads(out)
    print(f"| open + index, {N_TENSORS} tensors, {header_bytes} header bytes | "
          f"{c['median_us'] / 1000:.2f} ms | {py_median / 1000:.2f} ms | "
          f"{py_median / c['median_us']:.1f}x |")


if __name__ == "__main__":
    main()
