"""export_adapter and combine_adapters, judged by PEFT (save_pretrained bytes, from_pretrained,
add_weighted_adapter)."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

import peft_c
from peft_c_test_support import FIXTURES, HEADER

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from safetensors import safe_open  # noqa: E402

ADAPTERS = FIXTURES / "adapters"
MANIFEST = ADAPTERS / "MANIFEST.json"
if not MANIFEST.exists():
    pytest.skip(f"{MANIFEST} not generated", allow_module_level=True)
ENTRIES = json.loads(MANIFEST.read_text())


def openable():
    names = []
    for name in sorted(ENTRIES):
        if not json.loads((ADAPTERS / name / "adapter_config.json").read_text()).get("target_parameters"):
            names.append(name)
    return names


def tensors_of(folder):
    with safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def peft_model(names, base=None):
    base_dir = FIXTURES / ENTRIES[names[0]]["base"] if base is None else base
    architecture = json.loads((base_dir / "config.json").read_text())["architectures"][0]
    model = getattr(transformers, architecture).from_pretrained(base_dir)
    model = peft.PeftModel.from_pretrained(model, ADAPTERS / names[0], adapter_name="a0")
    for i, name in enumerate(names[1:], 1):
        model.load_adapter(ADAPTERS / name, adapter_name=f"a{i}")
    return model


def test_combine_constants_mirror_the_header():
    found = dict(re.findall(r"^#define\s+PEFT_COMBINE_([A-Z_]+)\s+(\d+)", HEADER.read_text(), re.M))
    assert {k.lower(): int(v) for k, v in found.items()} == peft_c.export.COMBINE_METHODS
    found = dict(re.findall(r"^#define\s+PEFT_MAJORITY_SIGN_([A-Z_]+)\s+(\d+)", HEADER.read_text(), re.M))
    assert {k.lower(): int(v) for k, v in found.items()} == peft_c.export.MAJORITY_SIGN_METHODS


@pytest.mark.parametrize("name", openable())
def test_reexport_reproduces_peft_files(name, tmp_path):
    with peft_c.Adapter.open(ADAPTERS / name) as adapter:
        peft_c.export_adapter(adapter, tmp_path / "out")
    for file in ("adapter_model.safetensors", "adapter_config.json"):
        assert (tmp_path / "out" / file).read_bytes() == (ADAPTERS / name / file).read_bytes(), file


def test_exported_adapter_loads_in_peft_without_missing_keys(tmp_path):
    name = "llama_dora"
    with peft_c.Adapter.open(ADAPTERS / name) as adapter:
        peft_c.export_adapter(adapter, tmp_path / "out", dtype="BF16")
    ours = tensors_of(tmp_path / "out")
    original = tensors_of(ADAPTERS / name)
    assert ours.keys() == original.keys()
    for key, value in ours.items():
        assert value.dtype == torch.bfloat16
        assert torch.equal(value, original[key].to(torch.bfloat16)), key  # rounded as torch rounds
    model = peft_model([name])
    result = model.load_adapter(tmp_path / "out", adapter_name="mine")
    assert not result.unexpected_keys
    assert [k for k in result.missing_keys if ".mine" in k] == []  # every adapter weight was found


def test_target_peft_version(tmp_path):
    # lora_bias (PEFT 0.14) and trainable_token_indices (0.15) cannot be expressed for 0.13
    for name, field in (("qwen2_lora_bias", "lora_bias"), ("llama_trainable_tokens", "trainable_token")):
        with peft_c.Adapter.open(ADAPTERS / name) as adapter:
            with pytest.raises(peft_c.UnsupportedError, match=field):
                peft_c.export_adapter(adapter, tmp_path / name, peft_version="0.13")
        assert not (tmp_path / name / "adapter_config.json").exists()
    with peft_c.Adapter.open(ADAPTERS / "llama_lora") as adapter:
        peft_c.export_adapter(adapter, tmp_path / "old", peft_version="0.13")
        with pytest.raises(peft_c.UnsupportedError):
            peft_c.export_adapter(adapter, tmp_path / "ancient", peft_version="0.12")
        with pytest.raises(peft_c.InvalidArgumentError):
            peft_c.export_adapter(adapter, tmp_path / "bad", peft_version="zero.one")
    config = json.loads((tmp_path / "old" / "adapter_config.json").read_text())
    current = json.loads((ADAPTERS / "llama_lora" / "adapter_config.json").read_text())
    assert set(config) < set(current)  # fields 0.13 does not know are left out
    assert {k: current[k] for k in config} == config


@pytest.mark.parametrize("method", ["cat", "linear"])
def test_combine_like_add_weighted_adapter(method, tmp_path):
    names = ["llama_lora", "llama_lora_second"]
    weights = [0.75, -0.5]
    adapters = [peft_c.Adapter.open(ADAPTERS / n) for n in names]
    out = tmp_path / "combined"
    peft_c.combine_adapters(adapters, weights, out, method=method)

    model = peft_model(names)
    model.add_weighted_adapter(["a0", "a1"], weights, "combined", combination_type=method)
    from peft.utils import get_peft_model_state_dict

    expected = get_peft_model_state_dict(model, adapter_name="combined")
    ours = tensors_of(out)
    assert ours.keys() == expected.keys()
    for key, value in ours.items():
        reference = expected[key].detach().float()
        scale = max(float(reference.abs().max()), 1e-30)
        assert value.shape == reference.shape and float((value.float() - reference).abs().max()) <= 1e-6 * scale, key
    config = json.loads((out / "adapter_config.json").read_text())
    reference_config = model.peft_config["combined"]
    assert config["r"] == reference_config.r and config["lora_alpha"] == reference_config.lora_alpha
    assert sorted(config["target_modules"]) == sorted(reference_config.target_modules)
    with peft_c.Adapter.open(out) as combined:  # and it opens again
        assert combined.r == reference_config.r


@pytest.mark.parametrize("method,density,sign", [("ties", 0.5, "total"), ("magnitude_prune", 0.3, "total"),
                                                  ("ties", 0.7, "frequency")])
def test_pruning_combinations_like_add_weighted_adapter(method, density, sign, tmp_path):
    names = ["llama_lora", "llama_lora_second"]
    weights = [0.75, -0.5]
    adapters = [peft_c.Adapter.open(ADAPTERS / n) for n in names]
    out = tmp_path / "combined"
    peft_c.combine_adapters(adapters, weights, out, method=method, density=density, majority_sign_method=sign)
    model = peft_model(names)
    model.add_weighted_adapter(["a0", "a1"], weights, "combined", combination_type=method, density=density,
                               majority_sign_method=sign)
    from peft.utils import get_peft_model_state_dict

    expected = get_peft_model_state_dict(model, adapter_name="combined")
    ours = tensors_of(out)
    assert ours.keys() == expected.keys()
    for key, value in ours.items():
        assert torch.equal(value, expected[key].detach()), key


def test_pruning_combination_settings(tmp_path):
    adapters = [peft_c.Adapter.open(ADAPTERS / n) for n in ("llama_lora", "llama_lora_second")]
    with pytest.raises(peft_c.InvalidArgumentError, match="density"):
        peft_c.combine_adapters(adapters, [1, 1], tmp_path / "a", method="dare_ties")
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.combine_adapters(adapters, [1, 1], tmp_path / "a", method="ties", density=2.0)
    with pytest.raises(ValueError):
        peft_c.combine_adapters(adapters, [1, 1], tmp_path / "a", method="ties", density=0.5,
                                majority_sign_method="max")
    with pytest.raises(ValueError):
        peft_c.combine_adapters(adapters, [1, 1], tmp_path / "a", method="dare_linear", density=0.5, seed=-1)
    assert not (tmp_path / "a").exists()
    for seed in (1, 2**64 - 1):  # the same seed gives the same bytes
        for run in ("x", "y"):
            peft_c.combine_adapters(adapters, [1, 1], tmp_path / f"{run}{seed}", method="dare_linear", density=0.5,
                                    seed=seed)
        assert (tmp_path / f"x{seed}" / "adapter_model.safetensors").read_bytes() == \
            (tmp_path / f"y{seed}" / "adapter_model.safetensors").read_bytes()
    assert (tmp_path / "x1" / "adapter_model.safetensors").read_bytes() != \
        (tmp_path / f"x{2**64 - 1}" / "adapter_model.safetensors").read_bytes()


@pytest.mark.parametrize("method,settings", [("svd", {}), ("svd", {"svd_rank": 2}), ("ties_svd", {"density": 0.5})])
def test_svd_combinations_like_add_weighted_adapter(method, settings, tmp_path):
    """The merged deltas B @ A equal PEFT's within the rounding of two SVD computations (the factors'
    signs are LAPACK's choice in PEFT; tests/interop/test_combine_svd.py compares the factors too)."""
    names = ["llama_lora", "llama_lora_second"]
    weights = [0.75, -0.5]
    adapters = [peft_c.Adapter.open(ADAPTERS / n) for n in names]
    out = tmp_path / "combined"
    peft_c.combine_adapters(adapters, weights, out, method=method, **settings)
    model = peft_model(names)
    model.add_weighted_adapter(["a0", "a1"], weights, "combined", combination_type=method, **settings)
    from peft.utils import get_peft_model_state_dict

    expected = get_peft_model_state_dict(model, adapter_name="combined")
    ours = tensors_of(out)
    assert ours.keys() == expected.keys()
    for key in ours:
        if ".lora_A." not in key:
            continue
        b_key = key.replace(".lora_A.", ".lora_B.")
        delta = ours[b_key].double() @ ours[key].double()
        reference = expected[b_key].detach().double() @ expected[key].detach().double()
        assert torch.linalg.norm(delta - reference) <= 1e-5 * torch.linalg.norm(reference), key
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == model.peft_config["combined"].r


def test_svd_combination_settings(tmp_path):
    adapters = [peft_c.Adapter.open(ADAPTERS / n) for n in ("llama_lora", "llama_lora_second")]
    with pytest.raises(ValueError):
        peft_c.combine_adapters(adapters, [1, 1], tmp_path / "a", method="svd", svd_rank=0)
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.combine_adapters(adapters, [1, 1], tmp_path / "a", method="svd", svd_clamp=1.5)
    with pytest.raises(peft_c.InvalidArgumentError, match="density"):
        peft_c.combine_adapters(adapters, [1, 1], tmp_path / "a", method="dare_ties_svd")
    assert not (tmp_path / "a").exists()
    peft_c.combine_adapters(adapters, [1, 1], tmp_path / "r3", method="svd", svd_rank=3)
    with peft_c.Adapter.open(tmp_path / "r3") as combined:
        assert combined.r == 3
    # The clamp: each factor tensor's values within the 0.5-quantile's magnitude of all of a module's values.
    peft_c.combine_adapters(adapters, [1, 1], tmp_path / "clamped", method="svd", svd_clamp=0.5)
    plain, clamped = tensors_of(tmp_path / "r3"), tensors_of(tmp_path / "clamped")
    for key, value in clamped.items():
        if ".lora_A." in key:
            both = torch.cat([value.flatten(), clamped[key.replace(".lora_A.", ".lora_B.")].flatten()])
            hi = both.abs().max()
            assert int((both.abs() == hi).sum()) > 1, key  # many values sit at the bound
    assert plain.keys() == clamped.keys()


def test_combine_errors(tmp_path):
    lora = peft_c.Adapter.open(ADAPTERS / "llama_lora")
    dora = peft_c.Adapter.open(ADAPTERS / "llama_dora")
    pattern = peft_c.Adapter.open(ADAPTERS / "llama_rank_alpha_pattern")
    with pytest.raises(peft_c.UnsupportedError):
        peft_c.combine_adapters([lora, dora], [1, 1], tmp_path / "a")
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.combine_adapters([lora, pattern], [1, 1], tmp_path / "b", method="linear")
    with pytest.raises(ValueError):
        peft_c.combine_adapters([lora], [1, 2], tmp_path / "c")
    with pytest.raises(ValueError):
        peft_c.combine_adapters([lora], [float("nan")], tmp_path / "d")
    with pytest.raises(ValueError):
        peft_c.combine_adapters([lora], [1], tmp_path / "e", method="svd_linear")
    with pytest.raises(ValueError):
        peft_c.combine_adapters([], [], tmp_path / "f")
    assert not any((tmp_path / d).exists() and any((tmp_path / d).iterdir()) for d in "abcdef")


def test_single_adapter_combines_as_linear(tmp_path):
    with peft_c.Adapter.open(ADAPTERS / "llama_lora") as adapter:
        peft_c.combine_adapters([adapter], [1.0], tmp_path / "one", method="cat")
    combined = tensors_of(tmp_path / "one")
    model = peft_model(["llama_lora"])
    model.add_weighted_adapter(["a0"], [1.0], "combined", combination_type="cat")
    from peft.utils import get_peft_model_state_dict

    expected = get_peft_model_state_dict(model, adapter_name="combined")
    for key, value in combined.items():
        assert np.allclose(value.float().numpy(), expected[key].detach().float().numpy(), rtol=1e-6, atol=1e-7), key
