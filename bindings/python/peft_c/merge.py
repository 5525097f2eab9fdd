"""Merging adapters: into a model folder (``merge_checkpoint``) or into a weight the host owns
(``merge_into`` -> ``MergeRecord``, whose ``remove`` takes the merge out again); and whole-model task
arithmetic over fine-tuned checkpoints (``combine_models``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from ctypes import byref, c_char_p, c_double, c_uint64, c_void_p
from dataclasses import dataclass
from typing import Callable, Iterable, List, Optional, Sequence, Tuple, Union

from ._dtypes import DTypeLike, as_dtype
from ._errors import CancelledError
from ._handle import Owned, handle_of
from ._helpers import Buffer, buffer_of, c_options, encode, finite, fs_path, thread_count
from ._lib import PROGRESS_FN, check, lib, text
from .adapter import Adapter, Translator

# Mirror PEFT_DTYPE_KEEP (whose older name is PEFT_MERGE_DTYPE_KEEP) and PEFT_MERGE_TENSORS_* of
# include/peft_c.h (checked by a test).
MERGE_DTYPE_KEEP = -1
MERGE_TENSOR_COUNTS: Tuple[Tuple[int, str], ...] = (
    (0, "MERGED"),
    (1, "REPLACED"),
    (2, "COPIED"),
    (3, "ADDED"),
)

AdapterSpec = Union[Adapter, str, "os.PathLike[str]", Tuple[Union[Adapter, str, "os.PathLike[str]"], float]]


@dataclass(frozen=True)
class MergeResult:
    """What a checkpoint merge wrote."""

    merged: int  #: tensors changed by LoRA, DoRA, lora_B.bias or token rows
    replaced: int  #: tensors replaced whole by an adapter tensor
    copied: int  #: base tensors written unchanged (converted if the dtype changed)
    added: int  #: tensors the base lacks (an untied output embedding)
    bytes: int  #: tensor bytes written
    files: Tuple[str, ...]  #: files written, relative to the output folder (weights first)
    untied_embeddings: bool  #: whether tie_word_embeddings was set to false
    notes: Tuple[str, ...]
    #: GGUF bases with ``report=True``: per merged tensor, a dict with "tensor", "base_type", "type",
    #: "values", "rms", "max" (stored merge vs exact f32 merge), "base_rms", "base_max" (base stored in
    #: that type vs the base); empty otherwise
    report: Tuple[dict, ...] = ()


#: merge_checkpoint's ``arithmetic`` names: PEFT_MERGE_ARITHMETIC_PEFT and PEFT_MERGE_ARITHMETIC_GGML.
ARITHMETICS = {"peft": 0, "ggml": 1}

#: merge_checkpoint's ``tied_embeddings`` names: PEFT_MERGE_TIED_UNTIE and PEFT_MERGE_TIED_SHARED.
TIED_EMBEDDINGS = {"untie": 0, "shared": 1}


def merge_checkpoint(base_dir, out_dir, adapters: Iterable[AdapterSpec], *,
                     dtype: Optional[DTypeLike] = None, max_shard_size: int = 0, threads: int = 0,
                     progress: Optional[Callable[[int, int], Optional[bool]]] = None,
                     require_config: bool = True, allow_nonfinite: bool = False,
                     quant: Optional[Union[str, int]] = None, report: bool = False,
                     arithmetic: str = "peft", tied_embeddings: str = "untie",
                     join_split: bool = False, combine: str = "linear", density: Optional[float] = None,
                     majority_sign_method: str = "total", seed: int = 0) -> MergeResult:
    """Merges adapters into a base model folder and writes the merged model folder.

    ``adapters`` holds opened ``Adapter`` objects or adapter folders, each optionally paired with a
    weight (``(adapter, 0.5)``; 1.0 merges as PEFT's ``merge_and_unload`` does), applied in order.
    ``dtype`` None keeps every tensor's dtype; "F32", "BF16" or "F16" converts. ``max_shard_size`` 0
    keeps the base's files, otherwise reshards as ``save_pretrained`` does. ``progress(done, total)``
    is called as bytes are written; returning True cancels (``CancelledError``) and an exception it
    raises cancels and is re-raised. ``require_config`` False merges a base folder without a usable
    config.json (the output then has none; by default it is ``NotFoundError``, as transformers cannot load
    such a folder). ``allow_nonfinite`` True writes merged tensors holding an infinity or a NaN (by default
    ``NonFiniteError``). On any failure the output folder is left as it was.

    For a GGUF base (``base_dir`` a .gguf file, ``out_dir`` the file to write) merged tensors keep their
    type, block-quantized ones re-quantized as ggml does; ``quant`` (a ggml type name such as "Q8_0" or
    "Q4_K", or its number) or ``dtype`` writes them in another type instead, and ``report`` True fills
    ``MergeResult.report`` with what storing each merged tensor costs.

    ``arithmetic`` "peft" (the default) adds plain LoRA deltas in PEFT's f32 order; "ggml" in
    llama-export-lora's on ggml's scalar build (float products summed in double over the rank), so that
    a GGUF merge equals ggml's quantization of llama-export-lora's F32 merge byte for byte; DoRA and
    the other methods are then refused (``UnsupportedError``).

    ``tied_embeddings`` says what happens to a base with tied embeddings (``tie_word_embeddings``) when
    the adapters change one side: "untie" (the default) makes the merged model equal the adapter's
    forward, untying the pair where the sides differ (``lm_head.weight`` written, the config key set to
    false, a note in ``MergeResult.notes``); "shared" writes the changes into the one shared tensor as
    PEFT's ``merge_and_unload`` does.

    ``join_split`` makes a merge into a GGUF base split into parts (``NAME-00001-of-00003.gguf``)
    write one joined file instead of the same parts (``peft_merge_options_set_join_split``).

    ``combine`` makes a merge of several adapters combine their changes on the deltas, as PEFT's
    merge_utils does, before they go into each weight, instead of adding them one after the other:
    W' = round(W + combine(w_i dW_i)), each dW_i the module's own change (PEFT's ``get_delta_weight``),
    combined in f32 (``peft_merge_options_set_combine``; ``peftc merge --combine``). It is "linear" (the
    default: adapters added in turn) or "ties", "dare_linear", "dare_ties", "magnitude_prune", with
    ``density``, ``majority_sign_method`` and DARE's ``seed`` as for ``combine_adapters``: the weights
    ``combine_deltas`` writes for the same inputs, merged in one pass and without a rank. The pruning
    methods need ``density`` and another method of ``COMBINE_METHODS`` is refused
    (``InvalidArgumentError``); a name outside it is a ``ValueError``. Modules that have no delta to
    combine (DoRA, stacked expert parameters, embedding and convolution layers, ...) and GGUF bases
    are refused with ``UnsupportedError``, ``arithmetic="ggml"`` with ``InvalidArgumentError``, before
    anything is written.
    """
    library = lib()
    raised: List[BaseException] = []
    callback = None
    with c_options("peft_merge_options_new", "peft_merge_options_free") as opts:
        count = 0
        for spec in adapters:
            adapter, weight = spec if isinstance(spec, tuple) else (spec, 1.0)
            if isinstance(adapter, Adapter):
                check(library.peft_merge_options_add_adapter(opts, handle_of(adapter).ptr, finite(weight)))
            else:
                check(library.peft_merge_options_add_adapter_dir(opts, fs_path(adapter), finite(weight)))
            count += 1
        if count == 0:
            raise ValueError("merge_checkpoint needs at least one adapter")
        if dtype is not None:
            check(library.peft_merge_options_set_dtype(opts, int(as_dtype(dtype))))
        if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, int) or max_shard_size < 0:
            raise ValueError("max_shard_size must be a non-negative int")
        check(library.peft_merge_options_set_max_shard_size(opts, max_shard_size))
        check(library.peft_merge_options_set_threads(opts, thread_count(threads)))
        check(library.peft_merge_options_set_require_config(opts, 1 if require_config else 0))
        check(library.peft_merge_options_set_allow_nonfinite(opts, 1 if allow_nonfinite else 0))
        if quant is not None:
            type_id = quant if isinstance(quant, int) and not isinstance(quant, bool) else \
                library.peft_ggml_type_from_name(encode(str(quant).upper(), "quant"))
            if type_id < 0:
                raise ValueError(f"quant must be a ggml type name such as 'Q8_0' or a type number, not {quant!r}")
            check(library.peft_merge_options_set_quant(opts, type_id))
        if report:
            check(library.peft_merge_options_set_report(opts, 1))
        if arithmetic not in ARITHMETICS:
            raise ValueError(f"arithmetic must be 'peft' or 'ggml', not {arithmetic!r}")
        check(library.peft_merge_options_set_arithmetic(opts, ARITHMETICS[arithmetic]))
        if tied_embeddings not in TIED_EMBEDDINGS:
            raise ValueError(f"tied_embeddings must be 'untie' or 'shared', not {tied_embeddings!r}")
        check(library.peft_merge_options_set_tied_embeddings(opts, TIED_EMBEDDINGS[tied_embeddings]))
        check(library.peft_merge_options_set_join_split(opts, 1 if join_split else 0))
        _set_merge_combine(opts, combine, density, majority_sign_method, seed)
        if progress is not None:
            def trampoline(_user, done, total):
                try:
                    return 1 if progress(done, total) else 0
                except BaseException as exc:  # never unwind into C
                    raised.append(exc)
                    return 1

            callback = PROGRESS_FN(trampoline)  # alive until the merge returns
            check(library.peft_merge_options_set_progress(opts, callback, None))
        out = c_void_p()
        try:
            check(library.peft_merge_checkpoint(fs_path(base_dir), fs_path(out_dir), opts, byref(out)))
        except CancelledError as cancelled:
            if raised:
                raise raised[0] from cancelled
            raise
    return _merge_result(out)


def _set_merge_combine(opts, combine: str, density: Optional[float], majority_sign_method: str,
                       seed: int) -> None:
    """merge_checkpoint's combination of the adapters' deltas on its merge options."""
    from .export import COMBINE_METHODS, _export_options, _set_combination

    if combine not in COMBINE_METHODS:
        raise ValueError("combine must be linear, ties, dare_linear, dare_ties or magnitude_prune, "
                         f"not {combine!r}")
    with _export_options(None, None) as combine_opts:
        _set_combination(combine_opts, density, majority_sign_method, seed)
        check(lib().peft_merge_options_set_combine(opts, COMBINE_METHODS[combine], combine_opts))


def _merge_result(out: c_void_p) -> MergeResult:
    """Reads and frees a peft_merge_result."""
    library = lib()
    result = Owned(out.value, "peft_merge_result_free")
    ptr = result.ptr
    counts = {name: int(library.peft_merge_result_tensor_count(ptr, which))
              for which, name in MERGE_TENSOR_COUNTS}
    return MergeResult(
        merged=counts["MERGED"], replaced=counts["REPLACED"], copied=counts["COPIED"],
        added=counts["ADDED"],
        bytes=int(library.peft_merge_result_bytes(ptr)),
        files=tuple(text(library.peft_merge_result_file_name(ptr, i))
                    for i in range(library.peft_merge_result_file_count(ptr))),
        untied_embeddings=bool(library.peft_merge_result_untied_embeddings(ptr)),
        notes=tuple(text(library.peft_merge_result_note(ptr, i))
                    for i in range(library.peft_merge_result_note_count(ptr))),
        report=tuple(json.loads(text(library.peft_merge_result_report_json(ptr)) or "[]")),
    )


def combine_models(base_dir, models: Sequence[Tuple[Union[str, "os.PathLike[str]"], float]], out_dir, *,
                   method: str = "linear", density: Optional[float] = None, majority_sign_method: str = "total",
                   seed: int = 0, dtype: Optional[DTypeLike] = None, max_shard_size: int = 0,
                   require_config: bool = True, allow_nonfinite: bool = False) -> MergeResult:
    """Whole-model task arithmetic: ``models`` are (folder, weight) pairs of checkpoints fine-tuned from
    ``base_dir``; every float tensor becomes W + combine(weight * (M - W)), written to ``out_dir`` with the
    base's files and layout (``peft_model_combine``).

    ``method`` is "linear" or "ties", "dare_linear", "dare_ties", "magnitude_prune" (PEFT's merge_utils
    arithmetic per tensor, with ``density``, ``majority_sign_method`` and DARE's ``seed`` as for
    ``combine_adapters``). ``dtype``, ``max_shard_size``, ``require_config`` and ``allow_nonfinite`` as
    for ``merge_checkpoint``. ``MergeResult.merged`` counts the combined tensors, ``copied`` the others.

    Raises ``NotFoundError`` naming a base tensor a model lacks, ``ShapeMismatchError``,
    ``UnsupportedError`` (a GGUF or quantized base), ``InvalidArgumentError`` (a missing density, an
    output over an input), ``NonFiniteError``, ``IoError``. Nothing is written on failure.
    """
    from .export import COMBINE_METHODS, _export_options, _set_combination

    if method not in ("linear", "ties", "dare_linear", "dare_ties", "magnitude_prune"):
        raise ValueError("method must be linear, ties, dare_linear, dare_ties or magnitude_prune")
    pairs = [(fs_path(m), finite(w)) for m, w in models]
    if not pairs:
        raise ValueError("combine_models needs at least one model")
    if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, int) or max_shard_size < 0:
        raise ValueError("max_shard_size must be a non-negative int")
    library = lib()
    paths = (c_char_p * len(pairs))(*[p for p, _ in pairs])
    weights = (c_double * len(pairs))(*[w for _, w in pairs])
    out = c_void_p()
    with _export_options(None, None) as combine_opts, \
            c_options("peft_merge_options_new", "peft_merge_options_free") as opts:
        _set_combination(combine_opts, density, majority_sign_method, seed)
        if dtype is not None:
            check(library.peft_merge_options_set_dtype(opts, int(as_dtype(dtype))))
        check(library.peft_merge_options_set_max_shard_size(opts, max_shard_size))
        check(library.peft_merge_options_set_require_config(opts, 1 if require_config else 0))
        check(library.peft_merge_options_set_allow_nonfinite(opts, 1 if allow_nonfinite else 0))
        check(library.peft_model_combine(fs_path(base_dir), paths, weights, len(pairs), COMBINE_METHODS[method],
                                         fs_path(out_dir), combine_opts, opts, byref(out)))
    return _merge_result(out)


# ---- buffers -------------------------------------------------------------------------------------------

def _lora_bias_size(adapter: Adapter, name: str, translator: Optional[Translator]) -> Optional[int]:
    """Elements of the layer's lora_B.bias, or None when the layer named ``name`` cannot be found."""
    candidates = [name]
    if translator is not None:
        for native in (name, name.rstrip("/")):
            with contextlib.suppress(KeyError, ValueError):
                candidates.append(translator.to_hf(native))
    for candidate in list(candidates):
        stripped = candidate.removeprefix("base_model.model.")
        candidates += [stripped, stripped.removesuffix(".weight")]
    for candidate in candidates:
        if candidate in adapter:
            module = adapter.module(candidate)
            roles = {t.role: t for t in module.tensors}
            return roles["lora_B.bias"].numel if "lora_B.bias" in roles else 0
    return None


class MergeRecord:
    """One adapter layer merged into a host buffer; ``remove`` takes it out again."""

    def __init__(self, owned: Owned, weight: Buffer, bias: Optional[Buffer]):
        self._owned = owned
        self._weight = weight
        self._bias = bias

    @property
    def module(self) -> str:
        """The adapter module merged (its HuggingFace path)."""
        return text(lib().peft_merge_record_module(self._owned.ptr))

    @property
    def active(self) -> bool:
        """Whether the merge is still in the buffer."""
        return bool(lib().peft_merge_record_active(self._owned.ptr))

    @property
    def saved_bytes(self) -> int:
        """Bytes of original rows kept for an exact removal."""
        return int(lib().peft_merge_record_saved_bytes(self._owned.ptr))

    def remove(self, weight, bias=None) -> None:
        """Takes the merge out of ``weight`` (and ``bias``), which must have the dtype and shape
        they had at the merge (the memory may have moved)."""
        buffer = buffer_of(weight, self._weight.dtype.name, "weight")
        if (buffer.dtype, buffer.shape, buffer.nbytes) != (self._weight.dtype, self._weight.shape,
                                                           self._weight.nbytes):
            raise ValueError(f"weight must be {self._weight.dtype.name} {list(self._weight.shape)}, "
                             f"as at the merge")
        bias_address = None
        if self._bias is not None:
            if bias is None:
                raise ValueError("this merge changed a bias: pass it to remove()")
            bias_buffer = buffer_of(bias, self._bias.dtype.name, "bias")
            if (bias_buffer.shape, bias_buffer.nbytes) != (self._bias.shape, self._bias.nbytes):
                raise ValueError(f"bias must be {self._bias.dtype.name} {list(self._bias.shape)}")
            bias_address = bias_buffer.address
        check(lib().peft_merge_record_unmerge(self._owned.ptr, buffer.address, bias_address))

    def __repr__(self) -> str:
        return f"<peft_c.MergeRecord {self.module!r} {'active' if self.active else 'removed'}>"


def merge_into(adapter: Adapter, name: str, weight, *, bias=None, dtype: Optional[DTypeLike] = None,
               scale: float = 1.0, keep_original_rows: bool = False,
               translator: Optional[Translator] = None, threads: int = 0) -> MergeRecord:
    """Merges one LoRA layer of ``adapter`` into ``weight`` in place and returns the record that
    removes it again.

    ``weight`` is a writable C-contiguous numpy array (float32, float16, ml_dtypes.bfloat16, or raw
    ``uint16`` with ``dtype="BF16"``) or a contiguous CPU torch tensor, laid out as the base model
    stores it. ``name`` is the layer's HuggingFace module or weight path, or with ``translator`` the
    host's name for it. ``scale`` multiplies the LoRA scaling. With ``keep_original_rows`` the
    removal restores the buffer bit for bit. ``bias`` is needed when the layer has a ``lora_B.bias``.
    """
    buffer = buffer_of(weight, dtype, "weight")
    bias_buffer = None
    if adapter.lora_bias:
        expected = _lora_bias_size(adapter, name, translator)
        if expected is None:
            raise ValueError(f"cannot find the layer {name!r} in the adapter to check its bias")
        if expected:
            if bias is None:
                raise ValueError(f"layer {name!r} has a lora_B.bias: pass its bias buffer")
            bias_buffer = buffer_of(bias, None, "bias")
            if math.prod(bias_buffer.shape) != expected:
                raise ValueError(f"bias of {name!r} must have {expected} elements")
    library = lib()
    with c_options("peft_merge_buffer_options_new", "peft_merge_buffer_options_free") as opts:
        check(library.peft_merge_buffer_options_set_weight(opts, finite(scale)))
        check(library.peft_merge_buffer_options_set_keep_original_rows(opts, 1 if keep_original_rows else 0))
        check(library.peft_merge_buffer_options_set_threads(opts, thread_count(threads)))
        if translator is not None:
            check(library.peft_merge_buffer_options_set_translator(opts, handle_of(translator).ptr))
        shape = (c_uint64 * max(len(buffer.shape), 1))(*buffer.shape)
        out = c_void_p()
        check(library.peft_merge_buffer_apply(
            handle_of(adapter).ptr, encode(name, "layer names"), buffer.address, int(buffer.dtype), shape,
            len(buffer.shape), bias_buffer.address if bias_buffer else None,
            int(bias_buffer.dtype) if bias_buffer else 0, opts, byref(out)))
    return MergeRecord(Owned(out.value, "peft_merge_record_free"), buffer, bias_buffer)


__all__ = ["MERGE_DTYPE_KEEP", "MERGE_TENSOR_COUNTS", "MergeRecord", "MergeResult", "merge_checkpoint",
           "merge_into"]
