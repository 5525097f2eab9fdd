"""Open + index at 10,000 and 100,000 tensors: peft_c (bench_open, the public C API) against the native
readers, in one run, interleaved:

- safetensors files written by `safetensors.numpy.save_file`, against the Rust `safetensors` crate
  (bench/references/rust_open: memory-mapped, `SafeTensors::deserialize`, every tensor found by name);
- GGUF files written by gguf-py (llama.cpp's own writer), against llama.cpp's `gguf_init_from_file`
  (bench/references/llama_gguf_open.cpp: the tensor shapes' ggml context and the name index that
  llama.cpp's model loader builds).

Each program opens the file ITERATIONS times and reports its median; a round runs all of them once per
file, and the table gives the median over ROUNDS rounds with the range of the per-round ratios.
The Rust program is built with cargo and the llama.cpp one with c++ against the static ggml-base of
scripts/llama-cpp.sh's build (`eval "$(scripts/llama-cpp.sh --env)"` first, as scripts/bench.sh does),
both into the cache outside the clone.

usage: python bench/open_vs_native.py BUILD_DIR
"""
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

HERE = Path(__file__).resolve().parent
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "peft_c"
SIZES = (10_000, 100_000)
ROUNDS = 5
TARGET_VS_RUST = 2.0  # issue 34: open + index at least 2x the Rust crate


def iterations_for(n_tensors):
    return 40 if n_tensors <= 10_000 else 20


def build_rust_reference():
    cargo = shutil.which("cargo") or str(Path.home() / ".cargo" / "bin" / "cargo")
    target = CACHE / "cargo-target" / "bench-open"
    subprocess.run([cargo, "build", "--release", "--locked", "--quiet"], cwd=HERE / "references" / "rust_open",
                   env={**os.environ, "CARGO_TARGET_DIR": str(target)}, check=True)
    return target / "release" / "rust_open"


def build_llama_reference():
    src = os.environ.get("PEFT_LLAMA_CPP_SRC")
    bin_dir = os.environ.get("PEFT_LLAMA_CPP_BIN")
    if not src or not bin_dir:
        sys.exit("open_vs_native.py: run `eval \"$(scripts/llama-cpp.sh --env)\"` first (scripts/bench.sh does)")
    library = Path(bin_dir).parent / "ggml" / "src" / "libggml-base.a"
    source = HERE / "references" / "llama_gguf_open.cpp"
    key = hashlib.sha256(source.read_bytes() + (HERE / "open_timing.hpp").read_bytes() +
                         str(library).encode()).hexdigest()[:12]
    program = CACHE / "bench" / f"llama_gguf_open-{key}"
    if not program.exists():
        program.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["c++", "-std=c++17", "-O2", "-I", f"{src}/ggml/include", str(source), str(library),
                        "-lpthread", "-lm", "-o", str(program)], check=True)
    return program


def tensor_name(i):
    return f"model.layers.{i // 10}.block.weight_{i % 10}"


def write_safetensors(path, n_tensors):
    rng = np.random.default_rng(0)
    dtypes = [np.float32, np.float16, np.int64, np.uint8]
    save_file({tensor_name(i): rng.random((4, 3)).astype(dtypes[i % 4]) for i in range(n_tensors)}, path,
              metadata={"format": "pt"})


def write_gguf(path, n_tensors):
    sys.path.insert(0, os.environ["PEFT_GGUF_PY"])
    import gguf

    writer = gguf.GGUFWriter(path, "llama")
    dtypes = [np.float32, np.float16]
    for i in range(n_tensors):
        writer.add_tensor(tensor_name(i), np.zeros((4, 3), dtype=dtypes[i % 2]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def median_us(program, path, iterations):
    out = subprocess.run([str(program), str(path), str(iterations)], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["median_us"]


def main():
    build = Path(sys.argv[1])
    peft = build / "bench" / "bench_open"
    rust = build_rust_reference()
    llama = build_llama_reference()
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        for n in SIZES:
            st = Path(tmp) / f"many-{n}.safetensors"
            write_safetensors(st, n)
            cases.append(("safetensors", n, st, rust, "Rust safetensors 0.7.0", TARGET_VS_RUST))
            gg = Path(tmp) / f"many-{n}.gguf"
            write_gguf(gg, n)
            cases.append(("GGUF", n, gg, llama, "llama.cpp gguf_init_from_file", None))
        times = {id(c): ([], []) for c in cases}
        for _ in range(ROUNDS):
            for case in cases:
                _, n, path, reference, _, _ = case
                ours, theirs = times[id(case)]
                ours.append(median_us(peft, path, iterations_for(n)))
                theirs.append(median_us(reference, path, iterations_for(n)))
        print("| file | tensors | peft_c ms | reference | reference ms | ratio (range over rounds) | target |")
        print("|---|---:|---:|---|---:|---|---|")
        for case in cases:
            kind, n, path, _, reference_name, target = case
            ours, theirs = times[id(case)]
            ratios = sorted(t / o for o, t in zip(ours, theirs))
            ratio = statistics.median(theirs) / statistics.median(ours)
            verdict = "-" if target is None else f">= {target:.1f}x: {'met' if ratio >= target else 'MISSED'}"
            print(f"| {kind} | {n:,} | {statistics.median(ours) / 1000:.2f} | {reference_name} | "
                  f"{statistics.median(theirs) / 1000:.2f} | {ratio:.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f}) | "
                  f"{verdict} |")


if __name__ == "__main__":
    main()
