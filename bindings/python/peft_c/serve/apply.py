"""Serving, unmerged LoRA on activations (as ``src/capi/serve_apply_api.cpp``): ``lora_apply``."""

from __future__ import annotations

from ctypes import c_void_p
from typing import Optional, Sequence, Union

import numpy as np

from .._dtypes import as_dtype
from .._handle import handle_of
from .._helpers import BUFFER_DTYPES, Buffer, buffer_of, encode
from .._lib import check, lib
from .registry import Lease


def _input_matrix(obj, what: str) -> Buffer:
    """A 2-D C-contiguous F32/BF16/F16 array that is only read (so it may be read-only)."""
    if isinstance(obj, np.ndarray) and not obj.flags.writeable:
        if not obj.flags.c_contiguous:
            raise ValueError(f"{what} must be a C-contiguous array")
        if obj.dtype.byteorder == ">" or (obj.dtype.byteorder == "=" and not np.little_endian):
            raise ValueError(f"{what} must be little-endian")
        try:
            dtype = as_dtype(obj.dtype)
        except ValueError:
            dtype = None
        if dtype not in BUFFER_DTYPES:
            raise ValueError(f"{what} must hold F32, BF16 or F16 values, not {obj.dtype}")
        buffer = Buffer(obj.ctypes.data, dtype, tuple(int(d) for d in obj.shape), int(obj.nbytes))
    else:
        buffer = buffer_of(obj, None, what)
    if len(buffer.shape) != 2:
        raise ValueError(f"{what} must be 2-D (rows x features), not of shape {list(buffer.shape)}")
    return buffer


def _row_leases(row_lease, rows: int) -> Optional[np.ndarray]:
    if row_lease is None:
        return None
    indices = np.asarray(row_lease)
    if indices.dtype.kind not in "iu" and indices.size:  # (an empty list becomes float64)
        raise TypeError(f"row_lease must hold integers, not {indices.dtype}")
    if indices.shape != (rows,):
        raise ValueError(f"row_lease must have one index per row ({rows}), not shape {list(indices.shape)}")
    if indices.size and (indices.min() < -(2**31) or indices.max() >= 2**31):
        raise ValueError("row_lease indices must fit in int32")
    return np.ascontiguousarray(indices, dtype=np.int32)


def lora_apply(module: str, leases: Union[Lease, Sequence[Lease]], row_lease, x, y) -> None:
    """Adds each row's LoRA contribution ``scaling * (x A^T) B^T`` (+ ``scaling * lora_B.bias``) to ``y``
    in place, as PEFT's forward of an unmerged model with mixed-batch ``adapter_names`` does.

    ``module`` names the layer (a HuggingFace module path or weight name, or the host's name when the
    registry has a translator). ``leases`` are the batch's adapters; ``row_lease`` gives each row's
    index into them (-1: no adapter), or None when every row uses ``leases[0]``. ``x`` is
    rows x in_features and ``y`` (changed in place) rows x out_features: C-contiguous numpy arrays
    (float32, float16, ml_dtypes.bfloat16) or CPU torch tensors. Computed in float32 and rounded once
    into ``y``'s dtype; on error ``y`` is unchanged.
    """
    lease_list = [leases] if isinstance(leases, Lease) else list(leases)
    for lease in lease_list:
        if not isinstance(lease, Lease):
            raise TypeError(f"leases must be Lease objects, not {type(lease).__name__}")
    owners = [handle_of(lease) for lease in lease_list]  # held until the call returns
    x_buffer = _input_matrix(x, "x")
    y_buffer = buffer_of(y, None, "y")
    if len(y_buffer.shape) != 2:
        raise ValueError(f"y must be 2-D (rows x features), not of shape {list(y_buffer.shape)}")
    rows = x_buffer.shape[0]
    if y_buffer.shape[0] != rows:
        raise ValueError(f"x has {rows} rows but y has {y_buffer.shape[0]}")
    indices = _row_leases(row_lease, rows)
    pointers = (c_void_p * max(len(owners), 1))(*[owner.ptr for owner in owners])
    check(lib().peft_lora_apply(
        encode(module, "module names"), pointers, len(owners),
        indices.ctypes.data if indices is not None else None,
        x_buffer.address, int(x_buffer.dtype), rows, x_buffer.shape[1],
        y_buffer.address, int(y_buffer.dtype), y_buffer.shape[1]))


__all__ = ["lora_apply"]
