"""Writing safetensors files and checkpoint folders: ``Writer``, ``save_file`` and ``save_checkpoint``.

The output is byte-identical to ``safetensors.torch.save_file`` for the same tensors and metadata, and it
appears atomically: nothing replaces the target unless ``finish()`` succeeds. A writer belongs to one
thread at a time.
"""

from __future__ import annotations

import ctypes
import json
import os
from ctypes import byref, c_uint64, c_void_p
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._dtypes import DTypeLike, as_dtype
from ._errors import CancelledError
from ._handle import HandleObject, Owned, handle_of
from ._helpers import encode, fs_path
from ._lib import SIZE_MAX, SOURCE_FN, check, lib, text
from .checkpoint import Checkpoint, TensorKey

def _as_bytes_source(data) -> Tuple[np.ndarray, Optional[np.dtype]]:
    """A C-contiguous little-endian array over ``data`` (an ndarray or any bytes-like object)."""
    if isinstance(data, np.ndarray):
        array = data
        if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and not np.little_endian):
            array = array.astype(array.dtype.newbyteorder("<"))
        return np.ascontiguousarray(array), array.dtype
    return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8), None


class Writer(HandleObject):
    """A streaming writer of one ``.safetensors`` file or of a checkpoint folder.

    Declare every tensor (``add_tensor``) and the metadata, then write the tensors in the writer's
    order (``order``), then ``finish()``. Used as a context manager, a clean exit finishes the output and
    an exception discards it (the target keeps its old content)::

        with peft_c.Writer.create("out.safetensors") as w:
            w.add_tensor("b", "BF16", (2, 3))
            w.write_tensor("b", np.ones((2, 3), np.float32))   # converted to BF16 on the way
    """

    def __init__(self, owned: Owned, target: str):
        # Use Writer.create() or Writer.checkpoint().
        super().__init__(owned)
        self._target = target
        self._finished = False

    @classmethod
    def create(cls, path) -> "Writer":
        """A writer of one safetensors file at ``path`` (metadata starts absent)."""
        encoded = fs_path(path)
        out = c_void_p()
        check(lib().peft_writer_new(encoded, byref(out)))
        return cls(Owned(out.value, "peft_writer_free"), os.fsdecode(encoded))

    @classmethod
    def checkpoint(cls, folder, max_shard_size: int = 0) -> "Writer":
        """A writer of a checkpoint folder laid out as transformers' ``save_pretrained`` lays it out:
        shards split by huggingface_hub's greedy rule, ``model.safetensors.index.json``, and metadata
        starting as ``{"format": "pt"}``. ``max_shard_size`` 0 means no limit."""
        encoded = fs_path(folder)
        if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, int) or max_shard_size < 0:
            raise ValueError("max_shard_size must be a non-negative int")
        out = c_void_p()
        check(lib().peft_writer_new_checkpoint(encoded, max_shard_size, byref(out)))
        return cls(Owned(out.value, "peft_writer_free"), os.fsdecode(encoded))

    # ---- lifetime -----------------------------------------------------------------------------

    def close(self) -> None:
        """Frees the writer; an unfinished output is discarded. Idempotent."""
        owned, self._owned = self._owned, None
        if owned is not None:
            owned.release()

    @property
    def finished(self) -> bool:
        return self._finished

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if exc_type is None and not self._finished and self._owned is not None:
                self.finish()
        finally:
            self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("finished" if self._finished else "open")
        return f"<peft_c.Writer {self._target!r} {state}>"

    # ---- declarations -------------------------------------------------------------------------

    def add_tensor(self, name: str, dtype: DTypeLike, shape: Sequence[int]) -> None:
        """Declares a tensor: its name, its dtype in the file, and its shape."""
        dims = [int(d) for d in shape]
        if any(d < 0 or d >= 2**64 for d in dims):
            raise ValueError(f"shape {dims} of {name!r} has a dimension out of range")
        array = (c_uint64 * len(dims))(*dims)
        check(lib().peft_writer_add_tensor(self._live().ptr, encode(name, "tensor names"),
                                                 int(as_dtype(dtype)), array, len(dims)))

    def set_metadata(self, metadata: Optional[Mapping[str, str]]) -> None:
        """The ``__metadata__`` entry: None for none at all, a dict (possibly empty) for one."""
        library, ptr = lib(), self._live().ptr
        check(library.peft_writer_set_metadata_present(ptr, 0))
        if metadata is None:
            return
        check(library.peft_writer_set_metadata_present(ptr, 1))
        for key, value in metadata.items():
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError("metadata keys and values must be str")
            check(library.peft_writer_set_metadata(ptr, encode(key, "metadata keys"),
                                                   encode(value, "metadata values")))

    def break_shard(self) -> None:
        """Checkpoint writers: the next declared tensor starts a new shard."""
        check(lib().peft_writer_break_shard(self._live().ptr))

    def set_index_metadata(self, metadata: Mapping) -> None:
        """Checkpoint writers: extra entries of the index's ``"metadata"`` (``total_size`` is computed)."""
        text_json = json.dumps(dict(metadata), ensure_ascii=False, allow_nan=False)
        check(lib().peft_writer_set_index_metadata_json(self._live().ptr,
                                                               encode(text_json, "index metadata")))

    def start(self) -> None:
        """Ends the declarations and computes the headers (done by the first write if not called)."""
        check(lib().peft_writer_start(self._live().ptr))

    # ---- the order and the files --------------------------------------------------------------

    def __len__(self) -> int:
        return lib().peft_writer_tensor_count(self._live().ptr)

    @property
    def order(self) -> List[str]:
        """Tensor names in the order they must be written (starts the writer)."""
        self.start()
        library, ptr = lib(), self._live().ptr
        return [text(library.peft_writer_tensor_name(ptr, i)) for i in range(len(self))]

    @property
    def declarations(self) -> List[int]:
        """For each position of ``order``, the index of the tensor in declaration order."""
        self.start()
        library, ptr = lib(), self._live().ptr
        result = [library.peft_writer_tensor_declaration(ptr, i) for i in range(len(self))]
        assert SIZE_MAX not in result
        return result

    @property
    def files(self) -> Tuple[str, ...]:
        """Paths of the files the writer produces (starts the writer; the index is not listed)."""
        self.start()
        library, ptr = lib(), self._live().ptr
        count = library.peft_writer_file_count(ptr)
        return tuple(text(library.peft_writer_file_path(ptr, i)) for i in range(count))

    # ---- streaming ------------------------------------------------------------------------------

    def write_tensor(self, name: str, data, src_dtype: Optional[DTypeLike] = None) -> None:
        """Writes the next tensor whole from a numpy array or bytes-like object.

        ``src_dtype`` is the dtype of ``data`` (taken from the array when None); when it differs
        from the declared dtype the values are converted (see ``peft_c.convert``).
        """
        array, np_dtype = _as_bytes_source(data)
        if src_dtype is None:
            if np_dtype is None:
                raise ValueError("src_dtype is needed for raw bytes")
            src_dtype = np_dtype
        check(lib().peft_writer_write_tensor(self._live().ptr, encode(name, "tensor names"),
                                                   int(as_dtype(src_dtype)), array.ctypes.data,
                                                   array.nbytes))

    def begin_tensor(self, name: str, src_dtype: DTypeLike) -> None:
        """Begins the next tensor; its bytes then come in pieces through ``write``."""
        check(lib().peft_writer_begin_tensor(self._live().ptr, encode(name, "tensor names"),
                                                   int(as_dtype(src_dtype))))

    def write(self, data) -> None:
        """Appends bytes (in the source dtype) to the tensor begun with ``begin_tensor``."""
        array, _ = _as_bytes_source(data)
        check(lib().peft_writer_write(self._live().ptr, array.ctypes.data, array.nbytes))

    def write_from_callback(self, name: str, src_dtype: DTypeLike,
                            source: Callable[[int, memoryview], Optional[bool]]) -> None:
        """Writes the next tensor from ``source(offset, chunk)``, which fills the writable
        ``memoryview`` ``chunk`` with the bytes at ``offset``. Returning True cancels the write
        (``CancelledError``); an exception raised by ``source`` cancels it and is re-raised."""
        raised: List[BaseException] = []

        def trampoline(_user, offset, dst, nbytes):
            try:
                chunk = (ctypes.c_ubyte * nbytes).from_address(dst)
                return 1 if source(offset, memoryview(chunk).cast("B")) else 0
            except BaseException as exc:  # never unwind into C
                raised.append(exc)
                return 1

        callback = SOURCE_FN(trampoline)  # kept alive for the whole call by this local
        try:
            check(lib().peft_writer_write_from_callback(
                self._live().ptr, encode(name, "tensor names"), int(as_dtype(src_dtype)), callback, None))
        except CancelledError as cancelled:
            if raised:
                raise raised[0] from cancelled
            raise

    def write_from_checkpoint(self, name: str, checkpoint: Checkpoint,
                              key: Optional[TensorKey] = None) -> None:
        """Writes the next tensor from a tensor of an opened checkpoint (by default, the one of the
        same name), converting it to the declared dtype when they differ."""
        index = checkpoint.tensor(name if key is None else key).index
        source = handle_of(checkpoint)
        check(lib().peft_writer_write_from_checkpoint(self._live().ptr, encode(name, "tensor names"),
                                                            source.ptr, index))

    def finish(self) -> None:
        """Flushes everything and renames it into place (a checkpoint's index last)."""
        check(lib().peft_writer_finish(self._live().ptr))
        self._finished = True


def _declare_all(writer: Writer, tensors: Mapping[str, np.ndarray],
                 dtypes: Optional[Mapping[str, DTypeLike]]) -> Dict[str, np.ndarray]:
    arrays = {name: np.asarray(value) for name, value in tensors.items()}
    for name, array in arrays.items():
        declared = (dtypes or {}).get(name, array.dtype)
        writer.add_tensor(name, declared, array.shape)
    return arrays


def _write_all(writer: Writer, arrays: Mapping[str, np.ndarray]) -> None:
    for name in writer.order:
        writer.write_tensor(name, arrays[name])
    writer.finish()


def save_file(tensors: Mapping[str, np.ndarray], path, metadata: Optional[Mapping[str, str]] = None,
              *, dtypes: Optional[Mapping[str, DTypeLike]] = None) -> None:
    """Writes numpy arrays as one safetensors file, as ``safetensors.numpy.save_file`` does.

    ``dtypes`` may give a file dtype per tensor (e.g. ``{"w": "BF16"}`` for a float32 array); the
    values are then converted on the way.
    """
    with Writer.create(path) as writer:
        writer.set_metadata(metadata)
        _write_all(writer, _declare_all(writer, tensors, dtypes))


def save_checkpoint(tensors: Mapping[str, np.ndarray], folder, *, max_shard_size: int = 0,
                    metadata: Optional[Mapping[str, str]] = None,
                    dtypes: Optional[Mapping[str, DTypeLike]] = None,
                    index_metadata: Optional[Mapping] = None) -> Tuple[str, ...]:
    """Writes numpy arrays as a checkpoint folder (sharded as transformers does); returns the files.

    ``metadata`` None keeps the writer's default ``{"format": "pt"}``.
    """
    with Writer.checkpoint(folder, max_shard_size) as writer:
        if metadata is not None:
            writer.set_metadata(metadata)
        if index_metadata is not None:
            writer.set_index_metadata(index_metadata)
        arrays = _declare_all(writer, tensors, dtypes)
        files = writer.files
        _write_all(writer, arrays)
    return files


def rewrite(source: Checkpoint, path, *, dtypes: Optional[Mapping[str, DTypeLike]] = None,
            metadata: Optional[Mapping[str, str]] = None, names: Optional[Iterable[str]] = None) -> None:
    """Writes (some of) a checkpoint's tensors to one file, streamed from its mapping, optionally
    converting dtypes. ``metadata`` None keeps the source's first file's metadata."""
    chosen = list(source) if names is None else list(names)
    with Writer.create(path) as writer:
        writer.set_metadata(source.metadata() if metadata is None else metadata)
        for name in chosen:
            info = source.tensor(name)
            writer.add_tensor(name, (dtypes or {}).get(name, info.dtype), info.shape)
        for name in writer.order:
            writer.write_from_checkpoint(name, source)


__all__ = ["Writer", "save_file", "save_checkpoint", "rewrite", "SOURCE_FN"]
