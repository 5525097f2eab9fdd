"""Serving, the host-model part (as ``src/capi/serve_host_api.cpp``): ``HostModel``, the host's weight
arrays into which adapters are swapped, and ``SwapStats``.
"""

from __future__ import annotations

import ctypes
import math
from ctypes import byref, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Optional

from .._dtypes import DTypeLike
from .._handle import HandleObject, Owned, handle_of
from .._helpers import buffer_of, encode, finite
from .._lib import SwapStatsStruct, check, lib, text
from ..adapter import Translator
from .registry import Lease


@dataclass(frozen=True)
class SwapStats:
    """What one ``HostModel.swap`` did."""

    remove_seconds: float  #: wall time taking the previous adapter out
    merge_seconds: float  #: wall time merging the new adapter in
    layers_removed: int
    layers_merged: int
    saved_bytes: int  #: bytes of original weights (and biases) the host model keeps for exact removal


class HostModel(HandleObject):
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
        # The owner keeps (``keep``) every array given to add_weight: the C object points into them.
        super().__init__(Owned(out.value, "peft_host_model_free"))

    def close(self) -> None:
        """Drops this object's hold: the adapter merged stays in the arrays (swap to None first to
        restore them) and its pin in the registry goes. Idempotent."""
        super().close()

    def __repr__(self) -> str:
        owned = self._owned
        if owned is None:
            return "<peft_c.HostModel closed>"
        return f"<peft_c.HostModel {len(owned.keep)} weights, current={self.current!r}>"

    def set_translator(self, translator: Optional[Translator]) -> None:
        """Reads weight names as the host's own names (before any weight is added); None: HuggingFace."""
        owned = self._live()
        check(lib().peft_host_model_set_translator(owned.ptr,
                                                   handle_of(translator).ptr if translator is not None else None))

    def set_exact(self, exact: bool) -> None:
        """True (the default): the first exact merge of a weight keeps a copy of its bytes, which
        taking an adapter out writes back, bit for bit. False: PEFT's arithmetic unmerge (copies
        already taken are kept). Takes effect at the next merge; a layer comes out the way it went in."""
        check(lib().peft_host_model_set_exact(self._live().ptr, 1 if exact else 0))

    def add_weight(self, name: str, weight, *, bias=None, dtype: Optional[DTypeLike] = None) -> None:
        """Gives one weight array (and the layer's bias, needed by adapters with lora_bias), laid out
        as the base model stores it ([out, in] for Linear, [in, out] for GPT-2 Conv1D, [experts, out, in]
        for a fused expert parameter). The arrays must
        be writable and C-contiguous; this object keeps them referenced. ``dtype`` reads a raw
        ``uint16`` array as "BF16".

        The library is told the bias's element count, and never writes past it: a swap of an
        adapter whose layer has another number of output features than the bias has elements fails
        with ``ShapeMismatchError``, the arrays unchanged."""
        owned = self._live()
        buffer = buffer_of(weight, dtype, "weight")
        bias_buffer = buffer_of(bias, None, "bias") if bias is not None else None
        shape = (c_uint64 * max(len(buffer.shape), 1))(*buffer.shape)
        check(lib().peft_host_model_add_weight(
            owned.ptr, encode(name, "weight names"), buffer.address, int(buffer.dtype), shape,
            len(buffer.shape), bias_buffer.address if bias_buffer else None,
            int(bias_buffer.dtype) if bias_buffer else 0,
            math.prod(bias_buffer.shape) if bias_buffer else 0))
        owned.keep.append((weight, bias))

    def swap(self, lease: Optional[Lease], weight: float = 1.0) -> SwapStats:
        """Takes the current adapter out of the arrays and merges ``lease``'s in (None: none), its
        scaling multiplied by ``weight``. Checked before anything changes: on error the arrays hold
        what they held. The host model keeps its own pin; the lease may be released at once."""
        owned = self._live()
        lease_owner = handle_of(lease) if lease is not None else None
        raw = SwapStatsStruct(size=ctypes.sizeof(SwapStatsStruct))
        check(lib().peft_host_model_swap(owned.ptr, lease_owner.ptr if lease_owner else None,
                                         finite(weight), byref(raw)))
        return SwapStats(remove_seconds=float(raw.remove_seconds), merge_seconds=float(raw.merge_seconds),
                         layers_removed=int(raw.layers_removed), layers_merged=int(raw.layers_merged),
                         saved_bytes=int(raw.saved_bytes))

    @property
    def current(self) -> Optional[str]:
        """The name of the adapter merged into the arrays, or None."""
        return text(lib().peft_host_model_current(self._live().ptr))


__all__ = ["HostModel", "SwapStats"]
