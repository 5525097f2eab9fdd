"""LoRA extraction from a fine-tuned checkpoint and conversion of adapters to plain LoRA (truncated SVD,
as PEFT's ``convert_to_lora``): ``extract_lora``, ``convert_to_lora``, ``convert_initial``; and the
delta-space combination of adapters into one plain LoRA: ``combine_deltas``.

Each writes a PEFT adapter folder (adapter_model.safetensors and adapter_config.json) that PEFT loads
with no missing or unexpected keys. ``extract_lora`` and ``convert_to_lora`` return the report: per
module, its rank and the relative error ||dW - B A||_F / ||dW||_F of the f32 factors.
"""

from __future__ import annotations

import contextlib
from ctypes import byref, c_char_p, c_void_p
from dataclasses import dataclass
from typing import Iterator, List, Optional, Sequence

from ._dtypes import DTypeLike, as_dtype
from ._handle import handle_of
from ._helpers import c_options, encode, fs_path
from ._lib import check, lib, text
from .adapter import Adapter
from .export import COMBINE_METHODS, _combination_inputs, _export_options, _set_combination

# Mirrors PEFT_SVD_* of include/peft_c.h.
SVD_METHODS = {"exact": 0, "randomized": 1}


@dataclass(frozen=True)
class LowRankModule:
    """One module of an extraction or conversion."""

    #: the module's name, "model.layers.0.self_attn.q_proj"
    name: str
    #: its rank in the written adapter
    rank: int
    #: ||dW - B A||_F / ||dW||_F of the f32 factors (0 for a zero dW)
    error: float


@contextlib.contextmanager
def _lowrank_options(rank: Optional[int], energy: Optional[float], svd: str, threads: int,
                     dtype: Optional[DTypeLike], modules: Optional[Sequence[str]],
                     base=None, exact_allowed: bool = False) -> Iterator[c_void_p]:
    if rank is not None and energy is not None or (rank is None and energy is None and not exact_allowed):
        raise ValueError("give either rank or energy")
    if svd not in SVD_METHODS:
        raise ValueError(f"svd must be one of {sorted(SVD_METHODS)}")
    if isinstance(threads, bool) or not isinstance(threads, int) or not 0 <= threads < 2**32:
        raise ValueError("threads is a count from 0 (one per hardware thread) to 2**32 - 1")
    names = None
    if modules is not None:
        if isinstance(modules, str):
            raise TypeError("modules is a sequence of names, not one string")
        names = [encode(m, "module names") for m in modules]
    with c_options("peft_lowrank_options_new", "peft_lowrank_options_free") as opts:
        library = lib()
        if rank is not None:
            if isinstance(rank, bool) or not isinstance(rank, int):
                raise TypeError("rank is an int")
            check(library.peft_lowrank_options_set_rank(opts, rank))
        elif energy is not None:
            check(library.peft_lowrank_options_set_energy(opts, float(energy)))
        check(library.peft_lowrank_options_set_svd(opts, SVD_METHODS[svd]))
        check(library.peft_lowrank_options_set_threads(opts, threads))
        if dtype is not None:
            check(library.peft_lowrank_options_set_dtype(opts, int(as_dtype(dtype))))
        if names:
            check(library.peft_lowrank_options_set_modules(opts, (c_char_p * len(names))(*names), len(names)))
        if base is not None:
            check(library.peft_lowrank_options_set_base(opts, fs_path(base, "base")))
        yield opts


def _take_report(report: c_void_p) -> List[LowRankModule]:
    library = lib()
    try:
        return [LowRankModule(text(library.peft_lowrank_report_module_name(report, i)),
                              int(library.peft_lowrank_report_module_rank(report, i)),
                              float(library.peft_lowrank_report_module_error(report, i)))
                for i in range(library.peft_lowrank_report_module_count(report))]
    finally:
        library.peft_lowrank_report_free(report)


def extract_lora(base, tuned, out_dir, *, rank: Optional[int] = None, energy: Optional[float] = None,
                 svd: str = "exact", threads: int = 0, dtype: Optional[DTypeLike] = None,
                 modules: Optional[Sequence[str]] = None) -> List[LowRankModule]:
    """Makes a LoRA adapter from a fully fine-tuned checkpoint: dW = W_tuned - W_base per module, truncated
    SVD, written to ``out_dir``. ``base`` and ``tuned`` are model folders (or hub ids in the offline cache)
    with the same tensor names.

    Exactly one of ``rank`` (every module) and ``energy`` (in (0, 1]: each module's rank keeps that share
    of its squared singular values, as PEFT's ``_find_cutoff_index``) is given. ``svd`` is "exact" or
    "randomized"; ``threads`` 0 uses one per hardware thread; ``dtype`` ("F32", "BF16", "F16") is the
    factors'; ``modules`` selects modules as PEFT's ``target_modules`` list (default: the Linear and
    Conv1D layers "all-linear" names). Only weights that changed are extracted.

    Raises ``InvalidArgumentError`` (a rank above a module's dimensions, modules that select nothing, no
    weight that changed), ``UnresolvedKeyError``, ``ShapeMismatchError``, ``UnsupportedError`` (a selected
    module that is not Linear or Conv1D), ``NonFiniteError``, ``NotFoundError``, ``IoError``.
    """
    report = c_void_p()
    with _lowrank_options(rank, energy, svd, threads, dtype, modules) as opts:
        check(lib().peft_adapter_extract(fs_path(base, "base"), fs_path(tuned, "tuned"), fs_path(out_dir), opts,
                                         byref(report)))
    return _take_report(report)


def convert_to_lora(adapter: Adapter, out_dir, *, rank: Optional[int] = None, energy: Optional[float] = None,
                    svd: str = "exact", threads: int = 0, dtype: Optional[DTypeLike] = None,
                    base=None) -> List[LowRankModule]:
    """Writes ``adapter`` as a plain LoRA of another rank, by truncated SVD of each module's dW, as PEFT's
    ``convert_to_lora`` / ``save_as_lora``. Options as for ``extract_lora``. ``base`` is the base model
    folder (or hub id) to convert against: multiplicative methods (IA3, OFT, BOFT, HRA, MiSS "bat") need
    it, as dW = W' - W, and additive ones such as VeRA take their layer shapes from it; without it the
    base the adapter was opened with, if any, is used.

    Raises ``UnsupportedError`` naming what PEFT does not convert (lora_bias, DoRA, embedding and conv
    modules, modules_to_save, trainable tokens) or a method that needs a base without one,
    ``InvalidArgumentError`` (a rank above a module's dimensions), ``NotFoundError`` (the base has no
    weight for a module), ``NonFiniteError``, ``IoError``.
    """
    owner = handle_of(adapter)
    report = c_void_p()
    with _lowrank_options(rank, energy, svd, threads, dtype, None, base) as opts:
        check(lib().peft_adapter_convert_to_lora(owner.ptr, fs_path(out_dir), opts, byref(report)))
    return _take_report(report)


def convert_initial(tuned_dir, initial_dir, out_dir, *, dtype: Optional[DTypeLike] = None) -> None:
    """Turns a PiSSA / CorDA / OLoRA / LoRA-GA / LoftQ initialised adapter after training (``tuned_dir``)
    into a LoRA on the original base, exactly as PEFT's
    ``save_pretrained(path_initial_model_for_weight_conversion=initial_dir)``: lora_A = [A; A0],
    lora_B = [B, -B0], the rank doubled. ``dtype`` converts the factors.

    Raises ``UnsupportedError`` for a tensor other than lora_A / lora_B weights, or use_rslora with rank
    or alpha patterns; ``InvalidArgumentError`` for adapters with different modules;
    ``ShapeMismatchError``; ``IoError``; the errors of ``Adapter.open``.
    """
    with _export_options(dtype, None) as opts:
        check(lib().peft_adapter_convert_initial(fs_path(tuned_dir, "tuned_dir"), fs_path(initial_dir, "initial_dir"),
                                                 fs_path(out_dir), opts))


__all__ = ["LowRankModule", "SVD_METHODS", "convert_initial", "convert_to_lora", "extract_lora"]


def combine_deltas(adapters: Sequence[Adapter], weights: Sequence[float], out_dir, *, method: str = "linear",
                   density: Optional[float] = None, majority_sign_method: str = "total", seed: int = 0,
                   rank: Optional[int] = None, energy: Optional[float] = None, svd: str = "exact", threads: int = 0,
                   dtype: Optional[DTypeLike] = None, base=None) -> List[LowRankModule]:
    """Combines adapters in delta space into a plain LoRA adapter: the weighted sum of each module's true
    weight change (any mergeable method: LoRA with its own scaling, LoHa, LoKr, ...; IA3, OFT, BOFT, HRA
    against ``base``), not PEFT's factor-wise ``add_weighted_adapter``.

    ``method`` is "linear" (the sum) or "ties", "dare_linear", "dare_ties", "magnitude_prune" (PEFT's
    merge_utils on the deltas, with ``density``, ``majority_sign_method`` and ``seed`` as for
    ``combine_adapters``). With neither ``rank`` nor ``energy`` the sum is written exactly (LoRA inputs
    and "linear" only: the factors stacked, rank = the sum of the ranks); otherwise each module is
    truncated by SVD as ``convert_to_lora`` does. Returns the per-module report.

    Raises ``UnsupportedError`` naming the adapter and why (DoRA, lora_bias, modules_to_save, embedding
    and conv modules, ...), ``InvalidArgumentError`` (another method, a missing density, an exact
    combination that has no exact factors, a rank above a module's dimensions), ``ShapeMismatchError``,
    ``NotFoundError``, ``NonFiniteError``, ``IoError``.
    """
    if method not in ("linear", "ties", "dare_linear", "dare_ties", "magnitude_prune"):
        raise ValueError("method must be linear, ties, dare_linear, dare_ties or magnitude_prune")
    owners, pointers, values = _combination_inputs(adapters, weights, method)
    report = c_void_p()
    with _export_options(None, None) as combine_opts:
        _set_combination(combine_opts, density, majority_sign_method, seed)
        with _lowrank_options(rank, energy, svd, threads, dtype, None, base, exact_allowed=True) as opts:
            check(lib().peft_adapter_combine_deltas(pointers, values, len(owners), COMBINE_METHODS[method],
                                                    fs_path(out_dir), combine_opts, opts, byref(report)))
    return _take_report(report)
