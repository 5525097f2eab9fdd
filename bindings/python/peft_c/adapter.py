"""PEFT LoRA adapters and key translators: ``Adapter``, ``AdapterModule``, ``Translator``.

Both are read-only after creation and may be used from several threads at once. Each keeps its C
handle alive as long as it (or a translator made from an adapter) is referenced; ``close()`` drops the
object's own hold.
"""

from __future__ import annotations

import enum
import json
import math
import os
from ctypes import byref, c_char_p, c_size_t, c_void_p
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from ._dtypes import DType, DTypeLike, as_dtype, dtype_bits, numpy_dtype
from ._handle import HandleObject, Owned, handle_of
from ._helpers import adapter_options, encode, fs_path
from ._lib import check, lib, take_string, take_string_list, text

# Mirrors the PEFT_LAYER_* constants of include/peft_c.h (checked by a test).
LAYER_KINDS: Tuple[Tuple[int, str], ...] = (
    (0, "LINEAR"),
    (1, "CONV1D"),
    (2, "EMBEDDING"),
    (3, "CONV2D"),
    (4, "FULL"),
    (5, "TRAINABLE_TOKENS"),
)
LayerKind = enum.IntEnum("LayerKind", [(name, value) for value, name in LAYER_KINDS])
LayerKind.__doc__ = "Kinds of adapter modules (PEFT_LAYER_*)."
LayerKind.__module__ = "peft_c"

_MISSING = object()


# ---- translators ------------------------------------------------------------------------------------

class Translator(HandleObject):
    """Maps tensor keys between HuggingFace names and a host's slash-separated native names."""

    # Use one of the class methods; the constructor takes the owner of a new handle.

    @classmethod
    def _make(cls, function: str, *args) -> "Translator":
        out = c_void_p()
        check(getattr(lib(), function)(*args, byref(out)))
        return cls(Owned(out.value, "peft_translator_free"))

    @classmethod
    def builtin(cls, family: str) -> "Translator":
        """The built-in table of an architecture family ("llama", "gpt2", ...)."""
        return cls._make("peft_translator_new_builtin", encode(family, "family"))

    @classmethod
    def from_file(cls, path) -> "Translator":
        """The caller's table from a JSON file (docs/translation-tables.md)."""
        return cls._make("peft_translator_from_file", fs_path(path))

    @classmethod
    def from_json(cls, table: Union[str, dict]) -> "Translator":
        """The caller's table as a JSON string or a dict."""
        if not isinstance(table, str):
            table = json.dumps(table)
        return cls._make("peft_translator_from_json", encode(table, "table"))

    @classmethod
    def from_gguf(cls, checkpoint) -> "Translator":
        """A translator for GGUF names from a ``Checkpoint`` opened on one GGUF model file: its
        ``general.architecture`` chooses the table, its attention head counts the RoPE row order.

        ``to_native`` turns "model.layers.0.self_attn.q_proj.weight" into "blk.0.attn_q.weight" (the
        roles weight and bias only) and ``to_hf`` back; given to ``merge_into(..., translator=...)`` or
        ``HostModel.set_translator``, layer names are GGUF tensor names of buffers laid out as a
        llama.cpp-family engine loads them (include/peft_c.h, peft_translator_from_gguf). The
        translator copies what it needs; the checkpoint may be closed afterwards. A file without head
        counts gives a translator whose reordered weights fail (``ShapeMismatchError``) when merged or
        added to a host model.

        Raises ``InvalidArgumentError`` for a checkpoint that is not one GGUF file,
        ``InvalidCheckpointError`` without a string ``general.architecture``, ``UnsupportedError`` when
        no built-in table reads the architecture, ``NotFoundError``/``InvalidConfigError`` when the
        tables cannot be read.
        """
        owned = handle_of(checkpoint)  # held for the call
        return cls._make("peft_translator_from_gguf", owned.ptr)

    @classmethod
    def new_gguf(cls, architecture: str, head_count: int, head_count_kv: int = 0) -> "Translator":
        """A translator for GGUF names from a GGUF architecture ("llama", "qwen2", "gemma2", ...) and
        its attention head counts, for hosts that hold the weights without the file (see
        ``from_gguf``). ``head_count`` is at least 1; ``head_count_kv`` 0 means ``head_count``.

        Raises ``InvalidArgumentError`` for a ``head_count`` of 0, ``UnsupportedError`` when no
        built-in table reads the architecture, ``NotFoundError``/``InvalidConfigError`` when the
        tables cannot be read.
        """
        for name, value in (("head_count", head_count), ("head_count_kv", head_count_kv)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} is an int")
            if not 0 <= value < 2**64:
                raise ValueError(f"{name} {value} is out of range")
        return cls._make("peft_translator_new_gguf", encode(architecture, "architecture"), head_count,
                         head_count_kv)

    @classmethod
    def detect(cls, base_dir=None, model_name: Optional[str] = None) -> "Translator":
        """The built-in table of a base model's family: from its config.json, else its name."""
        base = None if base_dir is None else fs_path(base_dir)
        name = None if model_name is None else encode(model_name, "model_name")
        return cls._make("peft_translator_detect", base, name)

    @staticmethod
    def builtin_families() -> List[str]:
        """The families with a built-in table, sorted."""
        out = c_void_p()
        check(lib().peft_translator_builtin_family_list(byref(out)))
        return take_string_list(out)

    @property
    def family(self) -> str:
        return text(lib().peft_translator_family(self._live().ptr))

    def __repr__(self) -> str:
        return "<peft_c.Translator closed>" if self._owned is None else f"<peft_c.Translator {self.family!r}>"

    def to_native(self, hf_key: str) -> str:
        """One HuggingFace key (with or without "base_model.model.") to its native name."""
        out = c_void_p()
        check(lib().peft_translator_to_native(self._live().ptr, encode(hf_key, "keys"), byref(out)))
        return take_string(out)

    def to_hf(self, native_key: str, *, with_peft_prefix: bool = False) -> str:
        """One native name back to its HuggingFace key (optionally with "base_model.model.")."""
        out = c_void_p()
        check(lib().peft_translator_to_hf(self._live().ptr, encode(native_key, "keys"),
                                          1 if with_peft_prefix else 0, byref(out)))
        return take_string(out)

    def _batch(self, function: str, keys: Sequence[str], *extra) -> List[str]:
        owned = self._live()
        keys = list(keys)
        encoded = (c_char_p * max(len(keys), 1))(*[encode(k, "keys") for k in keys])
        out = (c_void_p * max(len(keys), 1))()
        check(getattr(lib(), function)(owned.ptr, encoded, len(keys), *extra, out))
        return [take_string(c_void_p(out[i])) for i in range(len(keys))]

    def to_native_many(self, hf_keys: Sequence[str]) -> List[str]:
        """Many keys at once; raises ``UnresolvedKeyError`` listing every key that does not resolve."""
        return self._batch("peft_translator_to_native_batch", hf_keys)

    def to_hf_many(self, native_keys: Sequence[str], *, with_peft_prefix: bool = False) -> List[str]:
        """Many native names back at once; raises ``UnresolvedKeyError`` listing every failure."""
        return self._batch("peft_translator_to_hf_batch", native_keys, 1 if with_peft_prefix else 0)


# ---- adapters -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AdapterTensor:
    """One tensor of an adapter module."""

    index: int  #: position within its module
    role: str  #: "lora_A.weight", "lora_B.weight", "lora_magnitude_vector", "weight", ...
    key: str  #: the key in adapter_model.safetensors
    base_name: str  #: the base model tensor it applies to or replaces
    dtype: str
    shape: Tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class AdapterModule:
    """A LoRA layer, or a module with full replacement tensors or trainable tokens."""

    index: int
    name: str  #: transformers module path, without "base_model.model."
    kind: LayerKind
    rank: int  #: 0 for FULL and TRAINABLE_TOKENS modules
    alpha: float
    scaling: float  #: alpha / rank, or alpha / sqrt(rank) with use_rslora
    tensors: Tuple[AdapterTensor, ...]
    token_indices: Optional[Tuple[int, ...]]  #: TRAINABLE_TOKENS only

    def tensor(self, role: Union[str, int]) -> AdapterTensor:
        if isinstance(role, int) and not isinstance(role, bool):
            return self.tensors[role]
        for tensor in self.tensors:
            if tensor.role == role:
                return tensor
        raise KeyError(f"module {self.name!r} has no tensor {role!r} "
                       f"(it has {[t.role for t in self.tensors]})")


class Adapter(HandleObject):
    """A PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors), validated.

    ::

        with peft_c.Adapter.open("my_adapter", base_dir="base_model") as adapter:
            for module in adapter.modules:
                a = adapter.read(module, "lora_A.weight")
    """

    _pickle_hint = "; pickle its path and open it again"

    def __init__(self, owned: Owned, source: str):
        # Use Adapter.open().
        super().__init__(owned)
        self._source = source
        self._modules: Optional[Tuple[AdapterModule, ...]] = None

    @classmethod
    def open(cls, path, *, base_dir=None, translator: Optional[Translator] = None,
             lenient: bool = False) -> "Adapter":
        """Opens and checks an adapter folder; with ``base_dir`` it is also resolved and validated
        against that base model (Conv1D layers, "all-linear", shapes). With ``lenient=True`` it is
        loaded as PEFT's ``PeftModel.from_pretrained`` loads it: what PEFT ignores (unexpected keys,
        missing keys that leave a layer without effect) is dropped and listed in ``warnings``; what
        PEFT refuses stays an error. Strict is the default."""
        encoded = fs_path(path)
        out = c_void_p()
        with adapter_options(base_dir, translator, lenient) as opts:
            check(lib().peft_adapter_open(encoded, opts, byref(out)))
        return cls(Owned(out.value, "peft_adapter_free"), os.fsdecode(encoded))

    def __repr__(self) -> str:
        if self._owned is None:
            return f"<peft_c.Adapter {self._source!r} closed>"
        return f"<peft_c.Adapter {self._source!r} r={self.r} modules={len(self)}>"

    # ---- the config ------------------------------------------------------------------------------

    @property
    def config_json(self) -> str:
        """The config as PEFT writes it (indent 2, sorted keys), unknown fields included."""
        return text(lib().peft_adapter_config_json(self._live().ptr))

    @property
    def config(self) -> Dict[str, Any]:
        return json.loads(self.config_json)

    def config_field(self, name: str, default: Any = _MISSING) -> Any:
        """One field of the config, parsed; ``default`` (else KeyError) when the file has none."""
        raw = lib().peft_adapter_config_field(self._live().ptr, encode(name, "field names"))
        if raw is None:
            if default is _MISSING:
                raise KeyError(name)
            return default
        return json.loads(raw.decode("utf-8"))

    def _scalar(self, function: str):
        return getattr(lib(), function)(self._live().ptr)

    @property
    def r(self) -> int:
        return int(self._scalar("peft_adapter_r"))

    @property
    def lora_alpha(self) -> float:
        return float(self._scalar("peft_adapter_lora_alpha"))

    @property
    def use_rslora(self) -> bool:
        return bool(self._scalar("peft_adapter_use_rslora"))

    @property
    def use_dora(self) -> bool:
        return bool(self._scalar("peft_adapter_use_dora"))

    @property
    def lora_bias(self) -> bool:
        return bool(self._scalar("peft_adapter_lora_bias"))

    @property
    def fan_in_fan_out(self) -> bool:
        return bool(self._scalar("peft_adapter_fan_in_fan_out"))

    @property
    def peft_type(self) -> str:
        return text(self._scalar("peft_adapter_peft_type"))

    @property
    def bias(self) -> str:
        return text(self._scalar("peft_adapter_bias"))

    @property
    def task_type(self) -> Optional[str]:
        return text(self._scalar("peft_adapter_task_type"))

    @property
    def base_model_name_or_path(self) -> Optional[str]:
        return text(self._scalar("peft_adapter_base_model_name_or_path"))

    @property
    def family(self) -> Optional[str]:
        """The architecture family whose table the adapter uses, or None."""
        return text(self._scalar("peft_adapter_family"))

    @property
    def notes(self) -> List[str]:
        """Things worth knowing that are not errors."""
        owned, library = self._live(), lib()
        return [text(library.peft_adapter_note(owned.ptr, i))
                for i in range(library.peft_adapter_note_count(owned.ptr))]

    @property
    def warnings(self) -> List[str]:
        """What lenient loading ignored, one sentence each, starting with ``unexpected key "<key>": ``
        or ``missing key "<key>": ``; empty for an adapter opened strictly."""
        owned, library = self._live(), lib()
        return [text(library.peft_adapter_warning(owned.ptr, i))
                for i in range(library.peft_adapter_warning_count(owned.ptr))]

    def translator(self) -> Translator:
        """A translator over the adapter's architecture table (``NotFoundError`` without one)."""
        out = c_void_p()
        check(lib().peft_adapter_translator(self._live().ptr, byref(out)))
        return Translator(Owned(out.value, "peft_translator_free"))

    def validate(self, base_dir) -> None:
        """Checks every module against a base model folder; raises listing every problem."""
        check(lib().peft_adapter_validate(self._live().ptr, fs_path(base_dir)))

    # ---- modules ---------------------------------------------------------------------------------

    def __len__(self) -> int:
        return lib().peft_adapter_module_count(self._live().ptr)

    @property
    def modules(self) -> Tuple[AdapterModule, ...]:
        """Every module, in the order of its first tensor in the file."""
        owned = self._live()
        if self._modules is None:
            count = lib().peft_adapter_module_count(owned.ptr)
            self._modules = tuple(self._load_module(owned, i) for i in range(count))
        return self._modules

    def __iter__(self) -> Iterator[AdapterModule]:
        return iter(self.modules)

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        try:
            self.module(name)
        except KeyError:
            return False
        return True

    def module(self, key: Union[str, int, AdapterModule]) -> AdapterModule:
        """A module by path (e.g. "model.layers.0.self_attn.q_proj") or index."""
        owned = self._live()
        if isinstance(key, AdapterModule):
            return self.modules[key.index]
        if isinstance(key, str):
            out = c_size_t()
            check(lib().peft_adapter_find_module(owned.ptr, encode(key, "module names"), byref(out)))
            return self.modules[out.value]
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            return self.modules[int(key)]
        raise TypeError(f"a module is named by str or int, not {type(key).__name__}")

    def _load_module(self, owned: Owned, m: int) -> AdapterModule:
        library, ptr = lib(), owned.ptr
        tensors = []
        for t in range(library.peft_adapter_module_tensor_count(ptr, m)):
            ndim = library.peft_adapter_module_tensor_ndim(ptr, m, t)
            shape_ptr = library.peft_adapter_module_tensor_shape(ptr, m, t)
            tensors.append(AdapterTensor(
                index=t,
                role=text(library.peft_adapter_module_tensor_role(ptr, m, t)),
                key=text(library.peft_adapter_module_tensor_key(ptr, m, t)),
                base_name=text(library.peft_adapter_module_tensor_base_name(ptr, m, t)),
                dtype=DType(library.peft_adapter_module_tensor_dtype(ptr, m, t)).name,
                shape=tuple(int(shape_ptr[i]) for i in range(ndim)) if ndim else (),
            ))
        count = c_size_t()
        indices_ptr = library.peft_adapter_module_token_indices(ptr, m, byref(count))
        indices = tuple(int(indices_ptr[i]) for i in range(count.value)) if indices_ptr else None
        return AdapterModule(
            index=m,
            name=text(library.peft_adapter_module_name(ptr, m)),
            kind=LayerKind(library.peft_adapter_module_kind(ptr, m)),
            rank=int(library.peft_adapter_module_rank(ptr, m)),
            alpha=float(library.peft_adapter_module_alpha(ptr, m)),
            scaling=float(library.peft_adapter_module_scaling(ptr, m)),
            tensors=tuple(tensors),
            token_indices=indices,
        )

    def read(self, module: Union[str, int, AdapterModule], tensor: Union[str, int] = 0,
             dtype: Optional[DTypeLike] = "F32") -> np.ndarray:
        """A module's tensor (by role or index) as a new array converted to ``dtype`` (None: its own)."""
        owned = self._live()
        mod = self.module(module)
        info = mod.tensor(tensor)
        target = as_dtype(info.dtype if dtype is None else dtype)
        total_bits = info.numel * dtype_bits(target)
        np_dtype = numpy_dtype(target)
        out = np.empty(total_bits // 8, np.uint8) if np_dtype is None else np.empty(info.shape, np_dtype)
        check(lib().peft_adapter_module_tensor_read(owned.ptr, mod.index, info.index, int(target),
                                                    out.ctypes.data_as(c_void_p), total_bits // 8))
        return out

    def state_dict(self, dtype: Optional[DTypeLike] = "F32") -> Dict[str, np.ndarray]:
        """Every tensor by its key in adapter_model.safetensors."""
        return {t.key: self.read(m, t.index, dtype) for m in self.modules for t in m.tensors}


__all__ = ["Adapter", "AdapterModule", "AdapterTensor", "LayerKind", "LAYER_KINDS", "Translator"]
