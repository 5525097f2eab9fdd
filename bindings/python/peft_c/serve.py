"""Serving many adapters over one base model: ``Registry``, ``Lease``, ``lora_apply`` and ``HostModel``.

::

    with peft_c.Registry("BF16", budget_bytes=2 << 30) as registry:
        registry.register("support", "adapters/support")     # reads the config and header only
        with registry.acquire("support") as lease:          # loads once, pinned while leased
            peft_c.lora_apply("model.layers.0.self_attn.q_proj", [lease], None, x, y)   # y += LoRA(x)

Lifetimes: each object holds its C handle through an ``Owned`` (freed when the last Python reference
goes). ``close()`` / ``release()`` drop the object's own hold, so the C object goes at once unless a
call running in another thread still uses it. Leases and host models keep their adapters after the
registry is closed (the library keeps what they need). A ``HostModel`` keeps a reference to every
array given to ``add_weight`` so that their memory stays valid while the library holds pointers into
it.

Thread safety (the library's): a registry and its leases may be used from many threads at once; a
host model by one thread at a time, and nobody may touch its arrays during a ``swap``. While the host
model lives it owns the arrays' contents: read them, but do not write them (in exact mode, taking an
adapter out writes the original bytes back, whatever the arrays hold).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
from ctypes import byref, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._dtypes import DType, DTypeLike, as_dtype
from ._lib import Owned, RegistryStatsStruct, SwapStatsStruct, check, lib, take_string, text
from .adapter import Translator, _encode, _path
from .merge import BUFFER_DTYPES, _Buffer, _buffer, _finite


def _u64(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < 2**64:
        raise ValueError(f"{what} must be an int between 0 and 2**64 - 1")
    return int(value)


@contextlib.contextmanager
def _adapter_options(base_dir, translator: Optional[Translator]):
    """A ``peft_adapter_options*`` (None for the defaults) for the time of one call."""
    if base_dir is None and translator is None:
        yield None
        return
    library = lib()
    opts = c_void_p()
    check(library.peft_adapter_options_new(byref(opts)))
    try:
        if base_dir is not None:
            check(library.peft_adapter_options_set_base_dir(opts, _path(base_dir)))
        if translator is not None:
            check(library.peft_adapter_options_set_translator(opts, translator._live().ptr))
        yield opts
    finally:
        library.peft_adapter_options_free(opts)


@dataclass(frozen=True)
class RegistryStats:
    """Counters of a registry, one consistent snapshot."""

    budget_bytes: int  #: the byte budget
    loaded_bytes: int  #: bytes of adapter tensors in memory now (never above the budget)
    peak_loaded_bytes: int  #: the highest loaded_bytes seen
    registered: int  #: names registered now
    loaded: int  #: adapter versions in memory now (replaced versions still leased included)
    pinned: int  #: of those, versions held by a lease or a host model
    loads: int  #: loads of tensors since the registry was made
    hits: int  #: acquisitions that found the tensors in memory
    evictions: int  #: loaded versions evicted to make room or by trim()


@dataclass(frozen=True)
class SwapStats:
    """What one ``HostModel.swap`` did."""

    remove_seconds: float  #: wall time taking the previous adapter out
    merge_seconds: float  #: wall time merging the new adapter in
    layers_removed: int
    layers_merged: int
    saved_bytes: int  #: bytes of original weights (and biases) the host model keeps for exact removal


class Lease:
    """An acquired adapter: loaded and pinned in its registry until released.

    Its name, version and byte count are read once at acquisition (they never change).
    """

    def __init__(self, owned: Owned):
        # Use Registry.acquire().
        library = lib()
        self._owned: Optional[Owned] = owned
        self.name: str = text(library.peft_lease_name(owned.ptr))
        #: the registration number of this version (a replacement has a higher one)
        self.version: int = int(library.peft_lease_version(owned.ptr))
        #: bytes the adapter's loaded tensors take (what it counts against the budget)
        self.nbytes: int = int(library.peft_lease_bytes(owned.ptr))

    def _live(self) -> Owned:
        # Callers keep the returned owner in a local for the whole C call, so a release() from
        # another thread cannot free the lease under it.
        owned = self._owned
        if owned is None:
            raise ValueError(f"operation on a released Lease of {self.name!r}")
        return owned

    def release(self) -> None:
        """Unpins the adapter (at once unless a call in another thread is still using it). Idempotent."""
        self._owned = None

    @property
    def released(self) -> bool:
        return self._owned is None

    def __enter__(self) -> "Lease":
        self._live()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def __reduce__(self):
        raise TypeError("a Lease cannot be pickled")

    def has_module(self, module: str) -> bool:
        """Whether the adapter has a LoRA layer of that name (a HuggingFace module path or weight
        name, or the host's name when the registry has a translator)."""
        return bool(lib().peft_lease_has_module(self._live().ptr, _encode(module, "module names")))

    def __repr__(self) -> str:
        state = "released" if self._owned is None else f"{self.nbytes} bytes"
        return f"<peft_c.Lease {self.name!r} v{self.version} {state}>"


class Registry:
    """Adapters registered under names, loaded on first use into ``dtype`` ("F32", "BF16" or "F16"),
    kept under a byte budget (least recently used out first; leased adapters are never evicted).

    ``translator`` makes ``lora_apply`` and ``Lease.has_module`` read layer names as the host's own.
    """

    def __init__(self, dtype: DTypeLike, budget_bytes: int, translator: Optional[Translator] = None):
        storage = as_dtype(dtype)
        out = c_void_p()
        check(lib().peft_registry_new(int(storage), _u64(budget_bytes, "budget_bytes"),
                                      translator._live().ptr if translator is not None else None,
                                      byref(out)))
        self._owned: Optional[Owned] = Owned(out.value, "peft_registry_free")
        self.dtype: DType = storage

    def _live(self) -> Owned:
        owned = self._owned
        if owned is None:
            raise ValueError("operation on a closed Registry")
        return owned

    def close(self) -> None:
        """Drops this object's hold on the registry. Leases and host models keep their adapters.
        Idempotent."""
        self._owned = None

    @property
    def closed(self) -> bool:
        return self._owned is None

    def __enter__(self) -> "Registry":
        self._live()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError("a Registry cannot be pickled")

    def __repr__(self) -> str:
        if self._owned is None:
            return "<peft_c.Registry closed>"
        stats = self.stats()
        return (f"<peft_c.Registry {self.dtype.name} {stats.registered} registered, "
                f"{stats.loaded_bytes}/{stats.budget_bytes} bytes loaded>")

    def register(self, name: str, path, *, base_dir=None, translator: Optional[Translator] = None) -> None:
        """Registers the adapter folder ``path`` under ``name`` (replacing that name's adapter for
        new acquisitions). Reads and validates the config and the safetensors header only; with
        ``base_dir`` the adapter is also validated against that base model."""
        owned = self._live()
        with _adapter_options(base_dir, translator) as opts:
            check(lib().peft_registry_register(owned.ptr, _encode(name, "names"), _path(path), opts))

    def register_memory(self, name: str, config_json: Union[str, dict], weights, *, base_dir=None,
                        translator: Optional[Translator] = None) -> None:
        """As ``register``, from the text (or dict) of adapter_config.json and the bytes of
        adapter_model.safetensors (any bytes-like object; both are copied)."""
        owned = self._live()
        if not isinstance(config_json, str):
            config_json = json.dumps(config_json)
        view = memoryview(weights)
        if not view.c_contiguous:
            view = memoryview(view.tobytes())
        view = view.cast("B")
        # A read-only buffer (bytes) has no ctypes from_buffer; numpy gives its address either way.
        data = np.frombuffer(view, dtype=np.uint8)
        with _adapter_options(base_dir, translator) as opts:
            check(lib().peft_registry_register_memory(owned.ptr, _encode(name, "names"),
                                                      _encode(config_json, "config_json"),
                                                      data.ctypes.data if data.size else None, data.size,
                                                      opts))

    def unregister(self, name: str) -> None:
        """Removes a name; leases on its adapter keep working (``NotFoundError`` if not registered)."""
        check(lib().peft_registry_unregister(self._live().ptr, _encode(name, "names")))

    def names(self) -> List[str]:
        """The registered names, in the order they were first registered."""
        out = c_void_p()
        check(lib().peft_registry_names(self._live().ptr, byref(out)))
        return [line for line in take_string(out).split("\n") if line]

    def acquire(self, name: str) -> Lease:
        """Loads the adapter if needed and pins it until the lease is released (``OverBudgetError``
        when it does not fit beside the pinned adapters)."""
        out = c_void_p()
        check(lib().peft_registry_acquire(self._live().ptr, _encode(name, "names"), byref(out)))
        return Lease(Owned(out.value, "peft_lease_release"))

    def trim(self) -> None:
        """Evicts every loaded adapter that nothing pins."""
        check(lib().peft_registry_trim(self._live().ptr))

    def set_budget(self, budget_bytes: int) -> None:
        """Changes the budget, evicting unpinned adapters until the loaded bytes fit
        (``OverBudgetError``, nothing changed, when the pinned ones alone take more)."""
        check(lib().peft_registry_set_budget(self._live().ptr, _u64(budget_bytes, "budget_bytes")))

    def stats(self) -> RegistryStats:
        raw = RegistryStatsStruct(size=ctypes.sizeof(RegistryStatsStruct))
        check(lib().peft_registry_get_stats(self._live().ptr, byref(raw)))
        return RegistryStats(**{name: int(getattr(raw, name)) for name, _ in RegistryStatsStruct._fields_
                                if name != "size"})


# ---- unmerged LoRA on activations -----------------------------------------------------------------------

def _input_matrix(obj, what: str) -> _Buffer:
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
        buffer = _Buffer(obj.ctypes.data, dtype, tuple(int(d) for d in obj.shape), int(obj.nbytes))
    else:
        buffer = _buffer(obj, None, what)
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
    owners = [lease._live() for lease in lease_list]  # held until the call returns
    x_buffer = _input_matrix(x, "x")
    y_buffer = _buffer(y, None, "y")
    if len(y_buffer.shape) != 2:
        raise ValueError(f"y must be 2-D (rows x features), not of shape {list(y_buffer.shape)}")
    rows = x_buffer.shape[0]
    if y_buffer.shape[0] != rows:
        raise ValueError(f"x has {rows} rows but y has {y_buffer.shape[0]}")
    indices = _row_leases(row_lease, rows)
    pointers = (c_void_p * max(len(owners), 1))(*[owner.ptr for owner in owners])
    check(lib().peft_lora_apply(
        _encode(module, "module names"), pointers, len(owners),
        indices.ctypes.data if indices is not None else None,
        x_buffer.address, int(x_buffer.dtype), rows, x_buffer.shape[1],
        y_buffer.address, int(y_buffer.dtype), y_buffer.shape[1]))


# ---- hot-swap into the host's weights ---------------------------------------------------------------------

class _HostState:
    """The C host model and the arrays it points into, kept alive together."""

    __slots__ = ("owned", "arrays", "__weakref__")

    def __init__(self, owned: Owned):
        self.owned = owned
        self.arrays: List[Tuple[Any, Any]] = []


class HostModel:
    """The host's weight arrays, into which adapters are swapped in place.

    ::

        host = peft_c.HostModel()
        for name, weight in model_weights.items():      # numpy arrays or CPU torch tensors
            host.add_weight(name, weight)
        host.swap(registry.acquire("support"))           # merged into the arrays
        host.swap(None)                                  # back to the base, bit for bit
    """

    def __init__(self):
        out = c_void_p()
        check(lib().peft_host_model_new(byref(out)))
        self._state: Optional[_HostState] = _HostState(Owned(out.value, "peft_host_model_free"))

    def _live(self) -> _HostState:
        state = self._state
        if state is None:
            raise ValueError("operation on a closed HostModel")
        return state

    def close(self) -> None:
        """Drops this object's hold: the adapter merged stays in the arrays (swap to None first to
        restore them) and its pin in the registry goes. Idempotent."""
        self._state = None

    @property
    def closed(self) -> bool:
        return self._state is None

    def __enter__(self) -> "HostModel":
        self._live()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __reduce__(self):
        raise TypeError("a HostModel cannot be pickled")

    def __repr__(self) -> str:
        if self._state is None:
            return "<peft_c.HostModel closed>"
        return f"<peft_c.HostModel {len(self._state.arrays)} weights, current={self.current!r}>"

    def set_translator(self, translator: Optional[Translator]) -> None:
        """Reads weight names as the host's own names (before any weight is added); None: HuggingFace."""
        state = self._live()
        check(lib().peft_host_model_set_translator(state.owned.ptr,
                                                   translator._live().ptr if translator is not None else None))

    def set_exact(self, exact: bool) -> None:
        """True (the default): the first exact merge of a weight keeps a copy of its bytes, which
        taking an adapter out writes back, bit for bit. False: PEFT's arithmetic unmerge (copies
        already taken are kept). Takes effect at the next merge; a layer comes out the way it went in."""
        check(lib().peft_host_model_set_exact(self._live().owned.ptr, 1 if exact else 0))

    def add_weight(self, name: str, weight, *, bias=None, dtype: Optional[DTypeLike] = None) -> None:
        """Gives one weight array (and the layer's bias, needed by adapters with lora_bias), laid out
        as the base model stores it ([out, in] for Linear, [in, out] for GPT-2 Conv1D). The arrays must
        be writable and C-contiguous; this object keeps them referenced. ``dtype`` reads a raw
        ``uint16`` array as "BF16".

        The library is told the bias's element count, and never writes past it: a swap of an
        adapter whose layer has another number of output features than the bias has elements fails
        with ``ShapeMismatchError``, the arrays unchanged."""
        state = self._live()
        buffer = _buffer(weight, dtype, "weight")
        bias_buffer = _buffer(bias, None, "bias") if bias is not None else None
        shape = (c_uint64 * max(len(buffer.shape), 1))(*buffer.shape)
        check(lib().peft_host_model_add_weight(
            state.owned.ptr, _encode(name, "weight names"), buffer.address, int(buffer.dtype), shape,
            len(buffer.shape), bias_buffer.address if bias_buffer else None,
            int(bias_buffer.dtype) if bias_buffer else 0,
            math.prod(bias_buffer.shape) if bias_buffer else 0))
        state.arrays.append((weight, bias))

    def swap(self, lease: Optional[Lease], weight: float = 1.0) -> SwapStats:
        """Takes the current adapter out of the arrays and merges ``lease``'s in (None: none), its
        scaling multiplied by ``weight``. Checked before anything changes: on error the arrays hold
        what they held. The host model keeps its own pin; the lease may be released at once."""
        state = self._live()
        lease_owner = lease._live() if lease is not None else None
        raw = SwapStatsStruct(size=ctypes.sizeof(SwapStatsStruct))
        check(lib().peft_host_model_swap(state.owned.ptr, lease_owner.ptr if lease_owner else None,
                                         _finite(weight), byref(raw)))
        return SwapStats(remove_seconds=float(raw.remove_seconds), merge_seconds=float(raw.merge_seconds),
                         layers_removed=int(raw.layers_removed), layers_merged=int(raw.layers_merged),
                         saved_bytes=int(raw.saved_bytes))

    @property
    def current(self) -> Optional[str]:
        """The name of the adapter merged into the arrays, or None."""
        return text(lib().peft_host_model_current(self._live().owned.ptr))


__all__ = ["HostModel", "Lease", "Registry", "RegistryStats", "SwapStats", "lora_apply"]
