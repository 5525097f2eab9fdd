"""Translator.from_gguf / Translator.new_gguf (GGUF tensor names) and export_adapter_gguf_split (the
fixture adapter against the fixture base, and its argument errors)."""

from __future__ import annotations

import pytest

import peft_c
from peft_c_test_support import FIXTURES

SAMPLE = FIXTURES / "gguf" / "bindings_sample.gguf"
ADAPTER = FIXTURES / "adapters" / "llama_lora"
BASE = FIXTURES / "models" / "llama"


def check_gguf_names(translator):
    assert translator.family == "llama"
    assert translator.to_native("model.layers.0.self_attn.q_proj.weight") == "blk.0.attn_q.weight"
    assert (translator.to_hf("blk.0.attn_q.weight", with_peft_prefix=True)
            == "base_model.model.model.layers.0.self_attn.q_proj.weight")
    # Adapter factor keys are not GGUF tensor names.
    with pytest.raises(peft_c.UnresolvedKeyError):
        translator.to_native("model.layers.0.self_attn.q_proj.lora_A.weight")


def test_from_gguf():
    # The sample has general.architecture "llama" and no head counts: the names still translate.
    with peft_c.Checkpoint.open(SAMPLE) as ckpt:
        translator = peft_c.Translator.from_gguf(ckpt)
    with translator:  # the checkpoint is closed; the translator copied what it needs
        check_gguf_names(translator)


def test_new_gguf():
    with peft_c.Translator.new_gguf("llama", 4, 2) as translator:
        check_gguf_names(translator)


def test_gguf_translator_bad_input():
    with pytest.raises(peft_c.InvalidArgumentError) as caught:
        peft_c.Translator.new_gguf("llama", 0, 2)
    assert caught.value.code == peft_c.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(peft_c.UnsupportedError):
        peft_c.Translator.new_gguf("nosucharch", 4, 2)
    with pytest.raises(ValueError):
        peft_c.Translator.new_gguf("llama", -1)
    with pytest.raises(TypeError):
        peft_c.Translator.new_gguf("llama", 4.0)
    with peft_c.Checkpoint.open(BASE) as ckpt:  # safetensors, not a GGUF file
        with pytest.raises(peft_c.InvalidArgumentError):
            peft_c.Translator.from_gguf(ckpt)
    with pytest.raises(ValueError):
        peft_c.Translator.from_gguf(ckpt)  # closed


@pytest.fixture
def adapter():
    if not (ADAPTER / "adapter_config.json").exists() or not (BASE / "config.json").exists():
        pytest.skip("fixture adapters and models not generated (run tests/fixtures/generate.py)")
    with peft_c.Adapter.open(ADAPTER) as a:
        yield a


def test_export_split(adapter, tmp_path):
    out, base_out = tmp_path / "out.gguf", tmp_path / "base_out"
    peft_c.export_adapter_gguf_split(adapter, out, base_out, base=BASE)
    with peft_c.Checkpoint.open(out) as ckpt:
        assert ckpt.file_format() == "gguf"
        assert len(ckpt.keys()) == 2 * len(adapter)
    # Nothing in the plain adapter needs merging: the base is copied as it is.
    assert (base_out / "model.safetensors").read_bytes() == (BASE / "model.safetensors").read_bytes()


def test_export_split_bad_input(adapter, tmp_path):
    out = tmp_path / "out.gguf"
    with pytest.raises(peft_c.InvalidArgumentError) as caught:
        peft_c.export_adapter_gguf_split(adapter, out, BASE, base=BASE)
    assert caught.value.code == peft_c.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.export_adapter_gguf_split(adapter, out, out, base=BASE)
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.export_adapter_gguf_split(adapter, out, tmp_path / "base_out", base=BASE, ggml_type="Q4_K")
    assert list(tmp_path.iterdir()) == []
