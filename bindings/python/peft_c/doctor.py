"""The adapter doctor: ``adapter_doctor`` checks an adapter folder against a base model folder without
merging (and without the strict loader, so it also reads adapters ``Adapter.open`` refuses);
``adapter_doctor_fix`` also writes a copy with every known rename applied. Both return the report as a
dict (schema 1, docs/doctor.md): ``report["summary"]["ok"]``, ``report["problems"]`` (each with a
stable ``kind``), ``report["modules"]``, ``report["renames"]``, ``report["config_changes"]``.
"""

from __future__ import annotations

import json
from ctypes import byref, c_void_p

from ._helpers import fs_path
from ._lib import check, lib, take_string


def adapter_doctor(adapter_dir, base_dir=None) -> dict:
    """The doctor's report on ``adapter_dir`` (against ``base_dir`` when given). Problems are in the
    report; errors (a missing folder, an unreadable config) raise ``PeftError``."""
    out = c_void_p()
    base = fs_path(base_dir, "base_dir") if base_dir is not None else None
    check(lib().peft_adapter_doctor(fs_path(adapter_dir, "adapter_dir"), base, byref(out)))
    return json.loads(take_string(out))


def adapter_doctor_fix(adapter_dir, out_dir, base_dir=None) -> dict:
    """Writes ``out_dir``: ``adapter_dir`` with every rename the doctor knows applied. Returns the report
    on ``adapter_dir`` (run ``adapter_doctor(out_dir, base_dir)`` to see what remains)."""
    out = c_void_p()
    base = fs_path(base_dir, "base_dir") if base_dir is not None else None
    check(lib().peft_adapter_doctor_fix(fs_path(adapter_dir, "adapter_dir"), base, fs_path(out_dir, "out_dir"),
                                        byref(out)))
    return json.loads(take_string(out))
