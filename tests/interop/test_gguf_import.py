"""GGUF LoRA adapters to PEFT folders (`peftc adapter export IN.gguf OUT --format peft --base BASE`).

- The imported folder loads in PEFT with no missing or unexpected adapter keys, and PEFT's
  merge_and_unload() of it, converted by convert_hf_to_gguf.py, equals llama-export-lora's merge of the
  GGUF adapter into convert_hf_to_gguf.py's F32 base (peft_c's own GGUF export of plain, rsLoRA and
  rank/alpha-pattern adapters, and convert_lora_to_gguf.py's output).
- PEFT -> GGUF -> PEFT merges to the original's merge.
- A GGUF file that is not an adapter is refused.

Skipped (with the reason) when PEFT_LLAMA_CPP_BIN is not set; scripts/test.sh sets it.
"""

from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pytest
import torch

from gguf_reference import convert_hf_to_gguf, convert_lora_to_gguf, export_lora, peft_merged_gguf
from merge_support import load_model, peft_merged
from test_gguf_lora import ADAPTERS, MODELS, export_gguf, relative_error, run_peftc, tensors

OURS = [("llama", "llama_lora"), ("llama", "llama_rslora"), ("llama", "llama_rank_alpha_pattern")]
CONVERTED = [("llama", "llama_lora"), ("qwen2", "qwen2_lora")]


def import_gguf(peftc, adapter_gguf: pathlib.Path, model: str, out: pathlib.Path) -> pathlib.Path:
    run_peftc(peftc, "adapter", "export", adapter_gguf, out, "--format", "peft", "--base", MODELS / model)
    return out


def check_loads_cleanly(model: str, folder: pathlib.Path) -> None:
    from peft import PeftModel
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = PeftModel.from_pretrained(load_model(MODELS / model, None), str(folder))
    result = set_peft_model_state_dict(peft_model, load_file(str(folder / "adapter_model.safetensors")))
    assert not result.unexpected_keys
    assert not [k for k in result.missing_keys if "lora_" in k]


def gguf_of_peft_merge(model: str, folder: pathlib.Path, out: pathlib.Path) -> dict:
    return tensors(peft_merged_gguf(MODELS / model, [(folder, 1.0)], out))


def assert_imported_merge_equals_llama_cpp(peftc, tmp_path, model, adapter_gguf):
    folder = import_gguf(peftc, adapter_gguf, model, tmp_path / "imported")
    check_loads_cleanly(model, folder)
    base_gguf = convert_hf_to_gguf(MODELS / model, outtype="f32")
    got = tensors(export_lora(base_gguf, [(adapter_gguf, 1.0)], tmp_path / "llama_merged.gguf"))
    reference = gguf_of_peft_merge(model, folder, tmp_path / "peft_merged")
    base = tensors(base_gguf)
    assert got.keys() == reference.keys()
    changed = 0
    for name, (kind, ne, want) in reference.items():
        assert got[name][:2] == (kind, ne), name
        assert relative_error(want, got[name][2]) <= 1e-6, name
        changed += not np.array_equal(base[name][2], want)
    assert changed > 0


@pytest.mark.parametrize("model,adapter", OURS, ids=[a for _, a in OURS])
def test_import_of_our_export(peftc_binary, tmp_path, model, adapter):
    ours = export_gguf(peftc_binary, adapter, MODELS / model, tmp_path / "adapter.gguf")
    assert_imported_merge_equals_llama_cpp(peftc_binary, tmp_path, model, ours)


@pytest.mark.parametrize("model,adapter", CONVERTED, ids=[a for _, a in CONVERTED])
def test_import_of_convert_lora_to_gguf(peftc_binary, tmp_path, model, adapter):
    theirs = convert_lora_to_gguf(ADAPTERS / adapter, MODELS / model, tmp_path / "adapter.gguf", outtype="f32")
    assert_imported_merge_equals_llama_cpp(peftc_binary, tmp_path, model, theirs)


@pytest.mark.parametrize("model,adapter", OURS, ids=[a for _, a in OURS])
def test_round_trip_merges_as_the_original(peftc_binary, tmp_path, model, adapter):
    ours = export_gguf(peftc_binary, adapter, MODELS / model, tmp_path / "adapter.gguf")
    folder = import_gguf(peftc_binary, ours, model, tmp_path / "imported")
    want = peft_merged(MODELS / model, [(ADAPTERS / adapter, 1.0)]).state_dict()
    got = peft_merged(MODELS / model, [(folder, 1.0)]).state_dict()
    assert got.keys() == want.keys()
    for name, value in want.items():
        assert relative_error(got[name].to(torch.float64).numpy(), value.to(torch.float64).numpy()) <= 1e-6, name


def test_non_adapter_gguf_is_refused(peftc_binary, tmp_path):
    base_gguf = convert_hf_to_gguf(MODELS / "llama", outtype="f32")
    proc = run_peftc(peftc_binary, "adapter", "export", base_gguf, tmp_path / "out", "--format", "peft",
                     "--base", MODELS / "llama", expect=1)
    assert "INVALID_ARGUMENT" in proc.stderr and "not a GGUF adapter" in proc.stderr
    assert not (tmp_path / "out" / "adapter_config.json").exists()
