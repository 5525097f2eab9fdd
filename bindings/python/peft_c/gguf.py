"""GGUF files: their typed metadata, ggml types and the formats of a checkpoint's files.

``Checkpoint`` opens GGUF files like safetensors ones; ``Checkpoint.file_format``,
``Checkpoint.gguf_version``, ``Checkpoint.gguf_metadata`` and ``Checkpoint.gguf_value`` read what only
GGUF has (they are defined here and used by ``checkpoint.py``). Metadata values come back as Python
values: ``int`` for the integer types, ``bool``, ``float`` for F32 and F64 (an F32 widened exactly),
``str`` (UTF-8; undecodable bytes kept as surrogate escapes), and ``list`` for arrays.
"""

from __future__ import annotations

import ctypes
import enum
from ctypes import byref, c_size_t, c_uint32, c_uint64, c_void_p
from typing import Any, Dict, Optional, Tuple

from ._lib import check, lib, text

#: ``PEFT_FORMAT_*``: the format of one file of a checkpoint.
FORMAT_SAFETENSORS = 0
FORMAT_GGUF = 1
_FORMAT_NAMES = {FORMAT_SAFETENSORS: "safetensors", FORMAT_GGUF: "gguf"}


class GgufValueType(enum.IntEnum):
    """The type of a GGUF metadata value (``PEFT_GGUF_*``, the numbers of gguf.h's ``enum gguf_type``)."""

    U8 = 0
    I8 = 1
    U16 = 2
    I16 = 3
    U32 = 4
    I32 = 5
    F32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    U64 = 10
    I64 = 11
    F64 = 12


_SIGNED = frozenset({GgufValueType.I8, GgufValueType.I16, GgufValueType.I32, GgufValueType.I64})
_UNSIGNED = frozenset({GgufValueType.U8, GgufValueType.U16, GgufValueType.U32, GgufValueType.U64})
_FLOATS = frozenset({GgufValueType.F32, GgufValueType.F64})


def ggml_type_name(ggml_type: int) -> Optional[str]:
    """The name of a ggml type as gguf-py spells it (12 -> "Q4_K"); None for a number ggml does not define."""
    if isinstance(ggml_type, bool) or not isinstance(ggml_type, int):
        raise TypeError("a ggml type is an int")
    if not -2**31 <= ggml_type < 2**31:
        return None
    return text(lib().peft_ggml_type_name(ggml_type))


def ggml_type_from_name(name: str) -> int:
    """The ggml type of an exact name ("BF16" -> 30). Raises ValueError for a name ggml does not define."""
    if not isinstance(name, str):
        raise TypeError("a ggml type name is a str")
    value = lib().peft_ggml_type_from_name(name.encode("utf-8", "surrogateescape"))
    if value < 0:
        raise ValueError(f"unknown ggml type name {name!r}")
    return value


def ggml_type_geometry(ggml_type: int) -> Tuple[int, int]:
    """``(block_size, type_size)`` of a ggml type: a row of n elements takes n / block_size blocks of
    type_size bytes ((32, 34) for Q8_0). Raises ``InvalidArgumentError`` for an unknown type."""
    if isinstance(ggml_type, bool) or not isinstance(ggml_type, int):
        raise TypeError("a ggml type is an int")
    if not -2**31 <= ggml_type < 2**31:
        raise ValueError(f"ggml type {ggml_type} does not exist")
    block, size = c_uint32(), c_uint32()
    check(lib().peft_ggml_type_geometry(ggml_type, byref(block), byref(size)))
    return block.value, size.value


def file_format(ptr, file_index: int) -> str:
    """"safetensors" or "gguf" (``file_index`` already checked)."""
    return _FORMAT_NAMES[lib().peft_checkpoint_file_format(ptr, file_index)]


def tensor_ggml_type(ptr, index: int) -> Optional[str]:
    """The ggml type name of a tensor as its GGUF file stores it; None for a safetensors tensor."""
    value = lib().peft_checkpoint_tensor_ggml_type(ptr, index)
    return None if value < 0 else ggml_type_name(value)


def find(ptr, file_index: int, key: str) -> int:
    """The position of a metadata key (``NotFoundError`` naming it when absent)."""
    out = c_size_t()
    check(lib().peft_checkpoint_gguf_kv_find(ptr, file_index, key.encode("utf-8", "surrogateescape"), byref(out)))
    return out.value


def value_type(ptr, file_index: int, kv: int) -> Tuple[GgufValueType, Optional[GgufValueType]]:
    """The entry's type, and the element type when it is an array."""
    library = lib()
    kind = GgufValueType(library.peft_checkpoint_gguf_kv_type(ptr, file_index, kv))
    if kind is not GgufValueType.ARRAY:
        return kind, None
    return kind, GgufValueType(library.peft_checkpoint_gguf_kv_array_type(ptr, file_index, kv))


def _scalar(ptr, file_index: int, kv: int, element: int, kind: GgufValueType) -> Any:
    library = lib()
    if kind in _UNSIGNED:
        out = c_uint64()
        check(library.peft_checkpoint_gguf_kv_uint(ptr, file_index, kv, element, byref(out)))
        return out.value
    if kind in _SIGNED or kind is GgufValueType.BOOL:
        out = ctypes.c_int64()
        check(library.peft_checkpoint_gguf_kv_int(ptr, file_index, kv, element, byref(out)))
        return out.value != 0 if kind is GgufValueType.BOOL else out.value
    if kind in _FLOATS:
        out = ctypes.c_double()
        check(library.peft_checkpoint_gguf_kv_float(ptr, file_index, kv, element, byref(out)))
        return out.value
    if kind is GgufValueType.STRING:
        data, length = c_void_p(), c_size_t()
        check(library.peft_checkpoint_gguf_kv_string(ptr, file_index, kv, element, byref(data), byref(length)))
        return ctypes.string_at(data.value, length.value).decode("utf-8", "surrogateescape") if length.value else ""
    raise ValueError(f"GGUF metadata {key_of(ptr, file_index, kv)!r}: arrays of {kind.name} cannot be read")


def value(ptr, file_index: int, kv: int) -> Any:
    """Entry ``kv``'s value as a Python value (a list for an array)."""
    kind, element_type = value_type(ptr, file_index, kv)
    if element_type is None:
        return _scalar(ptr, file_index, kv, 0, kind)
    length = lib().peft_checkpoint_gguf_kv_array_length(ptr, file_index, kv)
    return [_scalar(ptr, file_index, kv, i, element_type) for i in range(length)]


def key_of(ptr, file_index: int, kv: int) -> str:
    return text(lib().peft_checkpoint_gguf_kv_key(ptr, file_index, kv))


def metadata(ptr, file_index: int) -> Dict[str, Any]:
    """Every entry of a GGUF file, in file order (empty for a safetensors file)."""
    count = lib().peft_checkpoint_gguf_kv_count(ptr, file_index)
    return {key_of(ptr, file_index, kv): value(ptr, file_index, kv) for kv in range(count)}


__all__ = ["FORMAT_GGUF", "FORMAT_SAFETENSORS", "GgufValueType", "ggml_type_from_name", "ggml_type_geometry",
           "ggml_type_name"]
