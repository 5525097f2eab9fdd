"""Dtype conversion of numpy arrays through the library (``peft_convert``)."""

from __future__ import annotations

from typing import Optional

import numpy as np

from ._dtypes import DTypeLike, as_dtype, dtype_bits, numpy_dtype
from ._lib import check, lib


def convert(array, src_dtype: Optional[DTypeLike], dst_dtype: DTypeLike) -> np.ndarray:
    """Converts the elements of ``array`` from ``src_dtype`` to ``dst_dtype`` (a new array).

    ``src_dtype`` says how to read the array's bytes, so bfloat16 data may come as a ``uint16`` array
    and float8 data as ``uint8``; None takes it from the array's numpy dtype. When the array's item size
    matches ``src_dtype`` the result keeps the array's shape, otherwise it is flat. Supported pairs are
    those of ``peft_convert`` (any float, bool or integer type into F64, F32, F16 or BF16, and any
    dtype into itself); others raise ``UnsupportedError``.
    """
    src = np.asarray(array)
    source = as_dtype(src.dtype if src_dtype is None else src_dtype)
    target = as_dtype(dst_dtype)
    if src.dtype.byteorder == ">" or (src.dtype.byteorder == "=" and np.little_endian is False):
        src = src.astype(src.dtype.newbyteorder("<"))  # the library reads little-endian bytes
    src = np.ascontiguousarray(src)

    src_bits = dtype_bits(source)
    total_bits = src.nbytes * 8
    if total_bits % src_bits:
        raise ValueError(f"{src.nbytes} bytes do not hold a whole number of {source.name} elements")
    count = total_bits // src_bits
    shape = src.shape if src.dtype.itemsize * 8 == src_bits else (count,)

    out_bits = count * dtype_bits(target)
    out_dtype = numpy_dtype(target)
    if out_dtype is None:
        if out_bits % 8:
            raise ValueError(f"{count} {target.name} elements do not fill whole bytes")
        out = np.empty(out_bits // 8, dtype=np.uint8)
    else:
        out = np.empty(shape, dtype=out_dtype)
    check(lib().peft_convert(int(source), src.ctypes.data, int(target), out.ctypes.data, count))
    return out


__all__ = ["convert"]
