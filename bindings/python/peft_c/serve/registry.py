"""Serving, the registry part (as ``src/capi/serve_registry_api.cpp``): ``Registry``, ``RegistryStats`` and
the ``Lease`` objects that pin its adapters.
"""

from __future__ import annotations

import ctypes
import json
import math
from ctypes import byref, c_uint64, c_void_p
from dataclasses import dataclass
from typing import List, Optional, Union

import numpy as np

from .._dtypes import DType, DTypeLike, as_dtype
from .._handle import HandleObject, Owned, handle_of
from .._helpers import adapter_options, buffer_of, encode, fs_path, u64
from .._lib import RegistryStatsStruct, check, lib, take_string_list, text
from ..adapter import Translator


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


class Lease(HandleObject):
    """An acquired adapter: loaded and pinned in its registry until released.

    Its name, version and byte count are read once at acquisition (they never change).
    """

    _closed_word = "released"

    def __init__(self, owned: Owned):
        # Use Registry.acquire().
        super().__init__(owned)
        library = lib()
        self.name: str = text(library.peft_lease_name(owned.ptr))
        #: the registration number of this version (a replacement has a higher one)
        self.version: int = int(library.peft_lease_version(owned.ptr))
        #: bytes the adapter's loaded tensors take (what it counts against the budget)
        self.nbytes: int = int(library.peft_lease_bytes(owned.ptr))

    def release(self) -> None:
        """Unpins the adapter (at once unless a call in another thread is still using it). Idempotent."""
        self.close()

    @property
    def released(self) -> bool:
        return self.closed

    def has_module(self, module: str) -> bool:
        """Whether the adapter has a LoRA layer of that name (a HuggingFace module path or weight
        name, or the host's name when the registry has a translator)."""
        return bool(lib().peft_lease_has_module(self._live().ptr, encode(module, "module names")))

    def __repr__(self) -> str:
        state = "released" if self._owned is None else f"{self.nbytes} bytes"
        return f"<peft_c.Lease {self.name!r} v{self.version} {state}>"


class Registry(HandleObject):
    """Adapters registered under names, loaded on first use into ``dtype`` ("F32", "BF16" or "F16"),
    kept under a byte budget (least recently used out first; leased adapters are never evicted).

    ``translator`` makes ``lora_apply`` and ``Lease.has_module`` read layer names as the host's own.
    """

    def __init__(self, dtype: DTypeLike, budget_bytes: int, translator: Optional[Translator] = None):
        storage = as_dtype(dtype)
        out = c_void_p()
        check(lib().peft_registry_new(int(storage), u64(budget_bytes, "budget_bytes"),
                                      handle_of(translator).ptr if translator is not None else None,
                                      byref(out)))
        super().__init__(Owned(out.value, "peft_registry_free"))
        self.dtype: DType = storage

    def close(self) -> None:
        """Drops this object's hold on the registry. Leases and host models keep their adapters.
        Idempotent."""
        super().close()

    def __repr__(self) -> str:
        if self._owned is None:
            return "<peft_c.Registry closed>"
        stats = self.stats()
        return (f"<peft_c.Registry {self.dtype.name} {stats.registered} registered, "
                f"{stats.loaded_bytes}/{stats.budget_bytes} bytes loaded>")

    def register(self, name: str, path, *, base_dir=None, translator: Optional[Translator] = None,
                 lenient: bool = False) -> None:
        """Registers the adapter folder ``path`` under ``name`` (replacing that name's adapter for
        new acquisitions). Reads and validates the config and the safetensors header only; with
        ``base_dir`` the adapter is also validated against that base model; ``lenient`` as for
        ``Adapter.open``."""
        owned = self._live()
        with adapter_options(base_dir, translator, lenient) as opts:
            check(lib().peft_registry_register(owned.ptr, encode(name, "names"), fs_path(path), opts))

    def register_memory(self, name: str, config_json: Union[str, dict], weights, *, base_dir=None,
                        translator: Optional[Translator] = None, lenient: bool = False) -> None:
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
        with adapter_options(base_dir, translator, lenient) as opts:
            check(lib().peft_registry_register_memory(owned.ptr, encode(name, "names"),
                                                      encode(config_json, "config_json"),
                                                      data.ctypes.data if data.size else None, data.size,
                                                      opts))

    def unregister(self, name: str) -> None:
        """Removes a name; leases on its adapter keep working (``NotFoundError`` if not registered)."""
        check(lib().peft_registry_unregister(self._live().ptr, encode(name, "names")))

    def names(self) -> List[str]:
        """The registered names, in the order they were first registered."""
        out = c_void_p()
        check(lib().peft_registry_name_list(self._live().ptr, byref(out)))
        return take_string_list(out)

    def warnings(self, name: str) -> List[str]:
        """What lenient loading ignored when the adapter registered under ``name`` now was
        registered (as ``Adapter.warnings``); empty for a strict registration (``NotFoundError`` if
        not registered)."""
        out = c_void_p()
        check(lib().peft_registry_warning_list(self._live().ptr, encode(name, "names"), byref(out)))
        return take_string_list(out)

    def acquire(self, name: str) -> Lease:
        """Loads the adapter if needed and pins it until the lease is released (``OverBudgetError``
        when it does not fit beside the pinned adapters)."""
        owned = self._live()
        out = c_void_p()
        check(lib().peft_registry_acquire(owned.ptr, encode(name, "names"), byref(out)))
        lease = Owned(out.value, "peft_lease_free")
        lease.keep.append(owned.keep)  # the base weights (set_base_weight): a lease may outlive the registry
        return Lease(lease)

    def trim(self) -> None:
        """Evicts every loaded adapter that nothing pins."""
        check(lib().peft_registry_trim(self._live().ptr))

    def set_budget(self, budget_bytes: int) -> None:
        """Changes the budget, evicting unpinned adapters until the loaded bytes fit
        (``OverBudgetError``, nothing changed, when the pinned ones alone take more)."""
        check(lib().peft_registry_set_budget(self._live().ptr, u64(budget_bytes, "budget_bytes")))

    def set_base_weight(self, name: str, weight, *, bias=None, dtype: Optional[DTypeLike] = None) -> None:
        """Gives the base weight of one layer (and its bias), which ``lora_apply`` needs for DoRA
        layers: laid out as the base model stores it ([out, in] for Linear, [in, out] for GPT-2
        Conv1D), a C-contiguous numpy array or CPU torch tensor, borrowed (this object keeps it
        referenced). ``y`` given to ``lora_apply`` for a DoRA layer is the base output with the bias.
        After changing the arrays' contents call ``base_weights_changed``. ``dtype`` reads a raw
        ``uint16`` array as "BF16"."""
        owned = self._live()
        buffer = buffer_of(weight, dtype, "weight")
        bias_buffer = buffer_of(bias, None, "bias") if bias is not None else None
        shape = (c_uint64 * max(len(buffer.shape), 1))(*buffer.shape)
        check(lib().peft_registry_set_base_weight(
            owned.ptr, encode(name, "weight names"), buffer.address, int(buffer.dtype), shape,
            len(buffer.shape), bias_buffer.address if bias_buffer else None,
            int(bias_buffer.dtype) if bias_buffer else 0,
            math.prod(bias_buffer.shape) if bias_buffer else 0))
        owned.keep.append((weight, bias))

    def base_weights_changed(self) -> None:
        """The contents of the base weights given with ``set_base_weight`` changed: DoRA scales are
        computed again at their next use."""
        check(lib().peft_registry_base_weights_changed(self._live().ptr))

    def stats(self) -> RegistryStats:
        raw = RegistryStatsStruct(size=ctypes.sizeof(RegistryStatsStruct))
        check(lib().peft_registry_get_stats(self._live().ptr, byref(raw)))
        return RegistryStats(**{name: int(getattr(raw, name)) for name, _ in RegistryStatsStruct._fields_
                                if name != "size"})


__all__ = ["Lease", "Registry", "RegistryStats"]
