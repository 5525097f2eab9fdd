"""The safetensors dtypes of peft_c and their numpy counterparts.

``DTYPES`` mirrors the ``PEFT_DTYPE_*`` constants of ``include/peft_c.h`` (checked by a test that parses
the header). The numpy mapping uses ``ml_dtypes`` for bfloat16 and the float8 types when it is
installed; without it those tensors are viewed as raw unsigned integers of the same width.
"""

from __future__ import annotations

import enum
from typing import Dict, Optional, Tuple, Union

import numpy as np

try:  # optional: gives bfloat16 and float8 numpy dtypes
    import ml_dtypes as _ml
except ImportError:  # pragma: no cover - depends on the environment
    _ml = None

# (value, NAME as in PEFT_DTYPE_NAME and in safetensors headers, bits per element)
DTYPES: Tuple[Tuple[int, str, int], ...] = (
    (0, "BOOL", 8),
    (1, "F4", 4),
    (2, "F6_E2M3", 6),
    (3, "F6_E3M2", 6),
    (4, "U8", 8),
    (5, "I8", 8),
    (6, "F8_E5M2", 8),
    (7, "F8_E4M3", 8),
    (8, "F8_E8M0", 8),
    (9, "F8_E4M3FNUZ", 8),
    (10, "F8_E5M2FNUZ", 8),
    (11, "I16", 16),
    (12, "U16", 16),
    (13, "F16", 16),
    (14, "BF16", 16),
    (15, "I32", 32),
    (16, "U32", 32),
    (17, "F32", 32),
    (18, "C64", 64),
    (19, "F64", 64),
    (20, "I64", 64),
    (21, "U64", 64),
)
DTYPE_COUNT = len(DTYPES)

DType = enum.IntEnum("DType", [(name, value) for value, name, _ in DTYPES])
DType.__doc__ = "The safetensors dtypes (PEFT_DTYPE_*), numbered as the reference numbers them."
DType.__module__ = "peft_c"

_BITS: Dict[int, int] = {value: bits for value, _, bits in DTYPES}

# numpy dtypes that need nothing but numpy (explicitly little-endian, as the file stores them).
_NUMPY_PLAIN: Dict[str, str] = {
    "BOOL": "?",
    "U8": "u1",
    "I8": "i1",
    "I16": "<i2",
    "U16": "<u2",
    "F16": "<f2",
    "I32": "<i4",
    "U32": "<u4",
    "F32": "<f4",
    "C64": "<c8",
    "F64": "<f8",
    "I64": "<i8",
    "U64": "<u8",
}

# Types that ml_dtypes provides, and the raw integer used without it.
_ML_NAMES: Dict[str, Tuple[str, str]] = {
    "BF16": ("bfloat16", "<u2"),
    "F8_E5M2": ("float8_e5m2", "u1"),
    "F8_E4M3": ("float8_e4m3fn", "u1"),
    "F8_E8M0": ("float8_e8m0fnu", "u1"),
    "F8_E4M3FNUZ": ("float8_e4m3fnuz", "u1"),
    "F8_E5M2FNUZ": ("float8_e5m2fnuz", "u1"),
}

# Sub-byte types pack several elements per byte; numpy has no such dtype, so they are raw bytes.
PACKED = frozenset({DType.F4, DType.F6_E2M3, DType.F6_E3M2})

DTypeLike = Union[str, int, "DType", np.dtype, type]


def dtype_bits(dtype: DTypeLike) -> int:
    """Size of one element in bits."""
    return _BITS[int(as_dtype(dtype))]


def numpy_dtype(dtype: DTypeLike, *, use_ml_dtypes: bool = True) -> Optional[np.dtype]:
    """The numpy dtype whose elements are this dtype's elements, or None for a packed sub-byte dtype.

    Without ml_dtypes (or with ``use_ml_dtypes=False``) bfloat16 maps to ``uint16`` and the float8 types
    to ``uint8``: the same bits, uninterpreted.
    """
    name = as_dtype(dtype).name
    if name in _NUMPY_PLAIN:
        return np.dtype(_NUMPY_PLAIN[name])
    if name in _ML_NAMES:
        ml_name, raw = _ML_NAMES[name]
        if use_ml_dtypes and _ml is not None and hasattr(_ml, ml_name):
            return np.dtype(getattr(_ml, ml_name))
        return np.dtype(raw)
    return None


def _from_numpy(dt: np.dtype) -> DType:
    for name, code in _NUMPY_PLAIN.items():
        if np.dtype(code) == dt.newbyteorder("<"):
            return DType[name]
    if _ml is not None:
        for name, (ml_name, _) in _ML_NAMES.items():
            if hasattr(_ml, ml_name) and dt == np.dtype(getattr(_ml, ml_name)):
                return DType[name]
    raise ValueError(f"numpy dtype {dt} has no safetensors dtype")


def as_dtype(dtype: DTypeLike) -> DType:
    """Accepts a safetensors name ("BF16"), a ``DType``, its integer value or a numpy dtype."""
    if isinstance(dtype, DType):
        return dtype
    if isinstance(dtype, str):
        try:
            return DType[dtype]
        except KeyError:
            raise ValueError(f"unknown safetensors dtype name {dtype!r}") from None
    if isinstance(dtype, (int, np.integer)) and not isinstance(dtype, bool):
        try:
            return DType(int(dtype))
        except ValueError:
            raise ValueError(f"unknown dtype value {int(dtype)}") from None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"cannot interpret {dtype!r} as a dtype") from None
    return _from_numpy(dt)


def has_ml_dtypes() -> bool:
    """Whether bfloat16 and float8 tensors are viewed with ml_dtypes' numpy types."""
    return _ml is not None
