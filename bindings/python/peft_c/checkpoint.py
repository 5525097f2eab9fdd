"""Reading safetensors and GGUF files and checkpoints: ``Checkpoint`` and ``TensorInfo``.

Lifetime: the C handle is owned by an ``Owned`` (``_handle.py``). The ``Checkpoint`` and every array that
``Checkpoint.view`` returns hold a reference to it, and it frees the C handle when the last of them is
gone. ``close()`` therefore only drops the checkpoint's own reference: the file mapping
is released at once when no view is alive (CPython frees on the last reference), and otherwise as soon
as the last view is collected. A view can never outlive the memory it points into.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
from ctypes import byref, c_size_t, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from . import gguf as _gguf
from ._dtypes import DType, DTypeLike, as_dtype, dtype_bits, numpy_dtype
from ._handle import HandleObject, Owned
from ._helpers import c_options
from ._lib import check, lib, text

PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]
TensorKey = Union[str, int, "TensorInfo"]


@dataclass(frozen=True)
class TensorInfo:
    """What the header says about one tensor."""

    index: int  #: position in the checkpoint (file by file, each file in data order)
    name: str
    #: the safetensors dtype name, e.g. "BF16"; None for a block-quantized GGUF tensor (see ggml_type)
    dtype: Optional[str]
    shape: Tuple[int, ...]
    data_offsets: Tuple[int, int]  #: [begin, end) in its file's data section
    file_index: int  #: which file of the checkpoint holds it
    file: str  #: path of that file
    #: the ggml type name as a GGUF file stores the tensor ("F16", "Q8_0"); None in a safetensors file
    ggml_type: Optional[str] = None

    @property
    def nbytes(self) -> int:
        return self.data_offsets[1] - self.data_offsets[0]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@contextlib.contextmanager
def _open_options(use_pread: bool, max_header_size: Optional[int]):
    """Yields a ``peft_open_options*`` (or None for the library defaults) and frees it afterwards."""
    if max_header_size is not None:
        if isinstance(max_header_size, bool) or not isinstance(max_header_size, int):
            raise TypeError("max_header_size must be an int")
        if not 0 <= max_header_size < 2**64:
            raise ValueError("max_header_size must be between 0 and 2**64 - 1")
    if not use_pread and max_header_size is None:
        yield None
        return
    with c_options("peft_open_options_new", "peft_open_options_free") as opts:
        if max_header_size is not None:
            check(lib().peft_open_options_set_max_header_size(opts, max_header_size))
        if use_pread:
            check(lib().peft_open_options_set_use_pread(opts, 1))
        yield opts



def _tensor_name(library, ptr, index: int) -> str:
    """Tensor ``index``'s name with every byte, NULs included (JSON can spell them)."""
    raw = ctypes.string_at(library.peft_checkpoint_tensor_name(ptr, index),
                           library.peft_checkpoint_tensor_name_length(ptr, index))
    return raw.decode("utf-8", "surrogateescape")

class Checkpoint(HandleObject):
    """A validated, opened safetensors or GGUF file, folder or sharded checkpoint (read-only).

    Use as a context manager::

        with peft_c.Checkpoint.open("adapter_model.safetensors") as ckpt:
            for name in ckpt:
                arr = ckpt.view(name)      # zero-copy, read-only numpy array
                f32 = ckpt.read(name)      # converted copy (float32 by default)

    All methods may be called from several threads at once.
    """

    _pickle_hint = "; pickle its path and open it again"

    def __init__(self, owned: Owned, source: str):
        # Use Checkpoint.open() or Checkpoint.from_bytes().
        super().__init__(owned)
        self._source = source
        self._names: Optional[Tuple[str, ...]] = None
        self._infos: Dict[int, TensorInfo] = {}  # the checkpoint never changes: cache header lookups

    # ---- opening and closing -----------------------------------------------------------------

    @classmethod
    def open(cls, path: PathLike, *, use_pread: bool = False,
             max_header_size: Optional[int] = None) -> "Checkpoint":
        """Opens a ``.safetensors`` or GGUF file or a checkpoint folder and validates every header.

        ``use_pread`` makes ``view`` return private copies read with pread instead of arrays over a
        mapping of the file (``read`` and everything else always read with pread); ``max_header_size``
        overrides the 100,000,000-byte header cap. Raises a ``PeftError`` subclass naming what is
        wrong. A file truncated or rewritten in place while open makes later reads raise ``IoError``
        (see "Files that change while open" in peft_c.h).
        """
        encoded = os.fsencode(path)
        if b"\0" in encoded:
            raise ValueError("path contains a NUL byte")
        out = c_void_p()
        with _open_options(use_pread, max_header_size) as opts:
            check(lib().peft_checkpoint_open(encoded, opts, byref(out)))
        return cls(Owned(out.value, "peft_checkpoint_free"), os.fsdecode(encoded))

    @classmethod
    def from_bytes(cls, data, *, max_header_size: Optional[int] = None) -> "Checkpoint":
        """Validates a safetensors or GGUF file held in memory (any bytes-like object; it is copied)."""
        view = None
        if not isinstance(data, bytes):
            view = memoryview(data)
            if view.readonly or not view.c_contiguous:
                data, view = view.tobytes(), None  # the library copies anyway
            else:
                view = view.cast("B")
        if view is None:
            pointer, size, keep = ctypes.cast(ctypes.c_char_p(data), c_void_p), len(data), data
        else:
            keep = (ctypes.c_char * view.nbytes).from_buffer(view)
            pointer, size = ctypes.addressof(keep), view.nbytes
        out = c_void_p()
        with _open_options(False, max_header_size) as opts:
            check(lib().peft_checkpoint_open_memory(pointer, size, opts, byref(out)))
        del keep
        return cls(Owned(out.value, "peft_checkpoint_free"), "<memory>")

    def close(self) -> None:
        """Releases this object's hold on the checkpoint. Idempotent.

        Arrays returned by ``view`` stay valid: the mapping is released when the last of them goes.
        """
        super().close()

    def __repr__(self) -> str:
        if self._owned is None:
            return f"<peft_c.Checkpoint {self._source!r} closed>"
        return f"<peft_c.Checkpoint {self._source!r} files={self.file_count} tensors={len(self)}>"

    # ---- files and metadata ------------------------------------------------------------------

    @property
    def file_count(self) -> int:
        return lib().peft_checkpoint_file_count(self._live().ptr)

    @property
    def files(self) -> Tuple[str, ...]:
        """Paths of the checkpoint's files (one for a single file)."""
        handle = self._live()
        library = lib()
        count = library.peft_checkpoint_file_count(handle.ptr)
        return tuple(text(library.peft_checkpoint_file_path(handle.ptr, i)) for i in range(count))

    def _file_index(self, handle: Owned, file_index: int) -> int:
        count = lib().peft_checkpoint_file_count(handle.ptr)
        index = _as_index(file_index, count, "file index")
        return index

    def file_format(self, file_index: int = 0) -> str:
        """The format of one file: "safetensors" or "gguf"."""
        handle = self._live()
        return _gguf.file_format(handle.ptr, self._file_index(handle, file_index))

    def gguf_version(self, file_index: int = 0) -> Optional[int]:
        """The GGUF version (2 or 3) of one file; None for a safetensors file."""
        handle = self._live()
        version = lib().peft_checkpoint_gguf_version(handle.ptr, self._file_index(handle, file_index))
        return version or None

    def gguf_metadata(self, file_index: int = 0) -> Optional[Dict[str, Any]]:
        """The metadata key/values of a GGUF file in file order, as Python values (int, bool, float, str,
        list); None for a safetensors file (whose metadata ``metadata()`` gives)."""
        handle = self._live()
        index = self._file_index(handle, file_index)
        if lib().peft_checkpoint_file_format(handle.ptr, index) != _gguf.FORMAT_GGUF:
            return None
        return _gguf.metadata(handle.ptr, index)

    def gguf_value(self, key: str, file_index: int = 0) -> Any:
        """One GGUF metadata value by key. Raises ``NotFoundError`` naming the key when the file has none."""
        handle = self._live()
        index = self._file_index(handle, file_index)
        return _gguf.value(handle.ptr, index, _gguf.find(handle.ptr, index, key))

    def gguf_type(self, key: str, file_index: int = 0) -> Tuple[_gguf.GgufValueType, Optional[_gguf.GgufValueType]]:
        """The stored type of a GGUF metadata value, and its element type when it is an array
        (``(GgufValueType.ARRAY, GgufValueType.STRING)``; ``(GgufValueType.U32, None)``)."""
        handle = self._live()
        index = self._file_index(handle, file_index)
        return _gguf.value_type(handle.ptr, index, _gguf.find(handle.ptr, index, key))

    def metadata(self, file_index: int = 0) -> Optional[Dict[str, str]]:
        """The ``__metadata__`` of one file as a dict, or None when the file has none."""
        handle = self._live()
        library = lib()
        index = self._file_index(handle, file_index)
        if not library.peft_checkpoint_has_metadata(handle.ptr, index):
            return None
        count = library.peft_checkpoint_metadata_count(handle.ptr, index)
        result: Dict[str, str] = {}
        for entry in range(count):
            key = text(library.peft_checkpoint_metadata_key(handle.ptr, index, entry))
            value = text(library.peft_checkpoint_metadata_value(handle.ptr, index, entry))
            result[key] = value
        return result

    def index_metadata(self) -> Optional[dict]:
        """The ``"metadata"`` object of ``model.safetensors.index.json``, or None without one."""
        handle = self._live()
        raw = lib().peft_checkpoint_index_metadata_json(handle.ptr)
        return None if raw is None else json.loads(raw.decode("utf-8"))

    # ---- tensors -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return lib().peft_checkpoint_tensor_count(self._live().ptr)

    def keys(self) -> Tuple[str, ...]:
        """Tensor names, file by file, each file in data order."""
        handle = self._live()
        if self._names is None:
            library = lib()
            count = library.peft_checkpoint_tensor_count(handle.ptr)
            self._names = tuple(_tensor_name(library, handle.ptr, i) for i in range(count))
        return self._names

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self._index(self._live(), name)
        except KeyError:
            return False
        return True

    def _index(self, handle: Owned, key: TensorKey) -> int:
        library = lib()
        if isinstance(key, TensorInfo):
            key = key.index
        if isinstance(key, str):
            encoded = key.encode("utf-8", "surrogateescape")
            out = c_size_t()
            check(library.peft_checkpoint_find_n(handle.ptr, encoded, len(encoded), byref(out)))
            return out.value
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return _as_index(int(key), library.peft_checkpoint_tensor_count(handle.ptr), "tensor index")
        raise TypeError(f"a tensor is named by str or int, not {type(key).__name__}")

    def tensor(self, key: TensorKey) -> TensorInfo:
        """The header entry of a tensor given by name or index (negative indices count from the end)."""
        handle = self._live()
        library = lib()
        index = self._index(handle, key)
        cached = self._infos.get(index)
        if cached is not None:
            return cached
        ptr = handle.ptr
        ndim = library.peft_checkpoint_tensor_ndim(ptr, index)
        shape_ptr = library.peft_checkpoint_tensor_shape(ptr, index)
        shape = tuple(int(shape_ptr[i]) for i in range(ndim)) if ndim else ()
        begin, end = c_uint64(), c_uint64()
        check(library.peft_checkpoint_tensor_offsets(ptr, index, byref(begin), byref(end)))
        file_index = library.peft_checkpoint_tensor_file(ptr, index)
        dtype = library.peft_checkpoint_tensor_dtype(ptr, index)
        info = TensorInfo(
            index=index,
            name=_tensor_name(library, ptr, index),
            dtype=None if dtype < 0 else DType(dtype).name,
            shape=shape,
            data_offsets=(begin.value, end.value),
            file_index=file_index,
            file=text(library.peft_checkpoint_file_path(ptr, file_index)),
            ggml_type=_gguf.tensor_ggml_type(ptr, index),
        )
        self._infos[index] = info
        return info

    def tensors(self) -> List[TensorInfo]:
        """Every tensor's header entry, in checkpoint order."""
        return [self.tensor(i) for i in range(len(self))]

    def view(self, key: TensorKey, *, raw: bool = False, use_ml_dtypes: bool = True) -> np.ndarray:
        """A read-only numpy array over the tensor's bytes in the mapped file: nothing is copied.

        The dtype is the tensor's (bfloat16 and float8 through ml_dtypes when installed, else the raw
        unsigned integer of the same width). Packed sub-byte dtypes (F4, F6), block-quantized GGUF
        tensors and ``raw=True`` give the bytes as a flat ``uint8`` array. The array keeps the mapping alive, even past ``close()``.

        The array reads the mapped file directly: if the file is truncated while the array lives,
        touching the lost bytes kills the process with SIGBUS (the library cannot intercept it), and
        bytes rewritten in place show through. Where files may change, use ``read`` (``IoError``
        instead) or open with ``use_pread=True`` (views are then copies taken at the first view).
        """
        handle = self._live()
        info = self.tensor(key)
        data, nbytes = c_void_p(), c_uint64()
        check(lib().peft_checkpoint_tensor_view(handle.ptr, info.index, byref(data), byref(nbytes)))
        size = nbytes.value
        buffer = (ctypes.c_ubyte * size).from_address(data.value or 0)
        buffer._peft_owner = handle  # the mapping lives as long as this buffer
        readonly = memoryview(buffer).cast("B").toreadonly()
        np_dtype = None if raw or info.dtype is None else numpy_dtype(info.dtype, use_ml_dtypes=use_ml_dtypes)
        if np_dtype is None:
            return np.frombuffer(readonly, dtype=np.uint8)
        flat = np.frombuffer(readonly, dtype=np_dtype)
        with _numpy_shape_errors(info):
            return flat.reshape(info.shape)

    def read(self, key: TensorKey, dtype: Optional[DTypeLike] = "F32") -> np.ndarray:
        """A new array holding the tensor converted to ``dtype`` (F64, F32, F16, BF16, or its own dtype).

        ``dtype=None`` copies the tensor in its own dtype. Rounding is to nearest, ties to even. A
        block-quantized GGUF tensor has no dtype and is not converted (``UnsupportedError``); ``view``
        gives its bytes.
        """
        handle = self._live()
        info = self.tensor(key)
        # A quantized tensor asked for "its own dtype" is asked for F32, which the library refuses by name.
        target = as_dtype(dtype if dtype is not None else info.dtype or "F32")
        total_bits = info.numel * dtype_bits(target)
        np_dtype = numpy_dtype(target)
        if np_dtype is None:  # packed: only a same-dtype copy is possible; the library checks it
            out = np.empty(total_bits // 8, dtype=np.uint8)
        else:
            with _numpy_shape_errors(info):
                out = np.empty(info.shape, dtype=np_dtype)
        check(lib().peft_checkpoint_tensor_read(handle.ptr, info.index, int(target),
                                                out.ctypes.data_as(c_void_p), total_bits // 8))
        return out


@contextlib.contextmanager
def _numpy_shape_errors(info: TensorInfo):
    # numpy refuses shapes whose nonzero dimensions multiply past its index range, even when another
    # dimension is 0 (e.g. [2**63 - 1, 0], which safetensors accepts). Say which tensor it is.
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"tensor {info.name!r} of shape {list(info.shape)} cannot be a numpy array "
                         f"({exc}); view(..., raw=True) gives its bytes") from exc


def _as_index(index: int, count: int, what: str) -> int:
    if isinstance(index, bool) or not isinstance(index, (int, np.integer)):
        raise TypeError(f"{what} must be an int")
    index = int(index)
    if index < 0:
        index += count
    if not 0 <= index < count:
        raise IndexError(f"{what} out of range (0 .. {count - 1})")
    return index


__all__ = ["Checkpoint", "TensorInfo"]
