"""`peftc merge` against the device: how close a checkpoint merge comes to the disk's own speed.

The data is bench/merge_bench_data.py's LLaMA-shaped bf16 model with a rank-16 LoRA on every linear
layer: 10 layers (1.3 GB) by default, 150 layers (15.7 GB, an 8B model's size) with --large or
PEFT_BENCH_LARGE=1 (skipped with a message when the disk has less than 40 GB free). With --gguf the
base is that model converted to F16 GGUF by llama.cpp's convert_hf_to_gguf.py (needs
`eval "$(scripts/llama-cpp.sh --env)"`), with --quant TYPE also quantized by llama-quantize, and the
merge writes one GGUF file (of the base's types: a quantized base is merged and quantized again).

In the same run, side by side:
* the device bound: reading every byte the merge reads (the base's shards and the adapter file) with
  O_DIRECT, and writing the base's size (what the merge writes, give or take its headers) with O_DIRECT and an fsync, 8 MiB at a time
  from page-aligned buffers; the bound is the larger of the two times (the issue's: a device that
  reads and writes at full speed at once);
* the same read and write at the same time, as the merge does them: on a device that shares one
  bandwidth between reads and writes this takes about their sum, and no merge can go faster;
* `peftc merge --base BASE --adapter ADAPTER --out OUT --threads N` for each N of --threads (default:
  1 and every core), its inputs dropped from the page cache first (posix_fadvise DONTNEED), so that
  the merge reads from the device as the bound does; wall time and peak RSS (GNU time, else wait4).

Each figure is the best of --repeat runs. Targets (issue 34): merge / bound <= 1.2x, peak RSS <= 200 MB
plus the adapter file's size (the adapter is mapped).

usage: python bench/merge_vs_device.py BUILD_DIR [--large] [--gguf [--quant TYPE]] [--repeat N] [--threads N,N...]
Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import mmap
import os
import pathlib
import shutil
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "interop"))  # gguf_reference, for --gguf
import merge_bench_data  # noqa: E402
from merge_vs_peft import run  # noqa: E402

CHUNK = 8 << 20
LARGE_LAYERS = 150
LARGE_FREE_BYTES = 40 * 10**9


def drop_from_page_cache(paths: list[pathlib.Path]) -> None:
    os.sync()
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def direct_read_seconds(paths: list[pathlib.Path]) -> float:
    """Reads every byte of `paths` with O_DIRECT; returns the time."""
    buffer = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT wants
    start = time.perf_counter()
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            while os.readv(fd, [buffer]) == CHUNK:
                pass
        finally:
            os.close(fd)
    return time.perf_counter() - start


def direct_write_seconds(path: pathlib.Path, size: int) -> float:
    """Writes `size` bytes (rounded up to CHUNK) of random data with O_DIRECT, then fsync; returns the
    time. The file is removed afterwards."""
    buffer = mmap.mmap(-1, CHUNK)
    buffer.write(os.urandom(CHUNK))
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        for _ in range(-(-size // CHUNK)):
            os.write(fd, buffer)
        os.fsync(fd)
    finally:
        os.close(fd)
    seconds = time.perf_counter() - start
    path.unlink()
    return seconds


def direct_read_and_write_seconds(paths: list[pathlib.Path], path: pathlib.Path, size: int) -> float:
    """The read of direct_read_seconds and the write of direct_write_seconds at the same time, as a
    merge reads and writes (each in its own thread: the calls release the GIL); returns the time until
    both are done. A device that shares one bandwidth between reads and writes takes about the sum of
    the two alone here, not the larger."""
    read: list[float] = []
    reader = threading.Thread(target=lambda: read.append(direct_read_seconds(paths)))
    start = time.perf_counter()
    reader.start()
    direct_write_seconds(path, size)
    reader.join()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build_dir", type=pathlib.Path)
    parser.add_argument("--large", action="store_true", default=os.environ.get("PEFT_BENCH_LARGE") == "1",
                        help=f"the {LARGE_LAYERS}-layer model (15.7 GB) instead of the 10-layer one")
    parser.add_argument("--gguf", action="store_true", help="the base as F16 GGUF (convert_hf_to_gguf.py)")
    parser.add_argument("--quant", metavar="TYPE",
                        help="with --gguf: that F16 GGUF quantized by llama-quantize (Q4_K_M, Q8_0, ...)")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--threads", default=f"1,{os.cpu_count()}", help="peftc --threads values, comma-separated")
    args = parser.parse_args()
    peftc = (args.build_dir / "peftc").resolve()
    if not peftc.exists():
        sys.exit(f"{peftc} does not exist: build the peftc target first")
    layers = LARGE_LAYERS if args.large else merge_bench_data.LAYERS
    if args.large and not (merge_bench_data.cache_dir(layers) / ".complete").exists():
        free = shutil.disk_usage(merge_bench_data.cache_dir(layers).parent.parent).free
        if free < LARGE_FREE_BYTES:
            print(f"## merge against the device, {LARGE_LAYERS} layers: skipped, {free / 1e9:.0f} GB free "
                  f"(the data, the output and the write test need {LARGE_FREE_BYTES / 1e9:.0f} GB)")
            return
    if args.quant and not args.gguf:
        sys.exit("--quant needs --gguf")
    if args.gguf and not os.environ.get("PEFT_LLAMA_CPP_BIN"):
        print("## merge against the device, GGUF: skipped, PEFT_LLAMA_CPP_BIN is not set "
              "(eval \"$(scripts/llama-cpp.sh --env)\")")
        return
    data = merge_bench_data.ensure(layers)
    adapter = data / "adapter"
    threads = [int(t) for t in args.threads.split(",")]

    scratch = pathlib.Path(tempfile.mkdtemp(prefix="merge_vs_device_", dir=data))
    try:
        if args.gguf:
            from gguf_reference import convert_hf_to_gguf, quantize
            base = convert_hf_to_gguf(data / "base", scratch / "base.f16.gguf", outtype="f16")
            if args.quant:
                f16 = base
                base = quantize(f16, scratch / f"base.{args.quant}.gguf", type=args.quant, threads=os.cpu_count())
                f16.unlink()
            inputs = [base]
        else:
            base = data / "base"
            inputs = sorted(base.glob("*.safetensors"))
        inputs.append(adapter / "adapter_model.safetensors")
        base_bytes = sum(p.stat().st_size for p in inputs[:-1])
        adapter_bytes = inputs[-1].stat().st_size
        reads, writes, both, merges = [], [], [], {t: [] for t in threads}
        for _ in range(args.repeat):
            drop_from_page_cache(inputs)
            reads.append(direct_read_seconds(inputs))
            writes.append(direct_write_seconds(scratch / "direct-write", base_bytes))
            drop_from_page_cache(inputs)
            both.append(direct_read_and_write_seconds(inputs, scratch / "direct-write", base_bytes))
            for t in threads:
                out = scratch / ("merged.gguf" if args.gguf else "merged")
                drop_from_page_cache(inputs)
                merges[t].append(run([str(peftc), "merge", "--base", str(base), "--adapter", str(adapter), "--out",
                                      str(out), "--threads", str(t)]))
                if args.gguf:
                    out.unlink()
                else:
                    shutil.rmtree(out)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    read, write, at_once = min(reads), min(writes), min(both)
    bound = max(read, write)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    kind = f"{args.quant or 'F16'} GGUF" if args.gguf else "bf16 safetensors"
    print(f"## merge against the device: {base_bytes / 1e9:.2f} GB {kind} LLaMA-shaped model ({layers} layers), "
          f"rank-{merge_bench_data.RANK} LoRA on every linear layer ({adapter_bytes / 1e6:.0f} MB)")
    print(f"machine: {os.cpu_count()} cores, {cpu}; best of {args.repeat} runs each\n")
    print(f"device, O_DIRECT: read {(base_bytes + adapter_bytes) / 1e9:.2f} GB in {read:.2f} s "
          f"({(base_bytes + adapter_bytes) / read / 1e9:.2f} GB/s), write {base_bytes / 1e9:.2f} GB + fsync in "
          f"{write:.2f} s ({base_bytes / write / 1e9:.2f} GB/s): bound {bound:.2f} s (the larger); "
          f"the same read and write at once: {at_once:.2f} s ({at_once / bound:.2f}x the bound)\n")
    rss_target = 200 + adapter_bytes / 1e6
    print("| peftc merge | wall time (s) | / device bound (target <= 1.2x) | / read and write at once | "
          f"peak RSS (MB) (target <= {rss_target:.0f}) |")
    print("|---|---:|---:|---:|---:|")
    for t in threads:
        seconds, rss = min(r[0] for r in merges[t]), min(r[1] for r in merges[t])
        ratio = seconds / bound
        print(f"| --threads {t} | {seconds:.2f} | {ratio:.2f}x ({'met' if ratio <= 1.2 else 'missed'}) | "
              f"{seconds / at_once:.2f}x | {rss:.0f} ({'met' if rss <= rss_target else 'missed'}) |")


if __name__ == "__main__":
    main()
