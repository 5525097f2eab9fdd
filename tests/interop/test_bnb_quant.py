"""peft_c's bitsandbytes quantizers and dequantizers (src/core/quant/bnb_4bit, bnb_int8) against the
bitsandbytes package on CPU, byte for byte: NF4 and FP4 with and without double quantization, the 8-bit
blockwise format of the nested absmax, the mean torch takes of the absmax, and LLM.int8() rows.

The library runs through `bnb_quant_driver` (tests/interop/bnb_quant_driver.cpp) on raw files.
Environment: PEFT_BNB_QUANT_DRIVER, the driver binary (default <repo>/build/tests/interop/bnb_quant_driver).
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")
F = bnb.functional

REPO = pathlib.Path(__file__).resolve().parents[2]
DRIVER = pathlib.Path(os.environ.get("PEFT_BNB_QUANT_DRIVER")
                      or REPO / "build" / "tests" / "interop" / "bnb_quant_driver")


@pytest.fixture(scope="module")
def drive(tmp_path_factory):
    if not DRIVER.exists():
        pytest.fail(f"bnb_quant_driver not built at {DRIVER}", pytrace=False)
    folder = tmp_path_factory.mktemp("bnb")
    counter = iter(range(10**6))

    def put(array) -> str:
        path = folder / f"in{next(counter)}.bin"
        path.write_bytes(np.ascontiguousarray(array).tobytes())
        return str(path)

    def run(op, *args, outputs=1):
        outs = [str(folder / f"out{next(counter)}.bin") for _ in range(outputs)]
        subprocess.run([str(DRIVER), op, *map(str, args), *outs], check=True)
        return [pathlib.Path(o).read_bytes() for o in outs]

    run.put = put
    return run


def samples(n: int, seed: int) -> torch.Tensor:
    """Normal values with a zero stretch, huge values and exact ties with code midpoints mixed in."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * 0.05
    if n > 200:
        x[64:128] = 0.0                       # a whole zero block
        x[130] = 3.0e38                       # a huge value in a block
        x[140:150] = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.25, 0.0, -0.0, 1e-30, -1e-30, 0.75])
    return x


SIZES = [64, 256, 4096, 4160, 1000, 63, 37, 4097]   # multiples of the block size and not; odd counts


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("double", [False, True], ids=["single", "double"])
@pytest.mark.parametrize("blocksize", [64, 128])
@pytest.mark.parametrize("n", SIZES)
def test_4bit_round_trip_matches_bitsandbytes(drive, quant_type, double, blocksize, n):
    x = samples(n, n + blocksize)
    packed, state = F.quantize_4bit(x, blocksize=blocksize, quant_type=quant_type, compress_statistics=double)
    # Our quantizer: packed codes and absmax equal to bitsandbytes'.
    got_packed, got_absmax = drive("q4", drive.put(x.numpy()), n, blocksize, quant_type, outputs=2)
    assert got_packed == packed.numpy().tobytes()
    absmax = state.absmax if not double else None
    if double:
        # The nested statistics: torch's mean of the absmax, then the 8-bit blockwise quantizer.
        raw_absmax = np.frombuffer(got_absmax, dtype=np.float32)
        offset = np.frombuffer(drive("mean", drive.put(raw_absmax), raw_absmax.size)[0], dtype=np.float32)[0]
        assert offset.tobytes() == np.float32(state.offset.item()).tobytes()
        centred = torch.from_numpy(raw_absmax.copy()) - state.offset
        q, nested = drive("q8", drive.put(centred.numpy()), centred.numel(), 256,
                          drive.put(state.state2.code.numpy()), outputs=2)
        assert q == state.absmax.numpy().tobytes()
        assert nested == state.state2.absmax.numpy().tobytes()
        # The absmax as bitsandbytes dequantizes it.
        deq = drive("deq8", drive.put(state.absmax.numpy()), drive.put(state.state2.absmax.numpy()),
                    drive.put(state.state2.code.numpy()), 256, state.absmax.numel(), outputs=1)[0]
        ref_absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
        absmax = torch.from_numpy(np.frombuffer(deq, dtype=np.float32).copy()) + state.offset
        assert absmax.numpy().tobytes() == ref_absmax.numpy().tobytes()
    else:
        assert got_absmax == state.absmax.numpy().tobytes()
    # Our dequantizer: bitsandbytes' CPU dequantization bit for bit.
    out = drive("deq4", drive.put(packed.numpy()), drive.put(absmax.numpy()), drive.put(state.code.numpy()),
                blocksize, n, quant_type, n, outputs=1)[0]
    assert out == F.dequantize_4bit(packed, state).reshape(-1).numpy().tobytes()


@pytest.mark.parametrize("shape,blocksize", [((64, 64), 64), ((96, 40), 64), ((33, 17), 64), ((64, 72), 2048),
                                             ((64, 64), 2048), ((96, 40), 32)])
@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
def test_4bit_dequantize_2d_matches_bitsandbytes(drive, shape, blocksize, quant_type):
    """2-D weights as Params4bit holds them (bitsandbytes' native CPU kernel, its AVX-512 or its scalar
    branch, for an even last dimension; its torch fallback for an odd one or a block of 2048 and more)."""
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(7)) * 0.02
    x[0, :4] = 1e-6  # FP4 index 8 (tiny positive values), a negative zero in one of the kernel's tables
    packed, state = F.quantize_4bit(x, blocksize=blocksize, quant_type=quant_type, compress_statistics=True)
    absmax = F.dequantize_blockwise(state.absmax, state.state2) + state.offset
    out = drive("deq4", drive.put(packed.numpy()), drive.put(absmax.numpy()), drive.put(state.code.numpy()),
                blocksize, x.numel(), quant_type, shape[-1], outputs=1)[0]
    assert out == F.dequantize_4bit(packed, state).numpy().tobytes()


@pytest.mark.parametrize("n", [1, 5, 15, 16, 17, 64, 100, 255, 256, 1000, 4096, 20000, 32768])
def test_mean_matches_torch(drive, n):
    x = torch.rand(n, generator=torch.Generator().manual_seed(n)) * 0.1
    got = drive("mean", drive.put(x.numpy()), n)[0]
    assert got == x.mean().numpy().tobytes()


@pytest.mark.parametrize("capability", ["avx2", "default"])
def test_mean_matches_torch_on_other_cpu_capabilities(drive, tmp_path, capability):
    """torch picks its CPU kernels at run time (ATEN_CPU_CAPABILITY caps the choice): the double-quant
    offset, torch's mean, is the same sum under AVX2 and without SIMD as under AVX-512 (8-wide vectors,
    ATen's generic Vectorized<float> included), and ours equals it."""
    sizes = [17, 256, 1000, 4096, 20000, 32768]
    script = ("import sys, torch\n"
              "assert torch.backends.cpu.get_cpu_capability() == sys.argv[1].upper()\n"
              "for n in map(int, sys.argv[2:]):\n"
              "    x = torch.rand(n, generator=torch.Generator().manual_seed(n)) * 0.1\n"
              "    print(x.mean().numpy().tobytes().hex())\n")
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    out = subprocess.run([sys.executable, "-c", script, capability, *map(str, sizes)], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    for n, theirs in zip(sizes, out, strict=True):
        x = torch.rand(n, generator=torch.Generator().manual_seed(n)) * 0.1
        assert drive("mean", drive.put(x.numpy()), n)[0].hex() == theirs, n


@pytest.mark.parametrize("shape", [(64, 64), (7, 33), (1, 5)])
def test_int8_matches_bitsandbytes(drive, shape):
    g = torch.Generator().manual_seed(shape[0])
    x = torch.randn(*shape, generator=g)
    x[0, : min(3, shape[1])] = torch.tensor([0.5, -0.5, 1.5])[: min(3, shape[1])]
    if shape[0] > 2:
        x[1] = 0.0          # a zero row
        x[2, 0] = 6.0e4     # a huge value
    q, scb, _ = F.int8_vectorwise_quant(x)
    got_q, got_scb = drive("qi8", drive.put(x.numpy()), shape[0], shape[1], outputs=2)
    assert got_q == q.numpy().tobytes()
    assert got_scb == scb.numpy().tobytes()
    out = drive("deqi8", drive.put(q.numpy()), drive.put(scb.numpy()), shape[0], shape[1])[0]
    assert out == F.int8_vectorwise_dequant(q, scb).numpy().tobytes()
