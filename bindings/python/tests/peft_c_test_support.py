"""Helpers of the binding's tests (a distinct module name, so that running these tests together with
another folder's tests never picks up the wrong ``conftest``)."""

from __future__ import annotations

import json
import os
import pathlib
import struct

import numpy as np

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]
REPO = PACKAGE_ROOT.parents[1]
FIXTURES = pathlib.Path(os.environ.get("PEFT_TEST_DATA") or REPO / "tests" / "fixtures")
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


def expected_entries(table: dict):
    """(file name, expected code name) of each case of tests/fixtures/malformed/expected.json."""
    for name, entry in sorted(table.items()):
        yield name, entry["code"]
