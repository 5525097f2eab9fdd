"""Mixtral's stacked experts in GGUF, against llama.cpp itself.

llama.cpp's converter stacks model.layers.L.block_sparse_moe.experts.E.w1/w2/w3 into the 3-D tensors
blk.L.ffn_gate_exps/ffn_down_exps/ffn_up_exps (expert E at the outermost index E), and
convert_lora_to_gguf.py stacks a LoRA's per-expert pairs the same way (lora_a (n, r, in), lora_b
(n, out, r)), which llama.cpp applies per expert. The adapters here have the per-expert keys users have
(transformers 4 names, as transformers 5 still writes its checkpoints), written directly as
safetensors + adapter_config.json; the expected merges are computed in numpy from the factors and
PEFT's scale, then converted by convert_hf_to_gguf.py.

- `peftc adapter export --format gguf`: a plain adapter equals convert_lora_to_gguf.py's file; with
  llama-export-lora, peft_c's adapter (plain, and rsLoRA with rank/alpha patterns, whose smaller ranks
  are zero-padded) gives the expected merge; an adapter lacking some expert of a stacked tensor is
  refused, naming the experts.
- `peftc merge --base BASE.gguf`: each expert's delta goes into its slice (F32, F16), as
  llama-export-lora does, also for adapters that only touch some experts.
- GGUF -> PEFT: stacked pairs come back as per-expert modules that merge to llama.cpp's result.

Skipped (with the reason) when PEFT_LLAMA_CPP_BIN is not set; scripts/test.sh sets it.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from gguf_reference import (assert_same_merge, convert_hf_to_gguf, convert_lora_to_gguf, export_lora, relative_error,
                            run_peftc, tensors)

EXPERTS = 3
LAYERS = 2
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory) -> pathlib.Path:
    """A tiny random Mixtral saved by transformers (per-expert names on disk)."""
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=96, hidden_size=32, intermediate_size=16, num_hidden_layers=LAYERS,
                           num_attention_heads=4, num_key_value_heads=2, num_local_experts=EXPERTS,
                           num_experts_per_tok=2, max_position_embeddings=64, tie_word_embeddings=False)
    folder = tmp_path_factory.mktemp("models") / "tiny_mixtral"
    MixtralForCausalLM(config).save_pretrained(str(folder))
    keys = load_file(str(folder / "model.safetensors")).keys()
    assert "model.layers.0.block_sparse_moe.experts.2.w3.weight" in keys
    return folder


def module_names(experts=range(EXPERTS), which=("w1", "w2", "w3"), attention=ATTENTION, router=True) -> list[str]:
    names = []
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}"
        names += [f"{prefix}.self_attn.{p}" for p in attention]
        if router:
            names.append(f"{prefix}.block_sparse_moe.gate")
        names += [f"{prefix}.block_sparse_moe.experts.{e}.{w}" for e in experts for w in which]
    return names


def on_disk(module: str) -> str:
    """The checkpoint name of a module: transformers 5 calls Mixtral's router mlp.gate in memory."""
    return module.replace(".mlp.gate", ".block_sparse_moe.gate")


def write_adapter(folder: pathlib.Path, base: pathlib.Path, modules: list[str], r: int, alpha: float,
                  ranks: dict | None = None, alpha_pattern: dict | None = None, rslora: bool = False,
                  seed: int = 1) -> pathlib.Path:
    """A PEFT LoRA adapter folder with per-expert keys: random A and B for each module, rank r or ranks[m]."""
    rng = np.random.default_rng(seed)
    weights = load_file(str(base / "model.safetensors"))
    ranks = ranks or {}
    factors = {}
    for m in modules:
        out, inp = weights[on_disk(m) + ".weight"].shape
        rank = ranks.get(m, r)
        factors[f"base_model.model.{m}.lora_A.weight"] = rng.normal(0, 0.2, (rank, inp)).astype(np.float32)
        factors[f"base_model.model.{m}.lora_B.weight"] = rng.normal(0, 0.2, (out, rank)).astype(np.float32)
    folder.mkdir(parents=True)
    save_file(factors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": str(base), "r": r,
              "lora_alpha": alpha, "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
              "use_rslora": rslora, "use_dora": False, "inference_mode": True,
              "target_modules": sorted({m.rsplit(".", 1)[1] for m in modules}),
              "rank_pattern": {m: k for m, k in ranks.items()}, "alpha_pattern": alpha_pattern or {}}
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder


def pattern_value(pattern: dict, module: str, default):
    for key, value in pattern.items():
        if module == key or module.endswith("." + key):
            return value
    return default


def expected_merge(base: pathlib.Path, adapter: pathlib.Path, out: pathlib.Path, weight: float = 1.0) -> dict:
    """convert_hf_to_gguf.py's tensors of base + weight x PEFT's delta (scale x B @ A, in f64) of every module."""
    config = json.loads((adapter / "adapter_config.json").read_text())
    factors = load_file(str(adapter / "adapter_model.safetensors"))
    weights = {k: v.astype(np.float64) for k, v in load_file(str(base / "model.safetensors")).items()}
    for key, a in factors.items():
        if not key.endswith(".lora_A.weight"):
            continue
        module = key[len("base_model.model."):-len(".lora_A.weight")]
        b = factors[key.replace("lora_A", "lora_B")]
        rank = a.shape[0]
        alpha = pattern_value(config.get("alpha_pattern") or {}, module, config["lora_alpha"])
        scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
        weights[on_disk(module) + ".weight"] += weight * scale * (b.astype(np.float64) @ a.astype(np.float64))
    out.mkdir()
    save_file({k: v.astype(np.float32) for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    (out / "config.json").write_bytes((base / "config.json").read_bytes())
    return tensors(convert_hf_to_gguf(out, outtype="f32"))


def assert_close(got: dict, want: dict, base: dict) -> None:
    """Same tensors; F32 within 1e-6 relative; some changed."""
    assert got.keys() == want.keys()
    changed = set()
    for name, (kind, ne, values) in want.items():
        assert got[name][:2] == (kind, ne), name
        assert relative_error(got[name][2], values) <= 1e-6, name
        if not np.array_equal(base[name][2], values):
            changed.add(name)
    assert changed
    return changed


def export_gguf(peftc, adapter: pathlib.Path, base: pathlib.Path, out: pathlib.Path, *extra: str) -> pathlib.Path:
    run_peftc(peftc, "adapter", "export", adapter, out, "--format", "gguf", "--base", base, *extra)
    return out


@pytest.fixture(scope="module")
def plain(mixtral, tmp_path_factory) -> pathlib.Path:
    return write_adapter(tmp_path_factory.mktemp("adapters") / "plain", mixtral, module_names(), r=4, alpha=8)


@pytest.fixture(scope="module")
def patterned(mixtral, tmp_path_factory) -> pathlib.Path:
    """rsLoRA, expert ranks that differ within a stacked tensor, an alpha pattern on an expert."""
    ranks = {"model.layers.0.block_sparse_moe.experts.1.w2": 2, "model.layers.1.block_sparse_moe.experts.0.w1": 6,
             "model.layers.1.self_attn.q_proj": 8}
    alphas = {"model.layers.0.block_sparse_moe.experts.2.w3": 3.0}
    return write_adapter(tmp_path_factory.mktemp("adapters") / "patterned", mixtral, module_names(), r=4, alpha=8,
                         ranks=ranks, alpha_pattern=alphas, rslora=True, seed=2)


@pytest.fixture(scope="module")
def partial(mixtral, tmp_path_factory) -> pathlib.Path:
    """w1 of experts 0 and 2 only, and v_proj: what llama.cpp cannot hold as a stacked LoRA; and the
    router under its transformers 5 name (mlp.gate), as PEFT 0.21 saves it."""
    modules = module_names(experts=(0, 2), which=("w1",), attention=("v_proj",), router=False)
    return write_adapter(tmp_path_factory.mktemp("adapters") / "partial", mixtral,
                         modules + ["model.layers.1.mlp.gate"], r=4, alpha=16, seed=3)


def test_plain_adapter_equals_convert_lora_to_gguf(peftc_binary, tmp_path, mixtral, plain):
    ours = tensors(export_gguf(peftc_binary, plain, mixtral, tmp_path / "ours.gguf"))
    reference = tensors(convert_lora_to_gguf(plain, mixtral, outtype="f32"))
    assert ours.keys() == reference.keys()
    for name, (kind, ne, values) in reference.items():
        assert ours[name][:2] == (kind, ne), name
        assert np.array_equal(ours[name][2], values), name
    # The stacked pairs: lora_a (n, r, in), lora_b (n, out, r) as ne.
    assert ours["blk.0.ffn_gate_exps.weight.lora_a"][1] == [32, 4, EXPERTS]
    assert ours["blk.1.ffn_down_exps.weight.lora_b"][1] == [4, 32, EXPERTS]
    assert "blk.0.ffn_gate_inp.weight.lora_a" in ours


@pytest.mark.parametrize("which", ["plain", "patterned"])
def test_llama_export_lora_applies_peft_scale(peftc_binary, tmp_path, mixtral, plain, patterned, which):
    adapter = {"plain": plain, "patterned": patterned}[which]
    base_gguf = convert_hf_to_gguf(mixtral, outtype="f32")
    ours = export_gguf(peftc_binary, adapter, mixtral, tmp_path / "adapter.gguf")
    # The GGUF model as the base gives the same file.
    assert export_gguf(peftc_binary, adapter, base_gguf, tmp_path / "b.gguf").read_bytes() == ours.read_bytes()
    if which == "patterned":  # zero-padded to the largest rank of the stacked tensor
        assert tensors(ours)["blk.1.ffn_gate_exps.weight.lora_a"][1] == [32, 6, EXPERTS]
    merged = tensors(export_lora(base_gguf, [(ours, 1.0)], tmp_path / "merged.gguf"))
    changed = assert_close(merged, expected_merge(mixtral, adapter, tmp_path / "expected"), tensors(base_gguf))
    assert {f"blk.{l}.ffn_{w}_exps.weight" for l in range(LAYERS) for w in ("gate", "down", "up")} <= changed


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_merge_into_gguf_base_equals_llama_export_lora(peftc_binary, tmp_path, mixtral, plain, outtype):
    base = convert_hf_to_gguf(mixtral, outtype=outtype)
    stacked_lora = convert_lora_to_gguf(plain, mixtral)
    reference = export_lora(base, [(stacked_lora, 0.5)], tmp_path / "reference.gguf")
    out = tmp_path / "merged.gguf"
    run_peftc(peftc_binary, "merge", "--base", base, "--out", out, "--adapter", f"{plain}:0.5")
    # q, k, v, o, the router and the three stacked expert tensors of each layer
    assert assert_same_merge(out, reference, base) == LAYERS * 8
    # The converter's GGUF LoRA (3-D pairs on the stacked tensors) as the merge's input.
    from_gguf = tmp_path / "merged_from_gguf.gguf"
    run_peftc(peftc_binary, "merge", "--base", base, "--out", from_gguf, "--adapter", f"{stacked_lora}:0.5")
    assert assert_same_merge(from_gguf, reference, base) == LAYERS * 8


def test_merge_of_some_experts_goes_into_their_slices(peftc_binary, tmp_path, mixtral, partial):
    base = convert_hf_to_gguf(mixtral, outtype="f32")
    out = tmp_path / "merged.gguf"
    run_peftc(peftc_binary, "merge", "--base", base, "--out", out, "--adapter", partial)
    before = tensors(base)
    got = tensors(out)
    assert_close(got, expected_merge(mixtral, partial, tmp_path / "expected"), before)
    gate = got["blk.0.ffn_gate_exps.weight"][2]
    assert np.array_equal(gate[1], before["blk.0.ffn_gate_exps.weight"][2][1])  # expert 1 untouched
    assert not np.array_equal(gate[0], before["blk.0.ffn_gate_exps.weight"][2][0])
    assert not np.array_equal(got["blk.1.ffn_gate_inp.weight"][2], before["blk.1.ffn_gate_inp.weight"][2])


def test_export_refuses_missing_experts(peftc_binary, tmp_path, mixtral, partial):
    out = tmp_path / "x.gguf"
    proc = run_peftc(peftc_binary, "adapter", "export", partial, out, "--format", "gguf", "--base", mixtral, expect=1)
    assert "UNSUPPORTED" in proc.stderr
    assert "blk.0.ffn_gate_exps.weight" in proc.stderr and "blk.1.ffn_gate_exps.weight" in proc.stderr
    assert "expert(s) 1" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("source", ["ours", "convert_lora_to_gguf"])
def test_import_unstacks_experts(peftc_binary, tmp_path, mixtral, plain, patterned, source):
    if source == "ours":
        adapter_gguf = export_gguf(peftc_binary, patterned, mixtral, tmp_path / "adapter.gguf")
    else:
        adapter_gguf = convert_lora_to_gguf(plain, mixtral, outtype="f32")
    folder = tmp_path / "imported"
    run_peftc(peftc_binary, "adapter", "export", adapter_gguf, folder, "--format", "peft", "--base", mixtral)
    keys = load_file(str(folder / "adapter_model.safetensors")).keys()
    for module in module_names():
        assert f"base_model.model.{module}.lora_A.weight" in keys, module
        assert f"base_model.model.{module}.lora_B.weight" in keys, module
    assert len(keys) == 2 * len(module_names())
    base_gguf = convert_hf_to_gguf(mixtral, outtype="f32")
    merged = tensors(export_lora(base_gguf, [(adapter_gguf, 1.0)]))
    assert_close(merged, expected_merge(mixtral, folder, tmp_path / "expected"), tensors(base_gguf))
