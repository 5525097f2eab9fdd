"""Shared fixtures of the binding's tests.

Test files are written by the real reference packages (safetensors.numpy, safetensors.torch and
huggingface_hub's sharding writer) into a temporary folder, so every expectation comes from them.
The package under test is the source tree next to this folder; the library is the one ``PEFT_C_LIB``
names, or else ``<repo>/build/libpeft_c.so`` when it exists, or else the binding's normal lookup.
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import sys

import numpy as np
import pytest

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]
REPO = PACKAGE_ROOT.parents[1]
sys.path.insert(0, str(PACKAGE_ROOT))

if not os.environ.get("PEFT_C_LIB"):
    _default = REPO / "build" / "libpeft_c.so"
    if _default.exists():
        os.environ["PEFT_C_LIB"] = str(_default)

import peft_c  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures"
HEADER = REPO / "include" / "peft_c.h"


def safetensors_bytes(header: dict, data: bytes = b"", pad: bytes = b"") -> bytes:
    """A file made by hand (for malformed inputs the reference writer would never produce)."""
    text = json.dumps(header, separators=(",", ":")).encode() + pad
    return struct.pack("<Q", len(text)) + text + data


def numpy_tensors() -> dict:
    rng = np.random.default_rng(1234)
    return {
        "f32": rng.standard_normal((2, 3)).astype(np.float32),
        "f16": rng.standard_normal((4,)).astype(np.float16),
        "f64": rng.standard_normal((3, 1, 2)),
        "i8": np.array([-128, -1, 0, 127], dtype=np.int8),
        "u8": np.array([0, 1, 255], dtype=np.uint8),
        "i16": np.array([-32768, 7, 32767], dtype=np.int16),
        "u16": np.array([0, 65535], dtype=np.uint16),
        "i32": np.arange(-3, 3, dtype=np.int32).reshape(2, 3),
        "u32": np.array([0, 2**32 - 1], dtype=np.uint32),
        "i64": np.array([-(2**63), 2**63 - 1], dtype=np.int64),
        "u64": np.array([0, 2**64 - 1], dtype=np.uint64),
        "bool": np.array([True, False, True]),
        "c64": np.array([1 + 2j, -3.5j], dtype=np.complex64),
        "scalar": np.array(3.25, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "odd.name/with:chars é": np.ones((1,), dtype=np.float32),
    }


METADATA = {"format": "np", "note": "ünïcode ✓", "empty": ""}


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("peft_c_py")


@pytest.fixture(scope="session")
def np_file(data_dir) -> pathlib.Path:
    """Every numpy-representable dtype, a scalar, an empty tensor, and metadata."""
    from safetensors.numpy import save_file

    path = data_dir / "numpy.safetensors"
    save_file(numpy_tensors(), str(path), metadata=METADATA)
    return path


@pytest.fixture(scope="session")
def torch_file(data_dir) -> pathlib.Path:
    """bfloat16, the float8 types and F4, written by safetensors.torch; no metadata."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(7)
    base = torch.randn(3, 5, generator=gen) * 4
    tensors = {
        "bf16": base.to(torch.bfloat16),
        "f8_e4m3": base.to(torch.float8_e4m3fn),
        "f8_e5m2": base.to(torch.float8_e5m2),
        "f8_e4m3fnuz": base.to(torch.float8_e4m3fnuz),
        "f8_e5m2fnuz": base.to(torch.float8_e5m2fnuz),
        "f8_e8m0": base.abs().add(0.5).to(torch.float8_e8m0fnu),
        "f4": torch.tensor([0x21, 0x7F, 0x80, 0x0F], dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
        "f32": base,
    }
    path = data_dir / "torch.safetensors"
    save_file(tensors, str(path))
    return path


@pytest.fixture(scope="session")
def sharded_dir(data_dir) -> pathlib.Path:
    """A sharded checkpoint folder written by huggingface_hub (model.safetensors.index.json)."""
    torch = pytest.importorskip("torch")
    hub = pytest.importorskip("huggingface_hub")
    folder = data_dir / "sharded"
    folder.mkdir()
    gen = torch.Generator().manual_seed(3)
    state = {f"layer.{i}.weight": torch.randn(16, 16, generator=gen) for i in range(5)}
    state["embed"] = torch.randn(8, 16, generator=gen).to(torch.bfloat16)
    hub.save_torch_state_dict(state, folder, max_shard_size=2500, metadata={"creator": "tests"})
    assert (folder / "model.safetensors.index.json").exists()
    return folder


@pytest.fixture(scope="session")
def single_dir(data_dir) -> pathlib.Path:
    """A folder holding just model.safetensors."""
    from safetensors.numpy import save_file

    folder = data_dir / "single"
    folder.mkdir()
    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(folder / "model.safetensors"))
    return folder


def reference_header(path: pathlib.Path) -> dict:
    """The header as plain JSON (independent of both readers)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n])


# The reference reader's messages, mapped to the codes of its failure kinds.
REFERENCE_KINDS = (
    ("header too small", "HEADER_TOO_SMALL"),
    ("header too large", "HEADER_TOO_LARGE"),
    ("invalid header length", "INVALID_HEADER_LENGTH"),
    ("invalid UTF-8 in header", "INVALID_HEADER_UTF8"),
    ("invalid JSON in header", "INVALID_HEADER"),
    ("invalid offset", "INVALID_OFFSET"),
    ("overflow computing buffer size", "VALIDATION_OVERFLOW"),
    ("slicing for subbytes", "MISALIGNED_SLICE"),
    ("invalid shape, data type, or offset", "TENSOR_INVALID_INFO"),
    ("incomplete metadata", "METADATA_INCOMPLETE_BUFFER"),
)


def reference_verdict(data: bytes):
    """None when the reference accepts the bytes, else the code name of its failure kind."""
    from safetensors import deserialize

    try:
        deserialize(data)
    except Exception as exc:  # SafetensorError
        message = str(exc)
        for needle, name in REFERENCE_KINDS:
            if needle in message:
                return name
        return "OTHER: " + message
    return None
