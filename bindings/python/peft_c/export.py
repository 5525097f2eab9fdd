"""Exporting and combining adapters as PEFT adapter folders: ``export_adapter``, ``combine_adapters``.

The folders are what ``PeftModel.save_pretrained`` writes (adapter_model.safetensors and
adapter_config.json), written atomically. Both only read the adapters.
"""

from __future__ import annotations

import contextlib
import math
from ctypes import c_double, c_void_p
from typing import Optional, Sequence

from ._dtypes import DTypeLike, as_dtype
from ._handle import handle_of
from ._helpers import c_options, encode, fs_path
from ._lib import check, lib
from .adapter import Adapter

# Mirrors PEFT_COMBINE_* of include/peft_c.h (checked by a test).
COMBINE_METHODS = {"cat": 0, "linear": 1}


@contextlib.contextmanager
def _export_options(dtype: Optional[DTypeLike], peft_version: Optional[str]):
    with c_options("peft_export_options_new", "peft_export_options_free") as opts:
        if dtype is not None:
            check(lib().peft_export_options_set_dtype(opts, int(as_dtype(dtype))))
        if peft_version is not None:
            check(lib().peft_export_options_set_peft_version(opts, encode(peft_version, "peft_version")))
        yield opts


def export_adapter(adapter: Adapter, out_dir, *, dtype: Optional[DTypeLike] = None,
                   peft_version: Optional[str] = None) -> None:
    """Writes ``adapter`` as a PEFT adapter folder, keys made canonical.

    ``dtype`` ("F32", "BF16", "F16") converts the float tensors; ``peft_version`` ("0.13") writes a
    config that release reads, or raises ``UnsupportedError`` naming a field it cannot express.
    """
    with _export_options(dtype, peft_version) as opts:
        check(lib().peft_adapter_export(handle_of(adapter).ptr, fs_path(out_dir), opts))


def combine_adapters(adapters: Sequence[Adapter], weights: Sequence[float], out_dir, *,
                     method: str = "cat", dtype: Optional[DTypeLike] = None,
                     peft_version: Optional[str] = None) -> None:
    """Combines adapters into a new adapter folder as PEFT's ``add_weighted_adapter`` does
    (``method`` "cat" or "linear")."""
    adapters, weights = list(adapters), [float(w) for w in weights]
    if not adapters or len(adapters) != len(weights):
        raise ValueError("give one weight per adapter, and at least one adapter")
    if not all(math.isfinite(w) for w in weights):
        raise ValueError("weights must be finite")
    if method not in COMBINE_METHODS:
        raise ValueError(f"method must be one of {sorted(COMBINE_METHODS)}")
    owners = [handle_of(a) for a in adapters]  # kept alive for the call
    pointers = (c_void_p * len(owners))(*[o.ptr for o in owners])
    values = (c_double * len(weights))(*weights)
    with _export_options(dtype, peft_version) as opts:
        check(lib().peft_adapter_combine(pointers, values, len(owners), COMBINE_METHODS[method],
                                         fs_path(out_dir), opts))


__all__ = ["COMBINE_METHODS", "combine_adapters", "export_adapter"]
