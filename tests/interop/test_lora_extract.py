"""LoRA extraction from a fine-tuned checkpoint and conversion of adapters to plain LoRA, against
numpy and PEFT 0.21:

* `peftc adapter extract` on a tiny LLaMA and a tiny GPT-2 pair (tuned = base + a random low-rank
  change + small full-rank noise, made here with torch): PEFT loads the adapter with no missing or
  unexpected keys (GPT-2's Conv1D through fan_in_fan_out), merge_and_unload gives base + B A, and each
  reported error equals ||dW - B A|| / ||dW|| of the written factors and numpy's SVD error at the same
  rank; --energy picks the rank numpy's singular values give (PEFT's _find_cutoff_index);
* `peftc adapter convert --to lora --rank` of a LoRA adapter equals PEFT's convert_to_lora (keys, ranks,
  products B A);
* `peftc adapter convert --to lora --initial` of a PiSSA-initialised adapter after "training" equals
  PEFT's save_pretrained(path_initial_model_for_weight_conversion=...) byte for byte in its tensors, and
  in its config's r and lora_alpha.
"""
from __future__ import annotations

import copy
import json
import pathlib
import subprocess
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict  # noqa: E402
from peft.utils import load_peft_weights  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

LLAMA = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=64, max_position_embeddings=64, head_dim=8)
GPT2 = dict(n_embd=32, n_layer=2, n_head=4, vocab_size=64, n_positions=64)
# Errors are computed from f32 singular values (LAPACK here, LAPACK in numpy): equal to this.
ERROR_TOLERANCE = 2e-5


def run(peftc, *args):
    result = subprocess.run([str(peftc), *map(str, args)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return result.stdout


def make_pair(tmp: pathlib.Path, kind: str):
    """A tiny base and a 'fine-tuned' copy: every 2-D weight of the decoder layers gets a rank-3 change
    plus noise 1e-3 (norms and embeddings unchanged)."""
    torch.manual_seed(0)
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))
    base, tuned = tmp / f"{kind}-base", tmp / f"{kind}-tuned"
    model.save_pretrained(base)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() != 2 or ".layers." not in name and ".h." not in name:
                continue
            rows, cols = p.shape
            u = torch.randn(rows, 3, generator=gen)
            v = torch.randn(3, cols, generator=gen)
            p += 0.05 * (u @ v) + 1e-3 * torch.randn(rows, cols, generator=gen)
    model.save_pretrained(tuned)
    return base, tuned


def weights(folder: pathlib.Path) -> dict:
    return load_file(str(folder / "model.safetensors"))


def module_delta(base: dict, tuned: dict, module: str) -> np.ndarray:
    return tuned[module + ".weight"].astype(np.float32) - base[module + ".weight"].astype(np.float32)


def numpy_error(delta: np.ndarray, rank: int) -> float:
    s = np.linalg.svd(delta.astype(np.float64), compute_uv=False)
    return float(np.sqrt(np.sum(s[rank:] ** 2) / np.sum(s ** 2)))


def numpy_energy_rank(delta: np.ndarray, fraction: float) -> int:
    s = np.linalg.svd(delta.astype(np.float64), compute_uv=False)
    cs = np.cumsum(s ** 2)
    return int(np.searchsorted(cs, fraction * cs[-1])) + 1


def product(factors: dict, module: str, conv1d: bool) -> np.ndarray:
    a = factors[f"base_model.model.{module}.lora_A.weight"].astype(np.float64)
    b = factors[f"base_model.model.{module}.lora_B.weight"].astype(np.float64)
    return (b @ a).T if conv1d else b @ a


def load_clean(base: pathlib.Path, adapter: pathlib.Path, model_class):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(model_class.from_pretrained(base), adapter).eval()
    assert not [str(w.message) for w in caught if "missing adapter keys" in str(w.message)]
    result = set_peft_model_state_dict(model, load_peft_weights(str(adapter)), adapter_name="default")
    assert [k for k in result.missing_keys if "lora_" in k and "default" in k] == []
    assert result.unexpected_keys == [], result.unexpected_keys
    return model


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_extract_matches_numpy_and_loads_in_peft(tmp_path, peftc_binary, kind):
    base, tuned = make_pair(tmp_path, kind)
    out = tmp_path / "extracted"
    report = json.loads(run(peftc_binary, "adapter", "extract", "--base", base, "--tuned", tuned, "--out", out,
                            "--rank", 3, "--threads", 2, "--json"))["modules"]
    wb, wt = weights(base), weights(tuned)
    changed = sorted(n[: -len(".weight")] for n in wt if n.endswith(".weight") and wt[n].ndim == 2
                     and not np.array_equal(wt[n], wb[n]))
    assert sorted(m["name"] for m in report) == changed
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 3 and config["lora_alpha"] == 3 and config["fan_in_fan_out"] == (kind == "gpt2")
    assert sorted(config["target_modules"]) == changed
    factors = load_file(str(out / "adapter_model.safetensors"))
    assert len(factors) == 2 * len(changed)
    for m in report:
        delta = module_delta(wb, wt, m["name"])
        approx = product(factors, m["name"], kind == "gpt2")
        actual = float(np.linalg.norm(delta - approx) / np.linalg.norm(delta))
        assert m["rank"] == 3
        assert abs(m["relative_error"] - numpy_error(delta, 3)) < ERROR_TOLERANCE, m
        assert abs(m["relative_error"] - actual) < ERROR_TOLERANCE, m
        assert 0.001 < m["relative_error"] < 0.2  # the noise is left out, the low-rank change kept

    model_class = transformers.LlamaForCausalLM if kind == "llama" else transformers.GPT2LMHeadModel
    merged = load_clean(base, out, model_class).merge_and_unload().state_dict()
    for m in report:
        expected = wb[m["name"] + ".weight"].astype(np.float64) + product(factors, m["name"], kind == "gpt2")
        np.testing.assert_allclose(merged[m["name"] + ".weight"].numpy(), expected, rtol=0, atol=1e-5)


def test_extract_energy_and_modules(tmp_path, peftc_binary):
    base, tuned = make_pair(tmp_path, "llama")
    out = tmp_path / "energy"
    report = json.loads(run(peftc_binary, "adapter", "extract", "--base", base, "--tuned", tuned, "--out", out,
                            "--energy", 0.95, "--modules", "q_proj,down_proj", "--json"))["modules"]
    wb, wt = weights(base), weights(tuned)
    assert sorted(m["name"] for m in report) == [f"model.layers.{i}.{p}" for i in range(2)
                                                 for p in ("mlp.down_proj", "self_attn.q_proj")]
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 1 and config["lora_alpha"] == 1
    for m in report:
        delta = module_delta(wb, wt, m["name"])
        assert m["rank"] == numpy_energy_rank(delta, 0.95), m
        assert config["rank_pattern"][m["name"]] == m["rank"] == config["alpha_pattern"][m["name"]]
        assert abs(m["relative_error"] - numpy_error(delta, m["rank"])) < ERROR_TOLERANCE
    load_clean(base, out, transformers.LlamaForCausalLM)


def test_extract_randomized_agrees(tmp_path, peftc_binary):
    """The randomized SVD finds the same low-rank change (the sketch of r + 10 columns needs
    2 (r + 10) <= min(out, in): the 32 x 64 and 64 x 32 weights at rank 3 qualify)."""
    base, tuned = make_pair(tmp_path, "llama")
    exact = json.loads(run(peftc_binary, "adapter", "extract", "--base", base, "--tuned", tuned, "--out",
                           tmp_path / "e", "--rank", 3, "--json"))["modules"]
    rand = json.loads(run(peftc_binary, "adapter", "extract", "--base", base, "--tuned", tuned, "--out",
                          tmp_path / "r", "--rank", 3, "--svd", "randomized", "--json"))["modules"]
    assert [m["name"] for m in exact] == [m["name"] for m in rand]
    wb, wt = weights(base), weights(tuned)
    factors = load_file(str(tmp_path / "r" / "adapter_model.safetensors"))
    for e, r in zip(exact, rand):
        delta = module_delta(wb, wt, r["name"])
        actual = float(np.linalg.norm(delta - product(factors, r["name"], False)) / np.linalg.norm(delta))
        assert abs(r["relative_error"] - actual) < 1e-4, r
        assert r["relative_error"] <= e["relative_error"] * 1.01 + 1e-6


def lora_model(base: pathlib.Path, **config):
    model = transformers.LlamaForCausalLM.from_pretrained(base)
    return get_peft_model(model, LoraConfig(target_modules=["q_proj", "v_proj", "down_proj"], **config))


def perturb(model, seed: int):
    """A few random 'training' steps: every LoRA factor moved a little."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p += 0.05 * torch.randn(p.shape, generator=gen)


def test_convert_lora_to_lower_rank_matches_peft(tmp_path, peftc_binary):
    base, _ = make_pair(tmp_path, "llama")
    torch.manual_seed(2)
    model = lora_model(base, r=8, lora_alpha=16, init_lora_weights=False)
    source = tmp_path / "r8"
    model.save_pretrained(source)
    out = tmp_path / "r4"
    report = json.loads(run(peftc_binary, "adapter", "convert", source, out, "--to", "lora", "--rank", 4,
                            "--json"))["modules"]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_config, ref_state = peft.convert_to_lora(model, 4)
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == ref_config.r == 4 and config["lora_alpha"] == ref_config.lora_alpha == 4
    assert set(config["target_modules"]) == set(ref_config.target_modules)
    ours = load_file(str(out / "adapter_model.safetensors"))
    assert set(ours) == set(ref_state)
    source_factors = load_file(str(source / "adapter_model.safetensors"))
    for m in report:
        ref = {k: v.numpy() for k, v in ref_state.items()}
        np.testing.assert_allclose(product(ours, m["name"], False), product(ref, m["name"], False), rtol=0, atol=1e-5)
        delta = 2.0 * product(source_factors, m["name"], False)  # scaling 16 / 8
        assert abs(m["relative_error"] - numpy_error(delta, 4)) < ERROR_TOLERANCE
    load_clean(base, out, transformers.LlamaForCausalLM)


def test_convert_pissa_matches_peft(tmp_path, peftc_binary):
    base, _ = make_pair(tmp_path, "llama")
    torch.manual_seed(3)
    model = lora_model(base, r=4, lora_alpha=8, init_lora_weights="pissa")
    initial, tuned, ref = tmp_path / "pissa-init", tmp_path / "pissa-tuned", tmp_path / "pissa-ref"
    model.save_pretrained(initial)
    perturb(model, 4)
    model.save_pretrained(tuned)
    initial_copy = tmp_path / "pissa-init-copy"
    initial_copy.mkdir()
    for f in initial.iterdir():
        (initial_copy / f.name).write_bytes(f.read_bytes())
    ours = tmp_path / "pissa-ours"
    run(peftc_binary, "adapter", "convert", tuned, ours, "--to", "lora", "--initial", initial_copy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(ref, path_initial_model_for_weight_conversion=str(initial))

    a, b = load_file(str(ours / "adapter_model.safetensors")), load_file(str(ref / "adapter_model.safetensors"))
    assert set(a) == set(b)
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
    ca = json.loads((ours / "adapter_config.json").read_text())
    cb = json.loads((ref / "adapter_config.json").read_text())
    for field in ("r", "lora_alpha", "init_lora_weights", "rank_pattern", "alpha_pattern", "target_modules"):
        assert ca[field] == cb[field] or sorted(ca[field]) == sorted(cb[field]), field

    # On the ORIGINAL base, the converted LoRA gives the fine-tuned PiSSA model's weights.
    merged = load_clean(base, ours, transformers.LlamaForCausalLM).merge_and_unload().state_dict()
    with torch.no_grad():
        trained = copy.deepcopy(model).merge_and_unload().state_dict()
    for k, v in trained.items():
        np.testing.assert_allclose(merged[k].numpy(), v.numpy(), rtol=0, atol=2e-5, err_msg=k)
