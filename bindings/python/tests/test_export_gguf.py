"""export_adapter_gguf and import_adapter_gguf: the fixture adapter exported to a GGUF LoRA adapter against
the fixture base (tests/fixtures/models/llama), read back as a GGUF checkpoint, and imported back to a
PEFT adapter folder; and the errors for bad input."""

from __future__ import annotations

import numpy as np
import pytest

import peft_c
from peft_c_test_support import FIXTURES

ADAPTER = FIXTURES / "adapters" / "llama_lora"
BASE = FIXTURES / "models" / "llama"
if not (ADAPTER / "adapter_config.json").exists() or not (BASE / "config.json").exists():
    pytest.skip("fixture adapters and models not generated (run tests/fixtures/generate.py)",
                allow_module_level=True)


@pytest.fixture
def adapter():
    with peft_c.Adapter.open(ADAPTER) as a:
        yield a


@pytest.mark.parametrize("ggml_type", ["F32", "F16", "BF16", 30])
def test_round_trip(adapter, tmp_path, ggml_type):
    out = tmp_path / "adapter.gguf"
    peft_c.export_adapter_gguf(adapter, out, base=BASE, ggml_type=ggml_type)
    type_name = ggml_type if isinstance(ggml_type, str) else peft_c.ggml_type_name(ggml_type)
    with peft_c.Checkpoint.open(out) as ckpt:
        assert ckpt.file_format() == "gguf"
        meta = ckpt.gguf_metadata()
        assert meta["general.architecture"] == "llama"
        assert meta["general.type"] == "adapter"
        assert meta["adapter.type"] == "lora"
        assert meta["adapter.lora.alpha"] == adapter.lora_alpha
        assert ckpt.gguf_type("adapter.lora.alpha") == (peft_c.GgufValueType.F32, None)
        names = ckpt.keys()
        assert len(names) == 2 * len(adapter)
        stems = {n.removesuffix(".weight.lora_a").removesuffix(".weight.lora_b") for n in names}
        assert len(stems) == len(adapter)
        assert all(s.startswith("blk.") for s in stems)
        assert {f"{s}.weight.lora_{f}" for s in stems for f in "ab"} == set(names)
        assert {ckpt.tensor(n).ggml_type for n in names} == {type_name}
        # v_proj's factors need no reordering and no rescaling: the GGUF pair holds PEFT's A and B.
        v = adapter.module("model.layers.1.self_attn.v_proj")
        for role, factor in (("lora_A.weight", "lora_a"), ("lora_B.weight", "lora_b")):
            want = adapter.read(v, role)
            got = ckpt.read(f"blk.1.attn_v.weight.{factor}")
            assert got.shape == want.shape
            if type_name == "F32":
                np.testing.assert_array_equal(got, want)

    back = tmp_path / "peft" / "nested"
    peft_c.import_adapter_gguf(out, back, base=BASE)
    with peft_c.Adapter.open(back) as imported:
        assert len(imported) == len(adapter)
        assert sorted(m.name for m in imported) == sorted(m.name for m in adapter)
        assert (imported.r, imported.lora_alpha) == (adapter.r, adapter.lora_alpha)
        assert imported.base_model_name_or_path == str(BASE)
        if type_name == "F32":
            for module in adapter:
                for role in ("lora_A.weight", "lora_B.weight"):
                    np.testing.assert_array_equal(imported.read(module.name, role), adapter.read(module, role))


def test_bad_input(adapter, tmp_path):
    out = tmp_path / "out.gguf"
    empty = tmp_path / "empty_base"
    empty.mkdir()
    # A base folder without config.json has no architecture.
    with pytest.raises(peft_c.InvalidConfigError) as caught:
        peft_c.export_adapter_gguf(adapter, out, base=empty)
    assert caught.value.code == peft_c.ErrorCode.INVALID_CONFIG
    # A type other than F32, F16, BF16 and Q8_0.
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.export_adapter_gguf(adapter, out, base=BASE, ggml_type="Q4_K")
    with pytest.raises(ValueError):
        peft_c.export_adapter_gguf(adapter, out, base=BASE, ggml_type="F8")  # not a ggml type name
    with pytest.raises(TypeError):
        peft_c.export_adapter_gguf(adapter, out, base=BASE, ggml_type=1.0)
    assert not out.exists()

    peft_c.export_adapter_gguf(adapter, out, base=BASE)
    back = tmp_path / "peft"
    # The base is required.
    with pytest.raises(peft_c.InvalidArgumentError) as caught:
        peft_c.import_adapter_gguf(out, back, base="")
    assert caught.value.code == peft_c.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(TypeError):
        peft_c.import_adapter_gguf(out, back)  # base is a required keyword
    # A GGUF file that is not an adapter.
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.import_adapter_gguf(FIXTURES / "gguf" / "bindings_sample.gguf", back, base=BASE)
    with pytest.raises(peft_c.IoError):
        peft_c.import_adapter_gguf(tmp_path / "absent.gguf", back, base=BASE)
    assert not back.exists()
