"""Control vectors (steering vectors): ``ControlVector`` holds one direction of ``n_embd`` values per
decoder layer, read from and written to llama.cpp's GGUF or safetensors files, combined with ``add``,
and added to a host's buffer with ``apply``, whose ``ControlRecord`` takes it out again exactly.
"""

from __future__ import annotations

from ctypes import byref, c_float, c_void_p
from typing import List, Optional

import numpy as np

from ._dtypes import DType, DTypeLike, as_dtype
from ._handle import HandleObject, Owned, handle_of
from ._helpers import Buffer, buffer_of, encode, fs_path
from ._lib import check, lib, text
from .writer import _as_bytes_source

# Mirror PEFT_FORMAT_SAFETENSORS and PEFT_FORMAT_GGUF of include/peft_c.h.
FORMAT_SAFETENSORS = 0
FORMAT_GGUF = 1
_FORMATS = {"safetensors": FORMAT_SAFETENSORS, "gguf": FORMAT_GGUF}

#: The dtypes ``set_direction`` takes.
DIRECTION_DTYPES = (DType.F32, DType.BF16, DType.F16, DType.F64)


def _format(value) -> int:
    if isinstance(value, str):
        try:
            return _FORMATS[value.lower()]
        except KeyError:
            raise ValueError(f"format must be 'gguf' or 'safetensors', not {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError("format must be 'gguf', 'safetensors' or FORMAT_GGUF / FORMAT_SAFETENSORS")
    return int(value)


class ControlVector(HandleObject):
    """A control vector: one direction of ``n_embd`` float32 values per decoder layer. A host adds
    ``strength`` x the direction of layer N to the output of its 0-based decoder layer N (the residual
    stream after the layer), as llama.cpp applies ``--control-vector``.

    Create with ``ControlVector.open(path)`` or ``ControlVector.new(n_embd, model_hint)``; ``close()``
    or a ``with`` block releases it. The reading methods may run in several threads at once;
    ``set_direction`` and ``add`` need the vector to themselves.
    """

    @classmethod
    def open(cls, path) -> "ControlVector":
        """Reads a control vector from a GGUF or safetensors file (the format is told by its
        contents). ``IoError`` for a file that does not open, ``InvalidCheckpointError`` for a file
        that is no control vector, ``NonFiniteError`` for an infinite or NaN value."""
        out = c_void_p()
        check(lib().peft_control_vector_open(fs_path(path), byref(out)))
        return cls(Owned(out.value, "peft_control_vector_free"))

    @classmethod
    def new(cls, n_embd: int, model_hint: Optional[str] = None) -> "ControlVector":
        """An empty control vector of ``n_embd`` values per direction (in [1, 2**31]), made for the
        model ``model_hint`` (None: none); fill it with ``set_direction`` or ``add``."""
        if isinstance(n_embd, bool) or not isinstance(n_embd, (int, np.integer)) or not 0 <= n_embd < 2**64:
            raise ValueError("n_embd must be an int between 1 and 2**31")
        hint = None if model_hint is None else encode(model_hint, "model_hint")
        out = c_void_p()
        check(lib().peft_control_vector_new(int(n_embd), hint, byref(out)))
        return cls(Owned(out.value, "peft_control_vector_free"))

    @property
    def n_embd(self) -> int:
        """Values per direction (the model's hidden size)."""
        return int(lib().peft_control_vector_n_embd(self._live().ptr))

    @property
    def model_hint(self) -> str:
        """The model the vector was made for, as its file names it ("" when none)."""
        return text(lib().peft_control_vector_model_hint(self._live().ptr)) or ""

    @property
    def layer_count(self) -> int:
        """How many layers have a direction."""
        return int(lib().peft_control_vector_layer_count(self._live().ptr))

    def layer(self, index: int) -> int:
        """The layer of the ``index``-th direction, layers in ascending order (``IndexError`` out of
        range)."""
        owned = self._live()
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or index < 0:
            raise IndexError(f"layer index {index!r} out of range")
        layer = int(lib().peft_control_vector_layer(owned.ptr, int(index)))
        if layer < 0:
            raise IndexError(f"layer index {index} out of range (the vector has {self.layer_count})")
        return layer

    @property
    def layers(self) -> List[int]:
        """The layers that have a direction, ascending."""
        owned = self._live()
        library = lib()
        return [int(library.peft_control_vector_layer(owned.ptr, i))
                for i in range(int(library.peft_control_vector_layer_count(owned.ptr)))]

    def direction(self, layer: int) -> Optional[np.ndarray]:
        """A copy of one layer's direction (a float32 array of ``n_embd`` values), or None for a
        layer without one."""
        owned = self._live()
        library = lib()
        ptr = library.peft_control_vector_direction(owned.ptr, int(layer))
        if not ptr:
            return None
        n = int(library.peft_control_vector_n_embd(owned.ptr))
        return np.frombuffer((c_float * n).from_address(ptr), dtype="<f4").copy()

    def set_direction(self, layer: int, values, dtype: Optional[DTypeLike] = None) -> None:
        """Sets one layer's direction (``layer`` >= 0), replacing what it had.

        ``values`` holds ``n_embd`` values: a sequence of floats or a numpy array (float32, float16,
        float64 or ml_dtypes.bfloat16, taken in its dtype; other arrays and sequences are converted
        to float32), or, with ``dtype`` ("F32", "BF16", "F16" or "F64"), the raw little-endian bytes
        of its elements (a bytes-like object or an array such as uint16 bits). On failure the vector
        is unchanged: ``NonFiniteError`` for an infinite or NaN value.
        """
        owned = self._live()
        if dtype is not None:
            chosen = as_dtype(dtype)
            array, _ = _as_bytes_source(values)
        else:
            array = values if isinstance(values, np.ndarray) else np.asarray(values, dtype=np.float32)
            try:
                chosen = as_dtype(array.dtype)
            except (ValueError, TypeError):
                chosen = None
            if chosen not in DIRECTION_DTYPES:
                array, chosen = np.asarray(array, dtype=np.float32), DType.F32
            array, _ = _as_bytes_source(array)
        if chosen not in DIRECTION_DTYPES:
            raise ValueError(f"a direction must be F32, BF16, F16 or F64 values, not {chosen.name}")
        n = self.n_embd
        need = n * {DType.F32: 4, DType.BF16: 2, DType.F16: 2, DType.F64: 8}[chosen]
        if array.nbytes != need:
            raise ValueError(f"a direction is {n} {chosen.name} values ({need} bytes); {array.nbytes} bytes given")
        check(lib().peft_control_vector_set_direction(owned.ptr, int(layer), int(chosen), array.ctypes.data))

    def add(self, src: "ControlVector", strength: float = 1.0) -> None:
        """Adds ``strength`` x ``src`` to this vector, layer by layer (a layer it lacks starts at
        zero), with llama.cpp's arithmetic: each element ``src * float32(strength)`` in float32, then
        added in float32. ``src`` may be this vector. On failure this vector is unchanged:
        ``ShapeMismatchError`` when the ``n_embd`` differ, ``NonFiniteError`` for an overflow."""
        owned, src_owned = self._live(), handle_of(src)
        check(lib().peft_control_vector_add(owned.ptr, src_owned.ptr, float(strength)))

    def save(self, path, format="gguf") -> None:
        """Writes the vector to ``path``, atomically: ``"gguf"`` (``FORMAT_GGUF``) in llama.cpp's
        layout, ``"safetensors"`` (``FORMAT_SAFETENSORS``) as ``direction.N`` float32 tensors.
        ``InvalidArgumentError`` for a vector without directions or (GGUF) a direction for layer 0,
        which llama.cpp refuses; ``IoError`` when the file cannot be written."""
        owned = self._live()
        check(lib().peft_control_vector_save(owned.ptr, fs_path(path), _format(format)))

    def apply(self, layer: int, strength: float, buffer, *, dtype: Optional[DTypeLike] = None,
              record: bool = True) -> Optional["ControlRecord"]:
        """Adds ``layer``'s direction x ``strength`` to every row of ``buffer``, in place:
        y = round(x + d * float32(strength)), the product and the sum in float32 as llama.cpp computes
        them, rounded once to the buffer's dtype. A layer without a direction leaves it as it is.

        ``buffer`` is a writable C-contiguous numpy array (float32, float16, ml_dtypes.bfloat16, or raw
        ``uint16`` with ``dtype="BF16"``) or a contiguous CPU torch tensor holding a whole number of rows
        of ``n_embd`` elements (activations [rows, n_embd], or a bias). Returns the ``ControlRecord``
        that takes the direction out again exactly (it keeps twice the buffer's bytes), or None with
        ``record=False``. On failure the buffer is unchanged (``NonFiniteError`` when a finite element
        would become infinite or NaN).
        """
        owned = self._live()
        target = buffer_of(buffer, dtype, "buffer")
        n = int(lib().peft_control_vector_n_embd(owned.ptr))
        row_bytes = n * (4 if target.dtype == DType.F32 else 2)
        if target.nbytes == 0 or row_bytes == 0 or target.nbytes % row_bytes:
            raise ValueError(f"buffer holds {target.nbytes} bytes, not a whole nonzero number of rows of "
                             f"{n} {target.dtype.name} values")
        out = c_void_p()
        check(lib().peft_control_vector_apply(owned.ptr, int(layer), float(strength), target.address,
                                              int(target.dtype), target.nbytes // row_bytes,
                                              byref(out) if record else None))
        if not record:
            return None
        return ControlRecord(Owned(out.value, "peft_control_record_free"), target)

    def __repr__(self) -> str:
        if self.closed:
            return "<peft_c.ControlVector (closed)>"
        return f"<peft_c.ControlVector n_embd={self.n_embd} layers={self.layers} model_hint={self.model_hint!r}>"


class ControlRecord(HandleObject):
    """A direction added to a buffer by ``ControlVector.apply``; ``remove`` takes it out again,
    exactly. ``close()`` (or a ``with`` block) releases it without touching the buffer."""

    def __init__(self, owned: Owned, buffer: Buffer):
        super().__init__(owned)
        self._buffer = buffer

    def remove(self, buffer, *, dtype: Optional[DTypeLike] = None) -> None:
        """Puts back the bytes ``buffer`` held before the apply, after checking that it still holds
        what the apply wrote (the memory may have moved; with several applies, remove them in reverse
        order). On failure nothing changes (``InvalidArgumentError`` for a buffer changed since the
        apply, or a record already spent); on success the record is spent."""
        owned = self._live()
        target = buffer_of(buffer, dtype if dtype is not None else self._buffer.dtype.name, "buffer")
        if (target.dtype, target.nbytes) != (self._buffer.dtype, self._buffer.nbytes):
            raise ValueError(f"buffer must hold {self._buffer.nbytes} bytes of {self._buffer.dtype.name}, "
                             f"as at the apply")
        check(lib().peft_control_record_remove(owned.ptr, target.address))

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self._buffer.nbytes} bytes of {self._buffer.dtype.name}"
        return f"<peft_c.ControlRecord {state}>"


__all__ = ["FORMAT_GGUF", "FORMAT_SAFETENSORS", "ControlRecord", "ControlVector"]
