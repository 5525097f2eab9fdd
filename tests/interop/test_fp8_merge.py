"""`peftc merge` into an FP8 block-scale base (quant_method "fp8", transformers' FineGrainedFP8).

The base is a tiny llama whose decoder Linear weights are quantized here, by a numpy model of the
rule (peft_c.h, docs/quantized-bases.md), to F8_E4M3 with F32 `weight_scale_inv` in 16x16 blocks;
its shapes (40, 56, 20) are not multiples of 16, so edge blocks are partial, and one block is all
zero. Embeddings, norms and lm_head (modules_to_not_convert) stay bf16, and config.json carries
FineGrainedFP8Config's own to_dict(). The LoRA adapter targets FP8 modules and the bf16 lm_head; its
factors are small dyadic numbers, so PEFT's f32 delta (get_delta_weight) is exact whatever the
summation order, and the expected bytes are a pure function of the rule:

* keep: untargeted tensors and config.json byte for byte; targeted FP8 weights and their scales are
  exactly quantize(dequantize(base) + PEFT's delta) of the numpy model; lm_head is
  bf16(f32(W) + delta); the merged values are within half an e4m3 ulp at their block scale of the
  exact (f64) merge; transformers loads the output (dequantizing on CPU) with those values;
* the numpy model itself agrees byte for byte with transformers' Fp8Quantize;
* --dtype bf16: every FP8 weight dequantized (targeted with the delta), no scales, config.json
  without quantization_config and with dtype bfloat16; transformers loads it with equal values;
* bases quantized by GPTQ, AWQ, HQQ, compressed-tensors and FP8 variants peft_c does not handle
  are UNSUPPORTED, naming the method and what is supported.

Environment: PEFTC (the peftc binary).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import warnings

import ml_dtypes
import numpy as np
import pytest
import torch

from merge_support import file_tensors, run_merge

BLOCK = 16
FP8_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TARGETS = ["q_proj", "v_proj", "down_proj", "lm_head"]
E4M3 = ml_dtypes.float8_e4m3fn


# --- the numpy model of the rule ------------------------------------------------------------------

def quantize_blocks(w: np.ndarray, block=(BLOCK, BLOCK)):
    """transformers' Fp8Quantize per block: s = 448 / amax as torch computes it, (1 / amax) * 448 in
    f32 (1 for amax 0 or when it overflows), scale_inv = 1 / s, q = e4m3(clip(w * s, -448, 448))
    rounded to nearest even."""
    w = w.astype(np.float32)
    rows, cols = w.shape
    sr, sc = -(-rows // block[0]), -(-cols // block[1])
    q = np.zeros((rows, cols), dtype=np.uint8)
    scale_inv = np.zeros((sr, sc), dtype=np.float32)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]]
            assert np.isfinite(blk).all()
            amax = np.abs(blk).max()
            with np.errstate(over="ignore", divide="ignore"):
                s = (np.float32(1.0) / amax) * np.float32(448.0) if amax > 0 else np.float32(1.0)
            if not np.isfinite(s):
                s = np.float32(1.0)
            scale_inv[i, j] = np.float32(1.0) / s
            scaled = np.clip(blk * s, np.float32(-448.0), np.float32(448.0)).astype(np.float32)
            q[i * block[0]:(i + 1) * block[0], j * block[1]:(j + 1) * block[1]] = scaled.astype(E4M3).view(np.uint8)
    return q, scale_inv


def expand(scale_inv: np.ndarray, shape, block=(BLOCK, BLOCK)) -> np.ndarray:
    return np.repeat(np.repeat(scale_inv, block[0], axis=0), block[1], axis=1)[:shape[0], :shape[1]]


def dequantize_blocks(q: np.ndarray, scale_inv: np.ndarray, block=(BLOCK, BLOCK)) -> np.ndarray:
    return q.view(E4M3).astype(np.float32) * expand(scale_inv, q.shape, block)


def half_ulp_bound(exact: np.ndarray, scale_inv: np.ndarray) -> np.ndarray:
    """Half an e4m3 ulp at the block scale, per element: in e4m3 units x = |v| / scale_inv, the
    spacing is 2^(floor(log2 x) - 3) for x >= 2^-6 and 2^-9 below (subnormals)."""
    scale = expand(scale_inv, exact.shape).astype(np.float64)
    x = np.abs(exact) / scale
    with np.errstate(divide="ignore"):
        e = np.floor(np.log2(np.maximum(x, 2.0 ** -7)))
    half = np.where(x < 2.0 ** -6, 2.0 ** -10, 2.0 ** (e - 4))
    return half * scale


# --- the fixture: base, adapter, PEFT's deltas ----------------------------------------------------

def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=40, intermediate_size=56, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=20, max_position_embeddings=32,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.layers[0].self_attn.q_proj.weight[:BLOCK, :BLOCK] = 0  # an all-zero block
    return model


def fp8_config_dict(block) -> dict:
    from transformers.utils.quantization_config import FineGrainedFP8Config

    return FineGrainedFP8Config(weight_block_size=block, modules_to_not_convert=["lm_head"]).to_dict()


def write_fp8_base(state: dict, config, folder: pathlib.Path, block=(BLOCK, BLOCK)) -> dict:
    """The FP8 checkpoint of a model's state dict and config; returns {weight name: (q, scale_inv)}
    of the quantized weights."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    tensors, quantized = {}, {}
    for name, value in state.items():
        module = name.rsplit(".", 2)[-2] if name.endswith(".weight") else ""
        if module in FP8_MODULES:
            q, s = quantize_blocks(value.numpy(), block)
            quantized[name] = (q, s)
            tensors[name] = torch.from_numpy(q).view(torch.float8_e4m3fn)
            tensors[name[:-len("weight")] + "weight_scale_inv"] = torch.from_numpy(s)
        else:
            tensors[name] = value.to(torch.bfloat16)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = config.to_dict()
    config["dtype"] = "bfloat16"
    config["quantization_config"] = fp8_config_dict(block)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return quantized


def write_adapter(model, folder: pathlib.Path) -> dict:
    """A LoRA on `model` with dyadic factors (k/64 and m/128, |k|, |m| <= 4, rank 4, scaling 2):
    every product and sum of PEFT's f32 delta is exact. Returns {base weight name: delta (f32)}."""
    from peft import LoraConfig, get_peft_model
    from peft.tuners.lora import LoraLayer

    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS))
    g = torch.Generator().manual_seed(1)
    deltas = {}
    with torch.no_grad():
        for name, module in peft_model.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            a, b = module.lora_A["default"].weight, module.lora_B["default"].weight
            a.copy_(torch.randint(-4, 5, a.shape, generator=g).float() / 64)
            b.copy_(torch.randint(-4, 5, b.shape, generator=g).float() / 128)
            if name.endswith("layers.0.self_attn.q_proj"):
                b[:BLOCK] = 0  # the zero block of the base stays zero
            deltas[name.removeprefix("base_model.model.") + ".weight"] = module.get_delta_weight("default").numpy()
    peft_model.save_pretrained(str(folder), save_embedding_layers=False)  # lm_head: LoRA factors only
    return deltas


@pytest.fixture(scope="module")
def fp8_case(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    model = tiny_llama()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    quantized = write_fp8_base(state, model.config, root / "base")
    deltas = write_adapter(model, root / "adapter")
    assert set(deltas) >= {"model.layers.0.self_attn.q_proj.weight", "lm_head.weight"}
    return root, quantized, deltas, (state, model.config)


def raw(t: torch.Tensor) -> np.ndarray:
    """The stored bytes of a tensor, for byte comparisons."""
    return t.contiguous().view(torch.uint8).numpy()


def bf16_of(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(torch.bfloat16)


def load_transformers(folder: pathlib.Path):
    from transformers import LlamaForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LlamaForCausalLM.from_pretrained(str(folder)).eval()


# --- the tests ------------------------------------------------------------------------------------

def test_numpy_model_matches_transformers_quantizer():
    """The numpy rule above is transformers' own Fp8Quantize, byte for byte (shapes it quantizes:
    multiples of the block), including a zero block and values at the saturation edge."""
    from types import SimpleNamespace

    from transformers.integrations.finegrained_fp8 import Fp8Quantize
    from transformers.utils.quantization_config import FineGrainedFP8Config

    g = torch.Generator().manual_seed(3)
    w = torch.randn(48, 32, generator=g) * 0.05
    w[:16, 16:] = 0
    w[16:32, :16] *= 1e4
    op = Fp8Quantize(SimpleNamespace(quantization_config=FineGrainedFP8Config(weight_block_size=(BLOCK, BLOCK))))
    ref = op._quantize_one("m.weight", w)
    q, s = quantize_blocks(w.numpy())
    assert np.array_equal(raw(ref["m.weight"]), q)
    assert ref["m.weight_scale_inv"].dtype == torch.float32
    assert np.array_equal(ref["m.weight_scale_inv"].numpy().view(np.uint32), s.view(np.uint32))
    assert s[0, 1] == 1.0  # the zero block


def test_merge_keeps_fp8_layout(fp8_case, peftc_binary, tmp_path):
    root, quantized, deltas, _ = fp8_case
    out = tmp_path / "merged"
    run_merge(peftc_binary, root / "base", [(root / "adapter", 1.0)], out)
    base, ours = file_tensors(root / "base"), file_tensors(out)
    assert {k: (v.dtype, v.shape) for k, v in ours.items()} == {k: (v.dtype, v.shape) for k, v in base.items()}
    assert (out / "config.json").read_bytes() == (root / "base" / "config.json").read_bytes()

    changed = set()
    for name, (q, s) in quantized.items():
        scale_name = name[:-len("weight")] + "weight_scale_inv"
        if name not in deltas:
            assert np.array_equal(raw(ours[name]), raw(base[name])), name
            assert np.array_equal(raw(ours[scale_name]), raw(base[scale_name])), scale_name
            continue
        merged = dequantize_blocks(q, s) + deltas[name]  # f32, as peft_c adds the delta
        want_q, want_s = quantize_blocks(merged)
        assert np.array_equal(raw(ours[name]), want_q), name
        assert np.array_equal(ours[scale_name].numpy().view(np.uint32), want_s.view(np.uint32)), scale_name
        assert not np.array_equal(want_q, q), name
        # Within half an e4m3 ulp at the block scale of the exact merge.
        exact = dequantize_blocks(q, s).astype(np.float64) + deltas[name].astype(np.float64)
        got = dequantize_blocks(raw(ours[name]).reshape(q.shape), ours[scale_name].numpy()).astype(np.float64)
        slack = 1 + 2.0 ** -20  # the f32 products w * s and q * scale_inv round once each
        assert (np.abs(got - exact) <= half_ulp_bound(exact, want_s) * slack + 1e-30).all(), name
        changed.add(name)
    assert changed == {n for n in deltas if n in quantized}
    assert ours["model.layers.0.self_attn.q_proj.weight_scale_inv"][0, 0] == 1.0  # the zero block

    lm = base["lm_head.weight"].float().numpy() + deltas["lm_head.weight"]
    assert torch.equal(ours["lm_head.weight"], bf16_of(lm))
    for name in base:
        if name not in quantized and not name.endswith("weight_scale_inv") and name != "lm_head.weight":
            assert np.array_equal(raw(ours[name]), raw(base[name])), name


def test_transformers_loads_merged_fp8(fp8_case, peftc_binary, tmp_path):
    """transformers reads the merged FP8 checkpoint: on CPU it dequantizes it as it loads, which
    needs blocks that divide the shapes (its Fp8Dequantize derives the block from the scale grid), so
    this base has 4x8 blocks."""
    root, _, deltas, (state, config) = fp8_case
    block = (4, 8)
    quantized = write_fp8_base(state, config, tmp_path / "base", block)
    out = tmp_path / "merged"
    run_merge(peftc_binary, tmp_path / "base", [(root / "adapter", 1.0)], out)
    ours = file_tensors(out)
    state = load_transformers(out).state_dict()
    for name, (q, s) in quantized.items():
        want_q, want_s = quantize_blocks(dequantize_blocks(q, s, block) + deltas.get(name, 0), block)
        assert np.array_equal(raw(ours[name]), want_q), name
        assert torch.equal(state[name].to(torch.bfloat16), bf16_of(dequantize_blocks(want_q, want_s, block))), name


def test_merge_dequantized_bf16(fp8_case, peftc_binary, tmp_path):
    root, quantized, deltas, _ = fp8_case
    out = tmp_path / "merged_bf16"
    run_merge(peftc_binary, root / "base", [(root / "adapter", 1.0)], out, "--dtype", "bf16")
    base, ours = file_tensors(root / "base"), file_tensors(out)
    assert not any(k.endswith("weight_scale_inv") for k in ours)
    assert set(ours) == {k for k in base if not k.endswith("weight_scale_inv")}
    assert all(v.dtype == torch.bfloat16 for v in ours.values())
    config = json.loads((out / "config.json").read_text())
    want_config = json.loads((root / "base" / "config.json").read_text())
    del want_config["quantization_config"]
    assert config == want_config  # dtype was bfloat16 already

    expected = {}
    for name, (q, s) in quantized.items():
        expected[name] = bf16_of(dequantize_blocks(q, s) + deltas.get(name, 0))
    expected["lm_head.weight"] = bf16_of(base["lm_head.weight"].float().numpy() + deltas["lm_head.weight"])
    for name, want in expected.items():
        assert torch.equal(ours[name], want), name

    state = load_transformers(out).state_dict()
    for name, tensor in ours.items():
        assert torch.equal(state[name], tensor), name


def test_dequantized_f32_config_dtype(fp8_case, peftc_binary, tmp_path):
    root, quantized, deltas, _ = fp8_case
    out = tmp_path / "merged_f32"
    run_merge(peftc_binary, root / "base", [(root / "adapter", 1.0)], out, "--dtype", "f32")
    ours = file_tensors(out)
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "float32"
    name = "model.layers.1.mlp.down_proj.weight"
    q, s = quantized[name]
    assert np.array_equal(ours[name].numpy(), dequantize_blocks(q, s) + deltas[name])
    name = "model.layers.1.mlp.up_proj.weight"  # not targeted: only dequantized
    assert np.array_equal(ours[name].numpy(), dequantize_blocks(*quantized[name]))


UNSUPPORTED = [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, '"gptq"'),
    ({"quant_method": "awq", "bits": 4, "version": "gemm"}, '"awq"'),
    ({"quant_method": "hqq", "quant_config": {}}, '"hqq"'),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized"}, '"compressed-tensors" (format "pack-quantized")'),
    ({"quant_method": "fp8", "weight_block_size": None}, "per-tensor scales"),
    ({"quant_method": "fp8", "weight_block_size": [16, 16], "scale_fmt": "ue8m0"}, 'scale_fmt "ue8m0"'),
]


@pytest.mark.parametrize("quantization, named", UNSUPPORTED, ids=[q["quant_method"] + str(i) for i, (q, _) in enumerate(UNSUPPORTED)])
def test_unsupported_methods_are_named(fp8_case, peftc_binary, tmp_path, quantization, named):
    root, _, _, _ = fp8_case
    base = tmp_path / "base"
    base.mkdir()
    shutil.copy(root / "base" / "model.safetensors", base / "model.safetensors")
    config = json.loads((root / "base" / "config.json").read_text())
    config["quantization_config"] = quantization
    (base / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([str(peftc_binary), "merge", "--base", str(base), "--out", str(tmp_path / "out"),
                           "--adapter", str(root / "adapter")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "UNSUPPORTED" in proc.stderr, proc.stderr
    assert named in proc.stderr, proc.stderr
    assert "supported quantized bases: FP8 block-scale safetensors" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()
