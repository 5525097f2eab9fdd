"""Private helpers of the public modules: argument checks and conversions, option objects that live for
one call, and the memory of the arrays the library reads or changes in place.
"""

from __future__ import annotations

import contextlib
import math
import os
from ctypes import byref, c_void_p
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

import numpy as np

from ._dtypes import DType, DTypeLike, as_dtype
from ._handle import HandleObject, handle_of
from ._lib import check, lib


def encode(value: str, what: str) -> bytes:
    """A string as the library takes it: UTF-8 (lone surrogates kept), with no NUL character."""
    encoded = value.encode("utf-8", "surrogateescape")
    if b"\0" in encoded:
        raise ValueError(f"{what} must not contain NUL characters")
    return encoded


def fs_path(value, what: str = "path") -> bytes:
    """A path (str, bytes or os.PathLike) in the file system's encoding, with no NUL byte."""
    encoded = os.fsencode(value)
    if b"\0" in encoded:
        raise ValueError(f"{what} contains a NUL byte")
    return encoded


def u64(value: int, what: str) -> int:
    """An int that fits in uint64_t."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < 2**64:
        raise ValueError(f"{what} must be an int between 0 and 2**64 - 1")
    return int(value)


def finite(weight: float) -> float:
    """An adapter weight: a finite float."""
    weight = float(weight)
    if not math.isfinite(weight):
        raise ValueError("an adapter weight must be finite")
    return weight


def thread_count(threads: int) -> int:
    """A thread count that fits in uint32_t (0: one per core)."""
    if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads < 2**32:
        raise ValueError("threads must be an int between 0 and 2**32 - 1")
    return threads


@contextlib.contextmanager
def c_options(new_name: str, free_name: str) -> Iterator[c_void_p]:
    """A C options object (``peft_xxx_options_new``) for the time of one call, freed afterwards."""
    library = lib()
    opts = c_void_p()
    check(getattr(library, new_name)(byref(opts)))
    try:
        yield opts
    finally:
        getattr(library, free_name)(opts)


@contextlib.contextmanager
def adapter_options(base_dir, translator: Optional[HandleObject],
                    lenient: bool = False) -> Iterator[Optional[c_void_p]]:
    """A ``peft_adapter_options*`` for the time of one call (None, the defaults, when nothing is set)."""
    if base_dir is None and translator is None and not lenient:
        yield None
        return
    with c_options("peft_adapter_options_new", "peft_adapter_options_free") as opts:
        library = lib()
        if base_dir is not None:
            check(library.peft_adapter_options_set_base_dir(opts, fs_path(base_dir)))
        if translator is not None:
            check(library.peft_adapter_options_set_translator(opts, handle_of(translator).ptr))
        if lenient:
            check(library.peft_adapter_options_set_lenient(opts, 1))
        yield opts


#: The dtypes of the arrays the library merges into or computes with.
BUFFER_DTYPES = (DType.F32, DType.BF16, DType.F16)


@dataclass(frozen=True)
class Buffer:
    """Where an array's memory is, and what it holds."""

    address: int
    dtype: DType
    shape: Tuple[int, ...]
    nbytes: int


def buffer_of(obj, dtype: Optional[DTypeLike], what: str) -> Buffer:
    """The memory of a writable, C-contiguous numpy array or CPU torch tensor (modified in place)."""
    if hasattr(obj, "data_ptr") and hasattr(obj, "is_contiguous"):  # a torch tensor, duck-typed
        if str(obj.device) != "cpu" or not obj.is_contiguous():
            raise ValueError(f"{what} must be a contiguous CPU tensor")
        names = {"torch.float32": "F32", "torch.bfloat16": "BF16", "torch.float16": "F16"}
        inferred = names.get(str(obj.dtype))
        element = obj.element_size()
        shape, address, nbytes = tuple(obj.shape), obj.data_ptr(), obj.numel() * element
    else:
        if not isinstance(obj, np.ndarray):
            raise TypeError(f"{what} must be a numpy array or a torch tensor (changed in place)")
        if not obj.flags.c_contiguous or not obj.flags.writeable:
            raise ValueError(f"{what} must be a writable C-contiguous array (it is changed in place)")
        if obj.dtype.byteorder == ">" or (obj.dtype.byteorder == "=" and not np.little_endian):
            raise ValueError(f"{what} must be little-endian")
        try:
            inferred = as_dtype(obj.dtype).name
        except ValueError:
            inferred = None
        element = obj.dtype.itemsize
        shape, address, nbytes = obj.shape, obj.ctypes.data, obj.nbytes
    if dtype is None and inferred is None:
        raise ValueError(f"{what}: cannot tell its dtype from {obj.dtype}; pass dtype=")
    chosen = as_dtype(dtype if dtype is not None else inferred)
    if chosen not in BUFFER_DTYPES:
        raise ValueError(f"{what} must hold F32, BF16 or F16 values, not {chosen.name}")
    if element * 8 != {DType.F32: 32, DType.BF16: 16, DType.F16: 16}[chosen]:
        raise ValueError(f"{what}: elements of {element} bytes cannot hold {chosen.name}")
    return Buffer(address, chosen, tuple(int(d) for d in shape), int(nbytes))
