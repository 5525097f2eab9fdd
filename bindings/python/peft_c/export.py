"""Exporting and combining adapters as PEFT adapter folders: ``export_adapter``, ``combine_adapters``; and
converting LoRA adapters to and from llama.cpp's GGUF LoRA files: ``export_adapter_gguf``,
``import_adapter_gguf``.

The folders are what ``PeftModel.save_pretrained`` writes (adapter_model.safetensors and
adapter_config.json), written atomically. Each function only reads the adapters.
"""

from __future__ import annotations

import contextlib
import math
from ctypes import c_double, c_void_p
from typing import Optional, Sequence, Union

from ._dtypes import DTypeLike, as_dtype
from ._handle import handle_of
from ._helpers import c_options, encode, fs_path
from ._lib import check, lib
from .adapter import Adapter
from .gguf import ggml_type_from_name

# Mirrors PEFT_COMBINE_* of include/peft_c.h (checked by a test).
COMBINE_METHODS = {"cat": 0, "linear": 1, "ties": 2, "dare_linear": 3, "dare_ties": 4, "magnitude_prune": 5, "svd": 6,
                   "ties_svd": 7, "dare_linear_svd": 8, "dare_ties_svd": 9, "magnitude_prune_svd": 10}
# Mirrors PEFT_MAJORITY_SIGN_* (checked by a test).
MAJORITY_SIGN_METHODS = {"total": 0, "frequency": 1}


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


def _combination_inputs(adapters: Sequence[Adapter], weights: Sequence[float], method: str):
    """The adapters' handles (keep them alive for the call), their pointers and the weights, checked."""
    adapters, weights = list(adapters), [float(w) for w in weights]
    if not adapters or len(adapters) != len(weights):
        raise ValueError("give one weight per adapter, and at least one adapter")
    if not all(math.isfinite(w) for w in weights):
        raise ValueError("weights must be finite")
    if method not in COMBINE_METHODS:
        raise ValueError(f"method must be one of {sorted(COMBINE_METHODS)}")
    owners = [handle_of(a) for a in adapters]
    return owners, (c_void_p * len(owners))(*[o.ptr for o in owners]), (c_double * len(weights))(*weights)


def _set_combination(opts, density: Optional[float], majority_sign_method: str, seed: int) -> None:
    """The pruning settings (density, majority sign, DARE's seed) on export options."""
    if majority_sign_method not in MAJORITY_SIGN_METHODS:
        raise ValueError(f"majority_sign_method must be one of {sorted(MAJORITY_SIGN_METHODS)}")
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 64:
        raise ValueError("seed must be an integer from 0 to 2**64 - 1")
    if density is not None:
        check(lib().peft_export_options_set_combine_density(opts, float(density)))
    check(lib().peft_export_options_set_combine_majority_sign(opts, MAJORITY_SIGN_METHODS[majority_sign_method]))
    check(lib().peft_export_options_set_combine_seed(opts, seed))


def combine_adapters(adapters: Sequence[Adapter], weights: Sequence[float], out_dir, *,
                     method: str = "cat", dtype: Optional[DTypeLike] = None,
                     peft_version: Optional[str] = None, density: Optional[float] = None,
                     majority_sign_method: str = "total", seed: int = 0, svd_rank: Optional[int] = None,
                     svd_clamp: Optional[float] = None) -> None:
    """Combines adapters into a new adapter folder as PEFT's ``add_weighted_adapter`` does.

    ``method`` is one of ``COMBINE_METHODS`` ("cat", "linear", "ties", "dare_linear", "dare_ties",
    "magnitude_prune", and "svd" with its four pruning forms "ties_svd", "dare_linear_svd",
    "dare_ties_svd", "magnitude_prune_svd"); the pruning types need ``density`` (the fraction of each
    factor, or of each delta for the SVD types, kept, 0 to 1); the TIES ones read
    ``majority_sign_method`` ("total" or "frequency"), the DARE ones ``seed`` (their masks are a
    documented function of it, see include/peft_c.h). The SVD types read PEFT's ``svd_rank`` (None:
    the largest of the adapters' ranks) and ``svd_clamp`` (a quantile from 0 to 1, or None).
    """
    owners, pointers, values = _combination_inputs(adapters, weights, method)
    with _export_options(dtype, peft_version) as opts:
        _set_combination(opts, density, majority_sign_method, seed)
        if svd_rank is not None:
            if isinstance(svd_rank, bool) or not isinstance(svd_rank, int) or svd_rank < 1:
                raise ValueError("svd_rank must be an integer of at least 1, or None")
            check(lib().peft_export_options_set_combine_svd_rank(opts, svd_rank))
        if svd_clamp is not None:
            check(lib().peft_export_options_set_combine_svd_clamp(opts, float(svd_clamp)))
        check(lib().peft_adapter_combine(pointers, values, len(owners), COMBINE_METHODS[method],
                                         fs_path(out_dir), opts))


def export_adapter_gguf(adapter: Adapter, out_path, *, base=None, ggml_type: Union[str, int] = "F32") -> None:
    """Writes ``adapter`` as a GGUF LoRA adapter that llama.cpp loads (``--lora``, ``llama-export-lora``),
    with PEFT's exact scale for every module; the file is written atomically.

    It holds ``general.architecture`` (the base's), ``adapter.lora.alpha`` and a
    ``<GGUF tensor>.lora_a``/``.lora_b`` pair per module, named by the base's architecture table.
    ``base`` is a Hugging Face model folder or hub id (its config.json) or a GGUF model file; None uses
    the adapter's ``base_model_name_or_path``. ``ggml_type`` is the factors' type, a name or ggml's
    number: "F32", "F16", "BF16" or "Q8_0" (a factor whose rows are not a multiple of 32 values is then
    written F16, as llama.cpp's converter does).

    Raises ``UnsupportedError`` listing the modules GGUF cannot hold (DoRA, lora_B.bias, whole tensors,
    trainable tokens, conv layers) or for a base architecture without GGUF names;
    ``UnresolvedKeyError`` listing the modules without a GGUF tensor; ``InvalidArgumentError`` for
    another type or no base; ``InvalidConfigError`` for a base folder without a usable config.json;
    ``NonFiniteError``; ``IoError`` and the errors of ``Checkpoint.open`` for the base.
    """
    check(lib().peft_adapter_export_gguf(handle_of(adapter).ptr, fs_path(out_path),
                                         None if base is None else fs_path(base, "base"),
                                         _ggml_type_code(ggml_type)))


def _ggml_type_code(ggml_type: Union[str, int]) -> int:
    """The ggml number of a GGUF export's factor type, given as a name or a number."""
    code = ggml_type_from_name(ggml_type) if isinstance(ggml_type, str) else ggml_type
    if isinstance(code, bool) or not isinstance(code, int):
        raise TypeError("ggml_type is a name or an int")
    if not 0 <= code < 2**31:
        raise ValueError(f"ggml type {code} is not F32, F16, BF16 or Q8_0")
    return code


def export_adapter_gguf_split(adapter: Adapter, out_path, base_out, *, base=None,
                              ggml_type: Union[str, int] = "F32") -> None:
    """``export_adapter_gguf`` for any LoRA adapter: what a GGUF LoRA cannot hold (DoRA, lora_B.bias,
    whole tensors such as modules_to_save, trainable tokens, conv layers) is merged PEFT-exactly into a
    copy of the base written to ``base_out``, the rest is written to ``out_path`` exactly as
    ``export_adapter_gguf`` writes it, so that llama.cpp applying ``out_path`` to ``base_out`` gives
    PEFT's merged model.

    ``base_out`` is a GGUF file for a GGUF base, a folder (created if needed) that transformers loads
    for a Hugging Face base; it must be neither the base nor ``out_path``. With nothing to merge it is
    a copy of the base. ``base`` and ``ggml_type`` are as for ``export_adapter_gguf``. All or nothing:
    a failure leaves neither output.

    Raises ``InvalidArgumentError`` for an empty path, ``base_out`` equal to the base or to
    ``out_path``, another type or no base; the errors of ``export_adapter_gguf`` for the exported
    modules and of ``merge_checkpoint`` for the merged ones (``UnresolvedKeyError``,
    ``UnsupportedError`` for trainable tokens or a target whose ggml type has no quantizer (the IQ types but IQ4_NL) in a GGUF base,
    ``NonFiniteError``, ``IoError``).
    """
    check(lib().peft_adapter_export_gguf_split(handle_of(adapter).ptr, fs_path(out_path),
                                               None if base is None else fs_path(base, "base"),
                                               _ggml_type_code(ggml_type), fs_path(base_out, "base_out")))


def import_adapter_gguf(gguf_path, out_dir, *, base) -> None:
    """Writes a GGUF LoRA adapter (llama.cpp's ``convert_lora_to_gguf.py`` output, or
    ``export_adapter_gguf``'s) as a PEFT LoRA adapter folder that PEFT loads and merges to the weights
    llama.cpp applies; factors are written F32, and a failure leaves ``out_dir`` as it was.

    ``base`` is required: a Hugging Face model folder or hub id, or a GGUF model file; it gives the
    head counts and becomes ``base_model_name_or_path``.

    Raises ``InvalidArgumentError`` for an empty argument, a file that is not a GGUF adapter or a base of
    another architecture; ``UnsupportedError`` for an adapter type other than LoRA, an unknown
    architecture or tensors that are not LoRA factors; ``UnresolvedKeyError`` listing the GGUF modules
    without a PEFT module; ``InvalidCheckpointError`` for incomplete pairs; ``ShapeMismatchError``;
    ``IoError`` and the errors of ``Checkpoint.open``.
    """
    check(lib().peft_adapter_import_gguf(fs_path(gguf_path), fs_path(out_dir), fs_path(base, "base")))


__all__ = ["COMBINE_METHODS", "MAJORITY_SIGN_METHODS", "combine_adapters", "export_adapter", "export_adapter_gguf", "export_adapter_gguf_split",
           "import_adapter_gguf"]
