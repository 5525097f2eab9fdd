"""Conversion of non-LoRA adapters to plain LoRA (`peftc adapter convert IN OUT --to lora`), against
PEFT 0.21 (issue 18 item 4):

* LoHa and LoKr: PEFT's own peft.tuners.lora.conversion.convert_to_lora on the loaded adapter gives
  the same modules, the same ranks (fixed, and per module for an energy fraction) and the same
  products B A within the f32 SVD's accuracy; the config's r / lora_alpha / target_modules /
  rank_pattern are PEFT's; PEFT loads the result with no missing or unexpected keys;
* AdaLoRA (PEFT does not convert it): B A against PEFT's merged delta W' - W, whose relative error
  equals the reported one;
* IA3 (multiplicative) with --base: dW = W' - W, W' PEFT's merge_and_unload, B A's relative error
  equals the reported one, and a full-rank conversion reproduces dW; without --base the conversion
  fails naming IA3 and the base; an IA3 layer that also scales a bias (GPT-2's c_attn) is refused.

The adapters are made at test time by tests/fixtures/generator/method_adapters.py (real peft).
"""
from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
from safetensors.numpy import load_file  # noqa: E402

from merge_support import load_model  # noqa: E402


def _generator(fixtures_dir):
    sys.path.insert(0, str(fixtures_dir))
    from generator.method_adapters import CASES, make_method_adapter

    return CASES, make_method_adapter


@pytest.fixture
def method_adapter(fixtures_dir, tmp_path):
    cases, make = _generator(fixtures_dir)

    def build(case):
        base = fixtures_dir / "models" / cases[case][0]
        return base, make(case, base, tmp_path / case)

    return build


def convert(peftc, adapter, out, *args):
    result = subprocess.run([str(peftc), "adapter", "convert", str(adapter), str(out), "--to", "lora",
                             *map(str, args), "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return {m["name"]: m for m in json.loads(result.stdout)["modules"]}


def products(out) -> dict:
    f = load_file(str(out / "adapter_model.safetensors"))
    names = sorted({k[len("base_model.model."):-len(".lora_A.weight")] for k in f if k.endswith(".lora_A.weight")})
    return {n: f[f"base_model.model.{n}.lora_B.weight"].astype(np.float64)
            @ f[f"base_model.model.{n}.lora_A.weight"].astype(np.float64) for n in names}


def peft_model(base, adapter):
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PeftModel.from_pretrained(load_model(base), str(adapter)).eval()


def peft_conversion(base, adapter, rank):
    from peft.tuners.lora.conversion import convert_to_lora

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config, state = convert_to_lora(peft_model(base, adapter), rank)
    names = sorted({k[len("base_model.model."):-len(".lora_A.weight")] for k in state if k.endswith(".lora_A.weight")})
    prods = {n: state[f"base_model.model.{n}.lora_B.weight"].double().numpy()
             @ state[f"base_model.model.{n}.lora_A.weight"].double().numpy() for n in names}
    return config, prods


def merged_deltas(base, adapter) -> dict:
    """PEFT's W' - W per adapted module, f64 of the f32 weights."""
    before = {k: v.detach().double().clone() for k, v in load_model(base).state_dict().items()}
    merged = peft_model(base, adapter).merge_and_unload().state_dict()
    return {k[: -len(".weight")]: (merged[k].double() - before[k]).numpy() for k in merged
            if k.endswith(".weight") and not torch.equal(merged[k].double(), before[k])}


def rel(x, y) -> float:
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def check_loads_in_peft(base, out):
    from peft import PeftModel, set_peft_model_state_dict
    from peft.utils import load_peft_weights

    model = PeftModel.from_pretrained(load_model(base), str(out))
    result = set_peft_model_state_dict(model, load_peft_weights(str(out)), adapter_name="default")
    assert [k for k in result.missing_keys if "lora_" in k] == [] and result.unexpected_keys == []


@pytest.mark.parametrize("case", ["llama_loha", "llama_lokr_decomposed"])
def test_fixed_rank_matches_peft_convert_to_lora(case, method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter(case)
    out = tmp_path / "lora"
    report = convert(peftc_binary, adapter, out, "--rank", 3)
    config, ref = peft_conversion(base, adapter, 3)
    ours = products(out)
    assert sorted(ours) == sorted(ref) == sorted(report)
    for name, p in ours.items():
        assert report[name]["rank"] == 3
        assert rel(p, ref[name]) < 1e-4, name
    written = json.loads((out / "adapter_config.json").read_text())
    assert written["peft_type"] == "LORA" and written["r"] == config.r == 3 and written["lora_alpha"] == 3
    assert set(written["target_modules"]) == set(config.target_modules)
    assert written["rank_pattern"] == config.rank_pattern == {}
    check_loads_in_peft(base, out)


def test_energy_ranks_match_peft(method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter("llama_loha")
    out = tmp_path / "lora"
    report = convert(peftc_binary, adapter, out, "--energy", 0.8)
    config, ref = peft_conversion(base, adapter, 0.8)
    assert {n: m["rank"] for n, m in report.items()} == config.rank_pattern
    written = json.loads((out / "adapter_config.json").read_text())
    assert written["rank_pattern"] == config.rank_pattern and written["alpha_pattern"] == config.alpha_pattern
    ours = products(out)
    for name, p in ours.items():
        assert rel(p, ref[name]) < 1e-4, name
    check_loads_in_peft(base, out)


def test_adalora_against_merged_delta(method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter("llama_adalora")
    out = tmp_path / "lora"
    report = convert(peftc_binary, adapter, out, "--rank", 1)
    deltas = merged_deltas(base, adapter)
    ours = products(out)
    assert sorted(ours) == sorted(deltas)
    for name, p in ours.items():
        assert abs(rel(p, deltas[name]) - report[name]["relative_error"]) < 1e-4, name
    assert max(m["relative_error"] for m in report.values()) > 0.01  # rank 1 of rank-2 deltas: lossy
    check_loads_in_peft(base, out)


def test_ia3_against_base(method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter("llama_ia3")
    deltas = merged_deltas(base, adapter)
    out = tmp_path / "lora"
    report = convert(peftc_binary, adapter, out, "--rank", 4, "--base", base)
    ours = products(out)
    assert sorted(ours) == sorted(deltas)
    for name, p in ours.items():
        assert report[name]["relative_error"] > 0.01, name  # W (l - 1) is full rank
        assert abs(rel(p, deltas[name]) - report[name]["relative_error"]) < 1e-4, name
    # At full rank the LoRA is dW itself.
    full = tmp_path / "full"
    report = convert(peftc_binary, adapter, full, "--energy", 1.0, "--base", base)
    for name, p in products(full).items():
        assert rel(p, deltas[name]) < 1e-5, name
        assert report[name]["relative_error"] < 1e-5
    check_loads_in_peft(base, full)


def test_ia3_refusals(method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter("llama_ia3")
    result = subprocess.run([str(peftc_binary), "adapter", "convert", str(adapter), str(tmp_path / "o"), "--to", "lora",
                             "--rank", "2"], capture_output=True, text=True)
    assert result.returncode != 0 and "IA3" in result.stderr and "base" in result.stderr, result.stderr
    assert "UNSUPPORTED" in result.stderr or "unsupported" in result.stderr.lower()
    base, adapter = method_adapter("gpt2_ia3")
    result = subprocess.run([str(peftc_binary), "adapter", "convert", str(adapter), str(tmp_path / "g"), "--to", "lora",
                             "--rank", "2", "--base", str(base)], capture_output=True, text=True)
    assert result.returncode != 0 and "bias" in result.stderr, result.stderr
