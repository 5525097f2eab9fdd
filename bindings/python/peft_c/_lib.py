"""Finding, loading and declaring the peft_c shared library (ctypes, no compiler needed).

The library is looked up, in order, at:

1. the path in the environment variable ``PEFT_C_LIB`` (a file, or a folder holding the library);
2. the package's own ``lib`` folder (``peft_c/lib``), where the wheel built by ``pip install`` puts it;
3. the ``libdir`` that ``pkg-config --variable=libdir peft_c`` reports;
4. whatever ``ctypes.util.find_library("peft_c")`` finds (the system's library path).

It is loaded on first use, so importing the package never fails for want of the library.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import sys
import threading
from ctypes import POINTER, byref, c_char_p, c_double, c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p
from typing import List, Optional

from ._errors import PeftError, error_from_code

#: The ABI this binding was written against (PEFT_ABI_VERSION of include/peft_c.h).
ABI_VERSION = 1

_err = c_void_p  # peft_error*: an opaque pointer (None when NULL)
_handle = c_void_p

#: The C callback type ``peft_tensor_source_fn``.
SOURCE_FN = ctypes.CFUNCTYPE(c_int32, c_void_p, c_uint64, c_void_p, c_uint64)
#: The C callback type ``peft_progress_fn``.
PROGRESS_FN = ctypes.CFUNCTYPE(c_int32, c_void_p, c_uint64, c_uint64)


class RegistryStatsStruct(ctypes.Structure):
    """``struct peft_registry_stats`` (the caller sets ``size``)."""

    _fields_ = [("size", c_uint64), ("budget_bytes", c_uint64), ("loaded_bytes", c_uint64),
                ("peak_loaded_bytes", c_uint64), ("registered", c_uint64), ("loaded", c_uint64),
                ("pinned", c_uint64), ("loads", c_uint64), ("hits", c_uint64), ("evictions", c_uint64)]


class SwapStatsStruct(ctypes.Structure):
    """``struct peft_swap_stats`` (the caller sets ``size``)."""

    _fields_ = [("size", c_uint64), ("remove_seconds", ctypes.c_double), ("merge_seconds", ctypes.c_double),
                ("layers_removed", c_uint64), ("layers_merged", c_uint64), ("saved_bytes", c_uint64)]

# name -> (restype, argtypes). Every function of include/peft_c.h that the binding calls.
PROTOTYPES = {
    # versions
    "peft_version": (c_char_p, []),
    "peft_version_number": (c_uint32, []),
    "peft_abi_version": (c_uint32, []),
    "peft_kernels": (c_char_p, []),
    # errors
    "peft_error_code": (c_int32, [_err]),
    "peft_error_message": (c_char_p, [_err]),
    "peft_error_free": (None, [_err]),
    "peft_error_code_name": (c_char_p, [c_int32]),
    # dtypes
    "peft_dtype_name": (c_char_p, [c_int32]),
    "peft_dtype_from_name": (c_int32, [c_char_p]),
    "peft_dtype_bits": (c_uint32, [c_int32]),
    "peft_convert": (_err, [c_int32, c_void_p, c_int32, c_void_p, c_uint64]),
    # reading
    "peft_open_options_new": (_err, [POINTER(c_void_p)]),
    "peft_open_options_free": (None, [_handle]),
    "peft_open_options_set_max_header_size": (_err, [_handle, c_uint64]),
    "peft_open_options_set_use_pread": (_err, [_handle, c_int32]),
    "peft_checkpoint_open": (_err, [c_char_p, _handle, POINTER(c_void_p)]),
    "peft_checkpoint_open_memory": (_err, [c_void_p, c_size_t, _handle, POINTER(c_void_p)]),
    "peft_checkpoint_free": (None, [_handle]),
    "peft_checkpoint_file_count": (c_size_t, [_handle]),
    "peft_checkpoint_file_path": (c_char_p, [_handle, c_size_t]),
    "peft_checkpoint_has_metadata": (c_int32, [_handle, c_size_t]),
    "peft_checkpoint_metadata_count": (c_size_t, [_handle, c_size_t]),
    "peft_checkpoint_metadata_key": (c_char_p, [_handle, c_size_t, c_size_t]),
    "peft_checkpoint_metadata_value": (c_char_p, [_handle, c_size_t, c_size_t]),
    "peft_checkpoint_index_metadata_json": (c_char_p, [_handle]),
    "peft_checkpoint_tensor_count": (c_size_t, [_handle]),
    "peft_checkpoint_find": (_err, [_handle, c_char_p, POINTER(c_size_t)]),
    "peft_checkpoint_find_n": (_err, [_handle, c_char_p, c_size_t, POINTER(c_size_t)]),
    # a void pointer, not c_char_p: names may hold NUL bytes, read with their length
    "peft_checkpoint_tensor_name": (c_void_p, [_handle, c_size_t]),
    "peft_checkpoint_tensor_name_length": (c_size_t, [_handle, c_size_t]),
    "peft_checkpoint_tensor_dtype": (c_int32, [_handle, c_size_t]),
    "peft_checkpoint_tensor_ndim": (c_size_t, [_handle, c_size_t]),
    "peft_checkpoint_tensor_shape": (POINTER(c_uint64), [_handle, c_size_t]),
    "peft_checkpoint_tensor_offsets": (_err, [_handle, c_size_t, POINTER(c_uint64), POINTER(c_uint64)]),
    "peft_checkpoint_tensor_file": (c_size_t, [_handle, c_size_t]),
    "peft_checkpoint_tensor_view": (_err, [_handle, c_size_t, POINTER(c_void_p), POINTER(c_uint64)]),
    "peft_checkpoint_tensor_read": (_err, [_handle, c_size_t, c_int32, c_void_p, c_uint64]),
    # writing
    "peft_writer_new": (_err, [c_char_p, POINTER(c_void_p)]),
    "peft_writer_new_checkpoint": (_err, [c_char_p, c_uint64, POINTER(c_void_p)]),
    "peft_writer_free": (None, [_handle]),
    "peft_writer_add_tensor": (_err, [_handle, c_char_p, c_int32, POINTER(c_uint64), c_size_t]),
    "peft_writer_set_metadata_present": (_err, [_handle, c_int32]),
    "peft_writer_set_metadata": (_err, [_handle, c_char_p, c_char_p]),
    "peft_writer_break_shard": (_err, [_handle]),
    "peft_writer_set_index_metadata_json": (_err, [_handle, c_char_p]),
    "peft_writer_start": (_err, [_handle]),
    "peft_writer_tensor_count": (c_size_t, [_handle]),
    "peft_writer_tensor_name": (c_char_p, [_handle, c_size_t]),
    "peft_writer_tensor_declaration": (c_size_t, [_handle, c_size_t]),
    "peft_writer_file_count": (c_size_t, [_handle]),
    "peft_writer_file_path": (c_char_p, [_handle, c_size_t]),
    "peft_writer_begin_tensor": (_err, [_handle, c_char_p, c_int32]),
    "peft_writer_write": (_err, [_handle, c_void_p, c_uint64]),
    "peft_writer_write_tensor": (_err, [_handle, c_char_p, c_int32, c_void_p, c_uint64]),
    "peft_writer_write_from_callback": (_err, [_handle, c_char_p, c_int32, SOURCE_FN, c_void_p]),
    "peft_writer_write_from_checkpoint": (_err, [_handle, c_char_p, _handle, c_size_t]),
    "peft_writer_finish": (_err, [_handle]),
    # adapters and translators (strings returned through char** are c_void_p: freed by the library)
    "peft_string_free": (None, [c_void_p]),
    "peft_string_list_count": (c_size_t, [_handle]),
    "peft_string_list_get": (c_char_p, [_handle, c_size_t]),
    "peft_string_list_free": (None, [_handle]),
    "peft_adapter_options_new": (_err, [POINTER(c_void_p)]),
    "peft_adapter_options_free": (None, [_handle]),
    "peft_adapter_options_set_base_dir": (_err, [_handle, c_char_p]),
    "peft_adapter_options_set_translator": (_err, [_handle, _handle]),
    "peft_adapter_open": (_err, [c_char_p, _handle, POINTER(c_void_p)]),
    "peft_adapter_free": (None, [_handle]),
    "peft_adapter_validate": (_err, [_handle, c_char_p]),
    "peft_adapter_config_json": (c_char_p, [_handle]),
    "peft_adapter_config_field": (c_char_p, [_handle, c_char_p]),
    "peft_adapter_r": (ctypes.c_int64, [_handle]),
    "peft_adapter_lora_alpha": (ctypes.c_double, [_handle]),
    "peft_adapter_use_rslora": (c_int32, [_handle]),
    "peft_adapter_use_dora": (c_int32, [_handle]),
    "peft_adapter_lora_bias": (c_int32, [_handle]),
    "peft_adapter_fan_in_fan_out": (c_int32, [_handle]),
    "peft_adapter_peft_type": (c_char_p, [_handle]),
    "peft_adapter_bias": (c_char_p, [_handle]),
    "peft_adapter_task_type": (c_char_p, [_handle]),
    "peft_adapter_base_model_name_or_path": (c_char_p, [_handle]),
    "peft_adapter_family": (c_char_p, [_handle]),
    "peft_adapter_translator": (_err, [_handle, POINTER(c_void_p)]),
    "peft_adapter_note_count": (c_size_t, [_handle]),
    "peft_adapter_note": (c_char_p, [_handle, c_size_t]),
    "peft_adapter_module_count": (c_size_t, [_handle]),
    "peft_adapter_find_module": (_err, [_handle, c_char_p, POINTER(c_size_t)]),
    "peft_adapter_module_name": (c_char_p, [_handle, c_size_t]),
    "peft_adapter_module_kind": (c_int32, [_handle, c_size_t]),
    "peft_adapter_module_rank": (ctypes.c_int64, [_handle, c_size_t]),
    "peft_adapter_module_alpha": (ctypes.c_double, [_handle, c_size_t]),
    "peft_adapter_module_scaling": (ctypes.c_double, [_handle, c_size_t]),
    "peft_adapter_module_tensor_count": (c_size_t, [_handle, c_size_t]),
    "peft_adapter_module_tensor_role": (c_char_p, [_handle, c_size_t, c_size_t]),
    "peft_adapter_module_tensor_key": (c_char_p, [_handle, c_size_t, c_size_t]),
    "peft_adapter_module_tensor_base_name": (c_char_p, [_handle, c_size_t, c_size_t]),
    "peft_adapter_module_tensor_dtype": (c_int32, [_handle, c_size_t, c_size_t]),
    "peft_adapter_module_tensor_ndim": (c_size_t, [_handle, c_size_t, c_size_t]),
    "peft_adapter_module_tensor_shape": (POINTER(c_uint64), [_handle, c_size_t, c_size_t]),
    "peft_adapter_module_tensor_read": (_err, [_handle, c_size_t, c_size_t, c_int32, c_void_p, c_uint64]),
    "peft_adapter_module_token_indices": (POINTER(ctypes.c_int64), [_handle, c_size_t, POINTER(c_size_t)]),
    "peft_translator_new_builtin": (_err, [c_char_p, POINTER(c_void_p)]),
    "peft_translator_from_file": (_err, [c_char_p, POINTER(c_void_p)]),
    "peft_translator_from_json": (_err, [c_char_p, POINTER(c_void_p)]),
    "peft_translator_detect": (_err, [c_char_p, c_char_p, POINTER(c_void_p)]),
    "peft_translator_builtin_family_list": (_err, [POINTER(c_void_p)]),
    "peft_translator_from_gguf": (_err, [_handle, POINTER(c_void_p)]),
    "peft_translator_new_gguf": (_err, [c_char_p, c_uint64, c_uint64, POINTER(c_void_p)]),
    "peft_translator_free": (None, [_handle]),
    "peft_translator_family": (c_char_p, [_handle]),
    "peft_translator_to_native": (_err, [_handle, c_char_p, POINTER(c_void_p)]),
    "peft_translator_to_hf": (_err, [_handle, c_char_p, c_int32, POINTER(c_void_p)]),
    "peft_translator_to_native_batch": (_err, [_handle, POINTER(c_char_p), c_size_t, POINTER(c_void_p)]),
    "peft_translator_to_hf_batch": (_err, [_handle, POINTER(c_char_p), c_size_t, c_int32,
                                           POINTER(c_void_p)]),
    # merging
    "peft_merge_options_new": (_err, [POINTER(c_void_p)]),
    "peft_merge_options_free": (None, [_handle]),
    "peft_merge_options_add_adapter": (_err, [_handle, _handle, ctypes.c_double]),
    "peft_merge_options_add_adapter_dir": (_err, [_handle, c_char_p, ctypes.c_double]),
    "peft_merge_options_set_dtype": (_err, [_handle, c_int32]),
    "peft_merge_options_set_max_shard_size": (_err, [_handle, c_uint64]),
    "peft_merge_options_set_threads": (_err, [_handle, c_uint32]),
    "peft_merge_options_set_progress": (_err, [_handle, PROGRESS_FN, c_void_p]),
    "peft_merge_options_set_require_config": (_err, [_handle, c_int32]),
    "peft_merge_options_set_allow_nonfinite": (_err, [_handle, c_int32]),
    "peft_merge_checkpoint": (_err, [c_char_p, c_char_p, _handle, POINTER(c_void_p)]),
    "peft_merge_result_free": (None, [_handle]),
    "peft_merge_result_tensor_count": (c_uint64, [_handle, c_int32]),
    "peft_merge_result_bytes": (c_uint64, [_handle]),
    "peft_merge_result_file_count": (c_size_t, [_handle]),
    "peft_merge_result_file_name": (c_char_p, [_handle, c_size_t]),
    "peft_merge_result_untied_embeddings": (c_int32, [_handle]),
    "peft_merge_result_note_count": (c_size_t, [_handle]),
    "peft_merge_result_note": (c_char_p, [_handle, c_size_t]),
    "peft_merge_buffer_options_new": (_err, [POINTER(c_void_p)]),
    "peft_merge_buffer_options_free": (None, [_handle]),
    "peft_merge_buffer_options_set_weight": (_err, [_handle, ctypes.c_double]),
    "peft_merge_buffer_options_set_keep_original_rows": (_err, [_handle, c_int32]),
    "peft_merge_buffer_options_set_threads": (_err, [_handle, c_uint32]),
    "peft_merge_buffer_options_set_translator": (_err, [_handle, _handle]),
    "peft_merge_buffer_apply": (_err, [_handle, c_char_p, c_void_p, c_int32, POINTER(c_uint64), c_size_t,
                                       c_void_p, c_int32, _handle, POINTER(c_void_p)]),
    "peft_merge_record_unmerge": (_err, [_handle, c_void_p, c_void_p]),
    "peft_merge_record_free": (None, [_handle]),
    "peft_merge_record_module": (c_char_p, [_handle]),
    "peft_merge_record_active": (c_int32, [_handle]),
    "peft_merge_record_saved_bytes": (c_uint64, [_handle]),
    # exporting and combining adapters
    "peft_export_options_new": (_err, [POINTER(c_void_p)]),
    "peft_export_options_free": (None, [_handle]),
    "peft_export_options_set_dtype": (_err, [_handle, c_int32]),
    "peft_export_options_set_peft_version": (_err, [_handle, c_char_p]),
    "peft_export_options_set_combine_density": (_err, [_handle, c_double]),
    "peft_export_options_set_combine_majority_sign": (_err, [_handle, c_int32]),
    "peft_export_options_set_combine_seed": (_err, [_handle, c_uint64]),
    "peft_export_options_set_combine_svd_rank": (_err, [_handle, c_int64]),
    "peft_export_options_set_combine_svd_clamp": (_err, [_handle, c_double]),
    "peft_model_combine": (_err, [c_char_p, POINTER(c_char_p), POINTER(ctypes.c_double), c_size_t, c_int32, c_char_p,
                                  _handle, _handle, POINTER(c_void_p)]),
    "peft_adapter_combine_deltas": (_err, [POINTER(c_void_p), POINTER(ctypes.c_double), c_size_t, c_int32, c_char_p,
                                           _handle, _handle, POINTER(c_void_p)]),
    "peft_adapter_export": (_err, [_handle, c_char_p, _handle]),
    "peft_adapter_combine": (_err, [POINTER(c_void_p), POINTER(ctypes.c_double), c_size_t, c_int32, c_char_p,
                                    _handle]),
    "peft_adapter_export_gguf": (_err, [_handle, c_char_p, c_char_p, c_int32]),
    "peft_adapter_export_gguf_split": (_err, [_handle, c_char_p, c_char_p, c_int32, c_char_p]),
    "peft_adapter_import_gguf": (_err, [c_char_p, c_char_p, c_char_p]),
    # serving: registry, leases, unmerged apply, host models
    "peft_registry_new": (_err, [c_int32, c_uint64, _handle, POINTER(c_void_p)]),
    "peft_registry_free": (None, [_handle]),
    "peft_registry_register": (_err, [_handle, c_char_p, c_char_p, _handle]),
    "peft_registry_register_memory": (_err, [_handle, c_char_p, c_char_p, c_void_p, c_size_t, _handle]),
    "peft_registry_unregister": (_err, [_handle, c_char_p]),
    "peft_registry_name_list": (_err, [_handle, POINTER(c_void_p)]),
    "peft_registry_warning_list": (_err, [_handle, c_char_p, POINTER(c_void_p)]),
    "peft_registry_acquire": (_err, [_handle, c_char_p, POINTER(c_void_p)]),
    "peft_registry_trim": (_err, [_handle]),
    "peft_registry_set_budget": (_err, [_handle, c_uint64]),
    "peft_registry_get_stats": (_err, [_handle, POINTER(RegistryStatsStruct)]),
    "peft_lease_free": (None, [_handle]),
    "peft_lease_name": (c_char_p, [_handle]),
    "peft_lease_version": (c_uint64, [_handle]),
    "peft_lease_bytes": (c_uint64, [_handle]),
    "peft_lease_has_module": (c_int32, [_handle, c_char_p]),
    # row_lease is a void pointer: an int32 array's address, or None
    "peft_lora_apply": (_err, [c_char_p, POINTER(c_void_p), c_size_t, c_void_p, c_void_p, c_int32, c_uint64,
                               c_uint64, c_void_p, c_int32, c_uint64]),
    "peft_host_model_new": (_err, [POINTER(c_void_p)]),
    "peft_host_model_free": (None, [_handle]),
    "peft_host_model_set_translator": (_err, [_handle, _handle]),
    "peft_host_model_set_exact": (_err, [_handle, c_int32]),
    "peft_host_model_add_weight": (_err, [_handle, c_char_p, c_void_p, c_int32, POINTER(c_uint64), c_size_t,
                                          c_void_p, c_int32, c_uint64]),
    "peft_host_model_swap": (_err, [_handle, _handle, ctypes.c_double, POINTER(SwapStatsStruct)]),
    "peft_host_model_current": (c_char_p, [_handle]),
    "peft_registry_set_base_weight": (_err, [_handle, c_char_p, c_void_p, c_int32, POINTER(c_uint64), c_size_t,
                                             c_void_p, c_int32, c_uint64]),
    "peft_registry_base_weights_changed": (_err, [_handle]),
    # the hub cache
    "peft_hub_resolve": (_err, [c_char_p, POINTER(c_void_p)]),
    "peft_hub_cache_dir": (_err, [POINTER(c_void_p)]),
    "peft_adapter_options_set_lenient": (_err, [_handle, c_int32]),
    "peft_adapter_warning_count": (c_size_t, [_handle]),
    "peft_adapter_warning": (c_char_p, [_handle, c_size_t]),
    # the adapter doctor
    "peft_adapter_doctor": (_err, [c_char_p, c_char_p, POINTER(c_void_p)]),
    "peft_adapter_doctor_fix": (_err, [c_char_p, c_char_p, c_char_p, POINTER(c_void_p)]),
    # GGUF files
    "peft_checkpoint_file_format": (c_int32, [_handle, c_size_t]),
    "peft_checkpoint_gguf_version": (c_uint32, [_handle, c_size_t]),
    "peft_checkpoint_tensor_ggml_type": (c_int32, [_handle, c_size_t]),
    "peft_ggml_type_name": (c_char_p, [c_int32]),
    "peft_ggml_type_from_name": (c_int32, [c_char_p]),
    "peft_ggml_type_geometry": (_err, [c_int32, POINTER(c_uint32), POINTER(c_uint32)]),
    "peft_checkpoint_gguf_kv_count": (c_size_t, [_handle, c_size_t]),
    "peft_checkpoint_gguf_kv_key": (c_char_p, [_handle, c_size_t, c_size_t]),
    "peft_checkpoint_gguf_kv_find": (_err, [_handle, c_size_t, c_char_p, POINTER(c_size_t)]),
    "peft_checkpoint_gguf_kv_type": (c_int32, [_handle, c_size_t, c_size_t]),
    "peft_checkpoint_gguf_kv_array_type": (c_int32, [_handle, c_size_t, c_size_t]),
    "peft_checkpoint_gguf_kv_array_length": (c_uint64, [_handle, c_size_t, c_size_t]),
    "peft_checkpoint_gguf_kv_int": (_err, [_handle, c_size_t, c_size_t, c_uint64, POINTER(ctypes.c_int64)]),
    "peft_checkpoint_gguf_kv_uint": (_err, [_handle, c_size_t, c_size_t, c_uint64, POINTER(c_uint64)]),
    "peft_checkpoint_gguf_kv_float": (_err, [_handle, c_size_t, c_size_t, c_uint64, POINTER(ctypes.c_double)]),
    # a void pointer, not c_char_p: strings may hold NUL bytes, read with their length
    "peft_checkpoint_gguf_kv_string": (_err, [_handle, c_size_t, c_size_t, c_uint64, POINTER(c_void_p),
                                              POINTER(c_size_t)]),
    "peft_merge_options_set_quant": (_err, [_handle, c_int32]),
    "peft_merge_options_set_report": (_err, [_handle, c_int32]),
    "peft_merge_result_report_json": (c_char_p, [_handle]),
    "peft_merge_options_set_arithmetic": (_err, [_handle, c_int32]),
    "peft_merge_options_set_tied_embeddings": (_err, [_handle, c_int32]),
    "peft_merge_options_set_join_split": (_err, [_handle, c_int32]),
    "peft_merge_options_set_combine": (_err, [_handle, c_int32, _handle]),
    "peft_lowrank_options_new": (_err, [POINTER(c_void_p)]),
    "peft_lowrank_options_free": (None, [_handle]),
    "peft_lowrank_options_set_rank": (_err, [_handle, ctypes.c_int64]),
    "peft_lowrank_options_set_energy": (_err, [_handle, ctypes.c_double]),
    "peft_lowrank_options_set_svd": (_err, [_handle, c_int32]),
    "peft_lowrank_options_set_threads": (_err, [_handle, c_uint32]),
    "peft_lowrank_options_set_dtype": (_err, [_handle, c_int32]),
    "peft_lowrank_options_set_modules": (_err, [_handle, POINTER(c_char_p), c_size_t]),
    "peft_lowrank_options_set_base": (_err, [_handle, c_char_p]),
    "peft_lowrank_report_module_count": (c_size_t, [_handle]),
    "peft_lowrank_report_module_name": (c_char_p, [_handle, c_size_t]),
    "peft_lowrank_report_module_rank": (ctypes.c_int64, [_handle, c_size_t]),
    "peft_lowrank_report_module_error": (ctypes.c_double, [_handle, c_size_t]),
    "peft_lowrank_report_free": (None, [_handle]),
    "peft_adapter_extract": (_err, [c_char_p, c_char_p, c_char_p, _handle, POINTER(c_void_p)]),
    "peft_adapter_convert_to_lora": (_err, [_handle, c_char_p, _handle, POINTER(c_void_p)]),
    "peft_adapter_convert_initial": (_err, [c_char_p, c_char_p, c_char_p, _handle]),
    # control vectors
    "peft_control_vector_open": (_err, [c_char_p, POINTER(c_void_p)]),
    "peft_control_vector_new": (_err, [c_uint64, c_char_p, POINTER(c_void_p)]),
    "peft_control_vector_free": (None, [_handle]),
    "peft_control_vector_n_embd": (c_uint64, [_handle]),
    "peft_control_vector_model_hint": (c_char_p, [_handle]),
    "peft_control_vector_layer_count": (c_size_t, [_handle]),
    "peft_control_vector_layer": (c_int64, [_handle, c_size_t]),
    "peft_control_vector_direction": (c_void_p, [_handle, c_int64]),
    "peft_control_vector_set_direction": (_err, [_handle, c_int64, c_int32, c_void_p]),
    "peft_control_vector_add": (_err, [_handle, _handle, c_double]),
    "peft_control_vector_save": (_err, [_handle, c_char_p, c_int32]),
    "peft_control_vector_apply": (_err, [_handle, c_int64, c_double, c_void_p, c_int32, c_uint64,
                                         POINTER(c_void_p)]),
    "peft_control_record_remove": (_err, [_handle, c_void_p]),
    "peft_control_record_free": (None, [_handle]),
}

SIZE_MAX = ctypes.c_size_t(-1).value


class LibraryNotFoundError(OSError):
    """The peft_c shared library could not be found or loaded."""


class MissingSymbolError(AttributeError):
    """The loaded library does not export a function this binding needs (it is older than the binding)."""


class _Library:
    """The loaded library: ``lib.peft_xxx`` is the declared ctypes function."""

    def __init__(self, cdll: ctypes.CDLL, path: str):
        self._cdll = cdll
        self.path = path
        for name, (restype, argtypes) in PROTOTYPES.items():
            try:
                fn = getattr(cdll, name)
            except AttributeError:
                continue
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)

    def __getattr__(self, name: str):
        # Only reached for names not set in __init__: functions the library lacks.
        if name.startswith("peft_"):
            raise MissingSymbolError(
                f"{self.path} does not export {name}; the library is older than this binding")
        raise AttributeError(name)

    def has(self, name: str) -> bool:
        return name in self.__dict__


_lock = threading.Lock()
_loaded: Optional[_Library] = None

_LIB_NAMES = {
    "darwin": [f"libpeft_c.{ABI_VERSION}.dylib", "libpeft_c.dylib"],
    "win32": ["peft_c.dll", "libpeft_c.dll"],
}
_DEFAULT_NAMES = [f"libpeft_c.so.{ABI_VERSION}", "libpeft_c.so"]
#: Where a wheel built from this package holds the library (and, next to it, bin/peftc and share/peft_c).
PACKAGE_LIB_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib")


def _names() -> List[str]:
    return _LIB_NAMES.get(sys.platform, _DEFAULT_NAMES)


def _in_folder(folder: str) -> Optional[str]:
    for name in _names():
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate):
            return candidate
    return None


def _pkg_config_libdir() -> Optional[str]:
    exe = shutil.which("pkg-config")
    if exe is None:
        return None
    try:
        done = subprocess.run([exe, "--variable=libdir", "peft_c"], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    libdir = done.stdout.strip()
    return libdir if done.returncode == 0 and libdir else None


def candidates() -> List[str]:
    """The places tried, in order (for error messages and diagnostics)."""
    found: List[str] = []
    env = os.environ.get("PEFT_C_LIB")
    if env:
        if os.path.isdir(env):
            found.append(_in_folder(env) or os.path.join(env, _names()[0]))
        else:
            found.append(env)
        return found  # an explicit choice is never silently overridden
    bundled = _in_folder(PACKAGE_LIB_DIR)
    if bundled:
        found.append(bundled)
    libdir = _pkg_config_libdir()
    if libdir:
        path = _in_folder(libdir)
        if path:
            found.append(path)
    name = ctypes.util.find_library("peft_c")
    if name:
        found.append(name)
    return found


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", c_char_p), ("dli_fbase", c_void_p),
                ("dli_sname", c_char_p), ("dli_saddr", c_void_p)]


def _loaded_path(cdll: ctypes.CDLL, name: str) -> str:
    """The file the loader really opened (a bare name from find_library says little), via dladdr."""
    if os.sep in name or sys.platform == "win32":
        return name
    try:
        libc = ctypes.CDLL(None)
        dladdr = libc.dladdr
    except (OSError, AttributeError):
        return name
    dladdr.argtypes = [c_void_p, POINTER(_DlInfo)]
    dladdr.restype = ctypes.c_int
    info = _DlInfo()
    address = ctypes.cast(cdll.peft_version, c_void_p)
    if dladdr(address, byref(info)) and info.dli_fname:
        return os.fsdecode(info.dli_fname)
    return name


def load(path: Optional[str] = None) -> _Library:
    """Loads the library (once) and checks that its ABI is the one this binding speaks.

    ``path`` overrides the lookup; it is only honoured before the library was first loaded.
    """
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        tried = [path] if path else candidates()
        if not tried:
            raise LibraryNotFoundError(
                "libpeft_c not found: set PEFT_C_LIB to its path, install it where pkg-config "
                "(peft_c.pc) or the system's library path finds it")
        errors = []
        for candidate in tried:
            try:
                cdll = ctypes.CDLL(candidate)
            except OSError as exc:
                errors.append(f"{candidate}: {exc}")
                continue
            lib = _Library(cdll, _loaded_path(cdll, candidate))
            abi = lib.peft_abi_version()
            if abi != ABI_VERSION:
                raise LibraryNotFoundError(
                    f"{candidate} has ABI version {abi}, but this binding needs {ABI_VERSION}")
            _loaded = lib
            return lib
        raise LibraryNotFoundError("could not load libpeft_c: " + "; ".join(errors))


def lib() -> _Library:
    """The loaded library (loading it on first use)."""
    return _loaded if _loaded is not None else load()


def check(err) -> None:
    """Turns a returned ``peft_error*`` into an exception (and frees it); does nothing for NULL."""
    if not err:
        return
    library = lib()
    try:
        code = library.peft_error_code(err)
        raw = library.peft_error_message(err)
        message = raw.decode("utf-8", "replace") if raw else ""
        name = library.peft_error_code_name(code)
        name = name.decode("ascii", "replace") if name else None
    finally:
        library.peft_error_free(err)
    raise error_from_code(code, message, name)


def take_string(pointer: c_void_p) -> str:
    """A string the library returned through ``char**``: decoded, then released with peft_string_free."""
    if not pointer.value:
        return ""
    try:
        return ctypes.string_at(pointer.value).decode("utf-8", "surrogateescape")
    finally:
        lib().peft_string_free(pointer.value)


def take_string_list(pointer: c_void_p) -> List[str]:
    """A list the library returned through ``peft_string_list**``: its strings decoded, then the list
    released with peft_string_list_free."""
    library = lib()
    try:
        return [text(library.peft_string_list_get(pointer, i))
                for i in range(library.peft_string_list_count(pointer))]
    finally:
        library.peft_string_list_free(pointer)


def text(raw: Optional[bytes]) -> Optional[str]:
    """A borrowed UTF-8 string from the library, decoded (None stays None)."""
    return None if raw is None else raw.decode("utf-8", "surrogateescape")


__all__ = ["ABI_VERSION", "LibraryNotFoundError", "MissingSymbolError", "PeftError", "check", "lib",
           "load", "candidates", "text"]
