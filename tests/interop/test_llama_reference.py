"""The llama.cpp reference harness (gguf_reference.py) works, and what its references say.

The tiny fixture models are converted with llama.cpp's convert_hf_to_gguf.py (F32 and F16), a PEFT LoRA
adapter with convert_lora_to_gguf.py, merged with llama-export-lora and quantized with llama-quantize; every
result is read back with gguf-py's GGUFReader and checked against the safetensors / PEFT tensors it came
from, so these tests also pin down the facts a GGUF writer must reproduce: names, ne = reversed PyTorch
shape, the LLaMA Q/K row permutation (also of the LoRA B), Gemma's norm + 1, 1-D tensors kept in F32.

Skipped (with the reason) when PEFT_LLAMA_CPP_BIN is not set; scripts/test.sh sets it.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
from safetensors.numpy import load_file

from gguf_reference import (convert_hf_to_gguf, convert_lora_to_gguf, export_lora, ggml_reads, gguf_module,
                            quantize, read_gguf)

MODELS = ("llama", "qwen2", "gemma", "phi3")

# HF tensor name (without "model.layers.N.") -> GGUF name (without "blk.N.").
BLOCK_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.qkv_proj.weight": "attn_qkv.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.gate_up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
GGML_FILE_TYPE = {"f32": 0, "f16": 1}


def gguf_name(hf_name: str) -> str:
    if hf_name in TOP_NAMES:
        return TOP_NAMES[hf_name]
    model, layers, layer, rest = hf_name.split(".", 3)
    assert (model, layers) == ("model", "layers"), hf_name
    return f"blk.{layer}.{BLOCK_NAMES[rest]}"


def rope_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """LLaMA's Q/K row order in GGUF: within each head, interleaved rotary pairs become two halves."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def to_gguf_values(arch: str, config: dict, hf_name: str, w: np.ndarray) -> np.ndarray:
    """What the converter does to a tensor's values (independent of its type)."""
    if arch == "llama" and hf_name.endswith("self_attn.q_proj.weight"):
        return rope_permute(w, config["num_attention_heads"])
    if arch == "llama" and hf_name.endswith("self_attn.k_proj.weight"):
        return rope_permute(w, config["num_key_value_heads"])
    if arch == "gemma" and hf_name.endswith("norm.weight"):
        return w + np.float32(1)  # Gemma's RMSNorm multiplies by (1 + weight); llama.cpp's by weight
    return w


def kv(reader, key: str):
    field = reader.fields.get(key)
    assert field is not None, f"no {key} in the file"
    return field.contents()


def tensors(reader) -> dict:
    return {t.name: t for t in reader.tensors}


def model_dir(fixtures_dir: pathlib.Path, name: str) -> pathlib.Path:
    folder = fixtures_dir / "models" / name
    if not (folder / "model.safetensors").exists():
        pytest.skip(f"{folder} not generated (run tests/fixtures/generate.py --only models)")
    return folder


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("arch", MODELS)
def test_convert_hf_model(fixtures_dir, arch, outtype):
    folder = model_dir(fixtures_dir, arch)
    config = json.loads((folder / "config.json").read_text())
    hf = load_file(folder / "model.safetensors")
    reader = read_gguf(convert_hf_to_gguf(folder, outtype=outtype))
    gguf = gguf_module()
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]

    assert kv(reader, "general.architecture") == arch
    assert kv(reader, "general.type") == "model"
    assert kv(reader, "general.file_type") == GGML_FILE_TYPE[outtype]
    assert kv(reader, f"{arch}.block_count") == config["num_hidden_layers"]
    assert kv(reader, f"{arch}.embedding_length") == hidden
    assert kv(reader, f"{arch}.attention.head_count_kv") == config["num_key_value_heads"]
    assert len(kv(reader, "tokenizer.ggml.tokens")) == vocab

    found = tensors(reader)
    expected = {gguf_name(name): name for name in hf}
    assert sorted(found) == sorted(expected), "tensor names differ from the HF checkpoint's, mapped"
    assert list(found["token_embd.weight"].shape) == [hidden, vocab]
    if arch == "phi3":
        n_qkv = (config["num_attention_heads"] + 2 * config["num_key_value_heads"]) * head_dim
        assert list(found["blk.0.attn_qkv.weight"].shape) == [hidden, n_qkv]
    else:
        assert list(found["blk.0.attn_q.weight"].shape) == [hidden, config["num_attention_heads"] * head_dim]
        assert list(found["blk.0.attn_k.weight"].shape) == [hidden, config["num_key_value_heads"] * head_dim]
    assert ("output.weight" in found) == (not config.get("tie_word_embeddings", False))

    for name, hf_name in expected.items():
        t, w = found[name], hf[hf_name]
        assert list(t.shape) == list(reversed(w.shape)), f"{name}: ne is not the reversed PyTorch shape"
        want_type = "F32" if outtype == "f32" or w.ndim == 1 else "F16"
        assert t.tensor_type == gguf.GGMLQuantizationType[want_type], f"{name}: {t.tensor_type.name}"
        values = to_gguf_values(arch, config, hf_name, w).astype(np.float32 if want_type == "F32" else np.float16)
        data = np.asarray(t.data).reshape(w.shape)
        assert data.dtype == values.dtype and np.array_equal(data, values), f"{name}: values differ"


def lora_pairs(adapter: dict) -> dict:
    """HF module name (as in the base checkpoint, without .weight) -> (A, B) of a PEFT adapter file."""
    pairs = {}
    for key, value in adapter.items():
        module, which = key.removeprefix("base_model.model.").rsplit(".lora_", 1)
        pairs.setdefault(module, {})[which.split(".")[0]] = value
    return {module: (ab["A"], ab["B"]) for module, ab in pairs.items()}


def test_convert_lora_adapter(fixtures_dir):
    base = model_dir(fixtures_dir, "llama")
    folder = fixtures_dir / "adapters" / "llama_lora"
    config = json.loads((base / "config.json").read_text())
    lora_config = json.loads((folder / "adapter_config.json").read_text())
    pairs = lora_pairs(load_file(folder / "adapter_model.safetensors"))
    reader = read_gguf(convert_lora_to_gguf(folder, base))
    gguf = gguf_module()
    r = lora_config["r"]

    assert kv(reader, "general.architecture") == "llama"
    assert kv(reader, "general.type") == "adapter"
    assert kv(reader, "adapter.type") == "lora"
    assert kv(reader, "adapter.lora.alpha") == pytest.approx(lora_config["lora_alpha"])

    found = tensors(reader)
    expected = {f"{gguf_name(module + '.weight')}.lora_{ab}" for module in pairs for ab in "ab"}
    assert sorted(found) == sorted(expected)
    assert len(found) == 2 * 7 * config["num_hidden_layers"]
    for module, (a, b) in pairs.items():
        name = gguf_name(module + ".weight")
        ta, tb = found[name + ".lora_a"], found[name + ".lora_b"]
        out_features, in_features = b.shape[0], a.shape[1]
        assert list(ta.shape) == [in_features, r] and list(tb.shape) == [r, out_features], name
        assert ta.tensor_type == tb.tensor_type == gguf.GGMLQuantizationType.F32
        assert np.array_equal(np.asarray(ta.data).reshape(a.shape), a), f"{name}: lora_a is not PEFT's A"
        want_b = to_gguf_values("llama", config, module + ".weight", b)
        assert np.array_equal(np.asarray(tb.data).reshape(b.shape), want_b), f"{name}: lora_b"
        if module.endswith(("q_proj", "k_proj")):  # the permutation is not the identity on these
            assert not np.array_equal(want_b, b), name


@pytest.mark.parametrize("adapters", [
    [("llama_lora", 1.0)],
    [("llama_layers_to_transform", 1.0)],
    [("llama_lora", 1.0), ("llama_lora_second", -0.5)],
], ids=["one", "some_layers", "two_scaled"])
def test_export_lora_merges_like_peft(fixtures_dir, adapters):
    """llama-export-lora's merge equals PEFT's W + scale * alpha / r * B @ A, converted like the base:
    targeted tensors change, all others are copied byte for byte."""
    base = model_dir(fixtures_dir, "llama")
    config = json.loads((base / "config.json").read_text())
    hf = load_file(base / "model.safetensors")
    base_gguf = convert_hf_to_gguf(base, outtype="f32")

    expected = {name: w.astype(np.float64) for name, w in hf.items()}
    targeted = set()
    converted = []
    for adapter_name, scale in adapters:
        folder = fixtures_dir / "adapters" / adapter_name
        lora_config = json.loads((folder / "adapter_config.json").read_text())
        for module, (a, b) in lora_pairs(load_file(folder / "adapter_model.safetensors")).items():
            factor = scale * lora_config["lora_alpha"] / lora_config["r"]
            expected[module + ".weight"] += factor * (b.astype(np.float64) @ a.astype(np.float64))
            targeted.add(gguf_name(module + ".weight"))
        converted.append((convert_lora_to_gguf(folder, base), scale))
    merged = tensors(read_gguf(export_lora(base_gguf, converted)))
    original = tensors(read_gguf(base_gguf))

    assert list(merged) == sorted(original)  # the tool writes the tensors in name order
    assert targeted and targeted < set(merged)
    for name, t in merged.items():
        before = original[name]
        assert list(t.shape) == list(before.shape) and t.tensor_type == before.tensor_type, name
        if name in targeted:
            hf_name = next(k for k in hf if gguf_name(k) == name)
            want = to_gguf_values("llama", config, hf_name, expected[hf_name])
            got = np.asarray(t.data).reshape(want.shape)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
            assert np.abs(got - np.asarray(before.data).reshape(want.shape)).max() > 1e-3, name
        else:
            assert bytes(t.data) == bytes(before.data), f"{name} is not targeted but changed"


def test_quantize_q8_0_matches_gguf_py(fixtures_dir):
    """llama-quantize Q8_0: tensors whose rows are whole 32-blocks become Q8_0, bit-identical to gguf-py's
    reference quantizer; other 2-D tensors fall back to F16 (rounded to nearest), 1-D ones stay F32."""
    base = model_dir(fixtures_dir, "llama")
    f32_path = convert_hf_to_gguf(base, outtype="f32")
    f32 = tensors(read_gguf(f32_path))
    q8_reader = read_gguf(quantize(f32_path, type="Q8_0"))
    q8 = tensors(q8_reader)
    gguf = gguf_module()
    types = gguf.GGMLQuantizationType

    assert kv(q8_reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_Q8_0
    assert sorted(q8) == sorted(f32)
    assert any(t.tensor_type == types.Q8_0 for t in q8.values()), "no tensor was quantized to Q8_0"
    for name, t in q8.items():
        source = np.asarray(f32[name].data, dtype=np.float32)
        assert list(t.shape) == list(f32[name].shape), name
        if len(t.shape) == 1:
            assert t.tensor_type == types.F32 and bytes(t.data) == source.tobytes(), name
        elif int(t.shape[0]) % 32 == 0:
            assert t.tensor_type == types.Q8_0, name
            reference = gguf.quants.quantize(source, types.Q8_0)
            assert bytes(t.data) == reference.tobytes(), f"{name}: Q8_0 bytes differ from gguf-py's"
            restored = gguf.quants.dequantize(np.asarray(t.data), types.Q8_0).reshape(source.shape)
            assert np.abs(restored - source).max() <= np.abs(source).max() / 127, name
        else:
            assert t.tensor_type == types.F16, name
            assert np.array_equal(np.asarray(t.data), source.astype(np.float16)), name


def test_ggml_reader_accepts_converted_and_refuses_truncated(fixtures_dir, tmp_path):
    path = convert_hf_to_gguf(model_dir(fixtures_dir, "llama"), outtype="f32")
    accepted, output = ggml_reads(path)
    assert accepted, output
    assert f"n_tensors: {len(read_gguf(path).tensors)}" in output
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[:-100])
    accepted, output = ggml_reads(truncated)
    assert not accepted and "failed to read tensor data" in output, output
