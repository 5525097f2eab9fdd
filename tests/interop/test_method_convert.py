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
  fails naming IA3 and the base; an IA3 layer that also scales a bias (GPT-2's c_attn) is refused;
* VeRA, RandLoRA, FourierFT and SHiRA (additive, their layer shapes from --base), llama and GPT-2
  Conv1D: the reported error is B A's against PEFT's merged delta and equals a numpy SVD's truncation
  error of that delta, PEFT loads the result and its merge is off by that error, energy 1 reproduces
  the delta, and where PEFT's convert_to_lora takes the method (VeRA, RandLoRA, FourierFT on Linear)
  its products are ours; without --base they are refused naming the method and --base;
* MiSS (standard and mini): exact, without an SVD, at MiSS's rank whatever rank is asked, the very
  factors of PEFT's convert_to_lora, with the rank in rank_pattern / alpha_pattern as PEFT writes it;
* `peftc adapter export` of a non-LoRA adapter is UNSUPPORTED naming the method and pointing to
  `peftc adapter convert ... --to lora` (with --base where the method needs it).

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


# The additive methods the merge takes beyond LoHa / LoKr / AdaLoRA: their layer's features come from
# the base (--base). gpt2's are Conv1D layers (dW stored [in, out]).
ADDITIVE = ["llama_vera", "gpt2_vera", "llama_randlora", "gpt2_randlora", "llama_fourierft", "gpt2_fourierft",
            "llama_shira"]
PEFT_CONVERTS = {"llama_vera", "gpt2_vera", "llama_randlora", "gpt2_randlora", "llama_fourierft"}


def numpy_truncation(delta: np.ndarray, rank: int):
    """The truncated SVD of dW in f64: the rank-`rank` product (None when the singular values at the
    cut are equal within 1e-3 relative, which leaves the product undetermined: FourierFT's real
    spectra give pairs) and its relative error."""
    u, s, vt = np.linalg.svd(delta, full_matrices=False)
    product = (u[:, :rank] * s[:rank]) @ vt[:rank]
    unique = rank >= len(s) or s[rank - 1] - s[rank] > 1e-3 * s[0]
    return product if unique else None, float(np.sqrt(np.sum(s[rank:] ** 2)) / np.sqrt(np.sum(s ** 2)))


def out_in(base, deltas):
    """PEFT's W' - W in [out, in] order (GPT-2's Conv1D weights are stored [in, out])."""
    return {n: d.T for n, d in deltas.items()} if base.name == "gpt2" else deltas


@pytest.mark.parametrize("case", ADDITIVE)
def test_additive_methods_against_numpy_svd(case, method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter(case)
    deltas = out_in(base, merged_deltas(base, adapter))
    out = tmp_path / "lora"
    report = convert(peftc_binary, adapter, out, "--rank", 3, "--base", base)
    ours = products(out)
    assert sorted(ours) == sorted(deltas) == sorted(report)
    lossy, determined = 0, set()
    for name, p in ours.items():
        assert report[name]["rank"] == 3
        truncated, error = numpy_truncation(deltas[name], 3)
        # the reported error is B A's against PEFT's dW, and is the numpy SVD's own truncation error
        assert abs(rel(p, deltas[name]) - report[name]["relative_error"]) < 1e-4, name
        assert abs(report[name]["relative_error"] - error) < 1e-4, (name, report[name], error)
        if truncated is not None:
            assert rel(p, truncated) < 1e-3, name
            determined.add(name)
        lossy += error > 0.01
    assert determined  # some module's product is determined and compared
    if case == "gpt2_vera":  # r = 3: VeRA's dW = diag(b) B diag(d) A has rank 3, so rank 3 holds it
        assert all(m["relative_error"] < 1e-5 for m in report.values()), report
    else:  # rank 3 of these deltas loses something: the comparison means something
        assert lossy > 0
    written = json.loads((out / "adapter_config.json").read_text())
    assert written["peft_type"] == "LORA" and written["r"] == written["lora_alpha"] == 3
    assert written["fan_in_fan_out"] == (base.name == "gpt2")
    check_loads_in_peft(base, out)
    # PEFT's merge of the converted LoRA is W + B A: the merged weights are off by the reported error.
    converted = out_in(base, merged_deltas(base, out))
    for name, d in converted.items():
        assert abs(rel(d, deltas[name]) - report[name]["relative_error"]) < 1e-4, name
    # PEFT 0.21's own convert_to_lora takes VeRA, RandLoRA and FourierFT on Linear layers (not FourierFT
    # on Conv1D, whose get_delta_weight is not transposed, nor SHiRA's sparse delta): the same products.
    if case in PEFT_CONVERTS:
        config, ref = peft_conversion(base, adapter, 3)
        assert sorted(ref) == sorted(ours) and config.r == 3
        for name, p in ours.items():
            if name in determined:
                assert rel(p, ref[name]) < 1e-3, name
            else:  # equal singular values at the cut: another product, the same error
                assert abs(rel(ref[name], deltas[name]) - report[name]["relative_error"]) < 1e-4, name
    else:
        with pytest.raises(TypeError):
            peft_conversion(base, adapter, 3)
    # At full rank (energy 1) the LoRA is dW itself.
    full = tmp_path / "full"
    report = convert(peftc_binary, adapter, full, "--energy", 1.0, "--base", base)
    for name, p in products(full).items():
        assert rel(p, deltas[name]) < 1e-5, name


def test_additive_methods_need_a_base(method_adapter, peftc_binary, tmp_path):
    for case, method in [("llama_vera", "VERA"), ("llama_shira", "SHIRA"), ("llama_miss", "MISS")]:
        _, adapter = method_adapter(case)
        result = subprocess.run([str(peftc_binary), "adapter", "convert", str(adapter), str(tmp_path / (case + "_lora")), "--to",
                                 "lora", "--rank", "2"], capture_output=True, text=True)
        assert result.returncode != 0 and method in result.stderr and "--base" in result.stderr, result.stderr


@pytest.mark.parametrize("case", ["llama_miss", "llama_miss_mini"])
def test_miss_converts_exactly(case, method_adapter, peftc_binary, tmp_path):
    """MiSS's standard and mini forms are LoRA products already: PEFT's convert_to_lora writes them at
    MiSS's own rank without an SVD (lora_A sums the r-column blocks, lora_B is the block transposed),
    whatever rank is asked, and so do we."""
    base, adapter = method_adapter(case)
    r = 3 if case == "llama_miss" else 4
    deltas = merged_deltas(base, adapter)
    out = tmp_path / "lora"
    report = convert(peftc_binary, adapter, out, "--rank", 2, "--base", base)
    ours = products(out)
    assert sorted(ours) == sorted(deltas)
    for name, p in ours.items():
        assert report[name]["rank"] == r and report[name]["relative_error"] == 0.0
        assert rel(p, deltas[name]) < 1e-7, name
    written = json.loads((out / "adapter_config.json").read_text())
    assert written["r"] == 2 and written["rank_pattern"] == written["alpha_pattern"] == {n: r for n in ours}
    check_loads_in_peft(base, out)
    converted = merged_deltas(base, out)
    for name, d in converted.items():
        assert rel(d, deltas[name]) < 1e-6, name
    # PEFT's own conversion: the same factors and config
    config, state = peft_state(base, adapter, 2)
    f = load_file(str(out / "adapter_model.safetensors"))
    for name in ours:
        for factor in ("lora_A", "lora_B"):
            key = f"base_model.model.{name}.{factor}.weight"
            np.testing.assert_array_equal(f[key], state[key].numpy(), err_msg=key)
    assert config.rank_pattern == written["rank_pattern"] and config.alpha_pattern == written["alpha_pattern"]
    # an energy fraction does not change it either
    energy = convert(peftc_binary, adapter, tmp_path / "energy", "--energy", 0.5, "--base", base)
    assert {m["rank"] for m in energy.values()} == {r}


def peft_state(base, adapter, rank):
    from peft.tuners.lora.conversion import convert_to_lora

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return convert_to_lora(peft_model(base, adapter), rank)


@pytest.mark.parametrize("case", ["llama_ia3", "llama_miss", "llama_vera", "llama_oft", "llama_loha",
                                  "llama_ln_tuning", "llama_trainable_tokens"])
def test_export_names_the_method(case, method_adapter, peftc_binary, tmp_path):
    """`peftc adapter export` writes LoRA adapters only: another method is UNSUPPORTED naming it and
    pointing to the conversion (against the base where the method needs one)."""
    base, adapter = method_adapter(case)
    result = subprocess.run([str(peftc_binary), "adapter", "export", str(adapter), str(tmp_path / "out")],
                            capture_output=True, text=True)
    method = {"llama_ia3": "IA3", "llama_miss": "MISS", "llama_vera": "VERA", "llama_oft": "OFT", "llama_loha": "LOHA",
              "llama_ln_tuning": "LN_TUNING", "llama_trainable_tokens": "TRAINABLE_TOKENS"}[case]
    assert result.returncode != 0 and "UNSUPPORTED" in result.stderr, result.stderr
    assert f"is a {method} adapter" in result.stderr and "LoRA adapters only" in result.stderr, result.stderr
    assert "alpha" not in result.stderr and "rank_pattern" not in result.stderr, result.stderr
    if case in ("llama_ln_tuning", "llama_trainable_tokens"):
        assert "adapter convert" not in result.stderr
    else:
        assert "peftc adapter convert IN OUT --to lora" in result.stderr
        assert ("--base" in result.stderr) == (case != "llama_loha"), result.stderr
    assert not (tmp_path / "out" / "adapter_config.json").exists()
