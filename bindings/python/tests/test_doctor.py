"""adapter_doctor / adapter_doctor_fix: the report as a dict, a renamed adapter found and fixed, errors."""

from __future__ import annotations

import json

import pytest

import peft_c
from peft_c_test_support import FIXTURES

ADAPTER = FIXTURES / "adapters" / "llama_lora"
BASE = FIXTURES / "models" / "llama"
if not (ADAPTER / "adapter_config.json").exists():
    pytest.skip("fixture adapters not generated", allow_module_level=True)


def test_clean_adapter():
    report = peft_c.adapter_doctor(ADAPTER, BASE)
    assert report["summary"]["ok"] is True and report["problems"] == []
    assert report["summary"]["matched_modules"] == report["summary"]["modules"] == 14
    q = next(m for m in report["modules"] if m["module"] == "model.layers.0.self_attn.q_proj")
    assert q["base_tensor"] == "model.layers.0.self_attn.q_proj.weight" and q["rank"] == 4


def test_missing_prefix_found_and_fixed(tmp_path):
    from safetensors.numpy import load_file, save_file

    broken = tmp_path / "broken"
    broken.mkdir()
    tensors = load_file(str(ADAPTER / "adapter_model.safetensors"))
    save_file({k[len("base_model.model."):]: v for k, v in tensors.items()}, str(broken / "adapter_model.safetensors"))
    (broken / "adapter_config.json").write_text((ADAPTER / "adapter_config.json").read_text())
    report = peft_c.adapter_doctor(broken, BASE)
    assert report["summary"]["ok"] is False
    assert [p["kind"] for p in report["problems"]] == ["missing_peft_prefix"]
    fixed = tmp_path / "fixed"
    assert peft_c.adapter_doctor_fix(broken, fixed, BASE) == report
    assert peft_c.adapter_doctor(fixed, BASE)["summary"]["ok"] is True
    assert sorted(load_file(str(fixed / "adapter_model.safetensors"))) == sorted(tensors)
    assert json.loads((fixed / "adapter_config.json").read_text()) == json.loads((ADAPTER / "adapter_config.json").read_text())


def test_errors(tmp_path):
    with pytest.raises(peft_c.NotFoundError):
        peft_c.adapter_doctor(tmp_path / "absent")
    with pytest.raises(peft_c.NotFoundError):
        peft_c.adapter_doctor_fix(tmp_path / "absent", tmp_path / "out")
    assert not (tmp_path / "out").exists()
