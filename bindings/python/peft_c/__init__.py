"""peft_c: read safetensors (and GGUF) checkpoints and PEFT LoRA adapters through the peft_c C library.

A pure-ctypes binding: nothing is compiled at install time. The shared library ``libpeft_c`` is found
through ``PEFT_C_LIB``, pkg-config or the system's library path (see ``peft_c._lib``).

    >>> import peft_c
    >>> with peft_c.Checkpoint.open("adapter_model.safetensors") as ckpt:
    ...     weights = {name: ckpt.read(name) for name in ckpt}

Errors are ``PeftError`` subclasses, one per stable code (``InvalidOffsetError``, ``NotFoundError``, ...),
each with ``.code`` and ``.code_name``.
"""

from __future__ import annotations

from . import _errors
from ._convert import convert
from ._dtypes import DTYPE_COUNT, DTYPES, DType, as_dtype, dtype_bits, has_ml_dtypes, numpy_dtype
from ._errors import ERROR_CLASSES, ERROR_CODES, ErrorCode, PeftError, SafetensorsFormatError
from ._errors import *  # noqa: F401,F403  (one exception class per error code)
from ._lib import ABI_VERSION, LibraryNotFoundError, MissingSymbolError
from ._lib import lib as _library
from ._lib import load as load_library
from .checkpoint import Checkpoint, TensorInfo
from .gguf import GgufValueType, ggml_type_from_name, ggml_type_geometry, ggml_type_name
from .writer import Writer, rewrite, save_checkpoint, save_file
from .adapter import LAYER_KINDS, Adapter, AdapterModule, AdapterTensor, LayerKind, Translator
from .merge import MergeRecord, MergeResult, combine_models, merge_checkpoint, merge_into
from .export import (combine_adapters, export_adapter, export_adapter_gguf, export_adapter_gguf_split,
                     import_adapter_gguf)
from .lowrank import LowRankModule, combine_deltas, convert_initial, convert_to_lora, extract_lora
from .doctor import adapter_doctor, adapter_doctor_fix
from .serve import HostModel, Lease, Registry, RegistryStats, SwapStats, lora_apply
from .hub import hub_cache_dir, hub_resolve
from .control import FORMAT_GGUF, FORMAT_SAFETENSORS, ControlRecord, ControlVector

__version__ = "0.1.0"


def version() -> str:
    """The running library's version string, e.g. "0.1.0"."""
    return _library().peft_version().decode("ascii")


def version_number() -> int:
    """The running library's version as major * 10000 + minor * 100 + patch."""
    return int(_library().peft_version_number())


def abi_version() -> int:
    """The running library's ABI version (equal to ``ABI_VERSION``: loading checks it)."""
    return int(_library().peft_abi_version())


def kernels() -> str:
    """The kernel table the library computes with: "avx512", "avx2" or "portable", chosen once per
    process (the ``PEFT_C_KERNELS`` environment variable can lower it; see ``peft_kernels``)."""
    return _library().peft_kernels().decode("ascii")


def library_path() -> str:
    """Where the loaded library was found (loading it if needed)."""
    return _library().path


__all__ = [
    "ABI_VERSION",
    "Adapter",
    "AdapterModule",
    "AdapterTensor",
    "LAYER_KINDS",
    "LayerKind",
    "LowRankModule",
    "ControlRecord",
    "ControlVector",
    "FORMAT_GGUF",
    "FORMAT_SAFETENSORS",
    "MergeRecord",
    "MergeResult",
    "Translator",
    "Checkpoint",
    "HostModel",
    "Lease",
    "Registry",
    "RegistryStats",
    "SwapStats",
    "DTYPES",
    "DTYPE_COUNT",
    "DType",
    "ERROR_CLASSES",
    "ERROR_CODES",
    "ErrorCode",
    "LibraryNotFoundError",
    "MissingSymbolError",
    "PeftError",
    "SafetensorsFormatError",
    "TensorInfo",
    "Writer",
    "GgufValueType",
    "ggml_type_from_name",
    "ggml_type_geometry",
    "ggml_type_name",
    "abi_version",
    "adapter_doctor",
    "adapter_doctor_fix",
    "as_dtype",
    "combine_adapters",
    "combine_deltas",
    "combine_models",
    "convert_initial",
    "convert_to_lora",
    "convert",
    "dtype_bits",
    "export_adapter",
    "export_adapter_gguf",
    "export_adapter_gguf_split",
    "extract_lora",
    "has_ml_dtypes",
    "hub_cache_dir",
    "hub_resolve",
    "import_adapter_gguf",
    "kernels",
    "library_path",
    "load_library",
    "lora_apply",
    "merge_checkpoint",
    "merge_into",
    "numpy_dtype",
    "rewrite",
    "save_checkpoint",
    "save_file",
    "version",
    "version_number",
] + [cls.__name__ for cls in _errors.ERROR_CLASSES.values()]
