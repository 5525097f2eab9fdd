"""Inspection of every supported method's adapters (`peftc doctor --json`, `peftc adapter inspect --json`),
and LyCORIS / kohya LoHa and LoKr files told apart from PEFT adapter folders.

* PEFT adapters of LoHa, LoKr, AdaLoRA, IA3, MiSS, SHiRA, VeRA, RandLoRA, FourierFT, OFT, BOFT, HRA,
  VB-LoRA, C3A, LN tuning and trainable tokens, made by the real peft
  package (tests/fixtures/generator/method_adapters.py): the doctor finds no problem, reports each
  module's method ("LOHA", ...) and kind, and renames nothing; `adapter inspect` reports the
  peft_type and the module set (norm replacements as `full`, token rows as `trainable_tokens`);
* synthetic LyCORIS / kohya files written here with the safetensors package (no adapter_config.json,
  `<module>.hada_w1_a`..., `lokr_w1`/`lokr_w2`, per-module `alpha` scalars, `dora_scale`): reported as
  `lycoris_method` ("LyCORIS/kohya LoHa, not a PEFT adapter folder"), method LYCORIS_LOHA / LYCORIS_LOKR;
* DoRA magnitudes: PEFT's `lora_magnitude_vector` [out] is reported as such with no problem; a
  LyCORIS `dora_scale` [1, in] (wd_on_out=False) or [out, 1] (wd_on_out=True) is `dora_convention`,
  its message naming the convention its shape shows, never read as PEFT's magnitude.

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

MODULE = "model.layers.0.self_attn.q_proj"  # tiny llama: hidden 16, q_proj [16, 16]


def doctor(peftc, adapter, base):
    proc = subprocess.run([str(peftc), "doctor", "--json", "--adapter", str(adapter), "--base", str(base)],
                          capture_output=True, text=True)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def make(fixtures_dir, case, out):
    sys.path.insert(0, str(fixtures_dir))
    from generator.method_adapters import CASES, make_method_adapter

    base = fixtures_dir / "models" / CASES[case][0]
    return base, make_method_adapter(case, base, out)


@pytest.mark.parametrize("case,method,kind", [
    ("llama_loha", "LOHA", "linear"), ("llama_lokr_decomposed", "LOKR", "linear"), ("llama_lokr_full", "LOKR", "linear"),
    ("llama_adalora", "ADALORA", "linear"), ("llama_ia3", "IA3", "linear"), ("gpt2_ia3", "IA3", "linear"),
    ("llama_miss", "MISS", "linear"), ("llama_miss_bat", "MISS", "linear"), ("llama_shira", "SHIRA", "linear"),
    ("llama_vera", "VERA", "linear"), ("gpt2_vera", "VERA", "linear"), ("llama_randlora", "RANDLORA", "linear"),
    ("gpt2_randlora", "RANDLORA", "linear"), ("llama_fourierft", "FOURIERFT", "linear"),
    ("gpt2_fourierft", "FOURIERFT", "linear"), ("llama_oft", "OFT", "linear"), ("llama_oft_share", "OFT", "linear"),
    ("llama_boft", "BOFT", "linear"), ("llama_hra", "HRA", "linear"),
    ("llama_vblora", "VBLORA", "linear"), ("llama_vblora_topk", "VBLORA", "linear"),
    ("llama_c3a", "C3A", "linear"),
    ("llama_ln_tuning", None, "full"), ("llama_trainable_tokens", None, "trainable_tokens"),
])
def test_peft_method_adapters_are_clean(case, method, kind, fixtures_dir, peftc_binary, tmp_path):
    base, adapter = make(fixtures_dir, case, tmp_path / case)
    status, report = doctor(peftc_binary, adapter, base)
    assert status == 0 and report["summary"]["ok"], report["problems"]
    assert report["renames"] == [] and report["modules"]
    for m in report["modules"]:
        assert m["method"] == method, m
        if kind != "linear":
            assert m["kind"] == kind, m
    if case.startswith(("llama_loha", "llama_lokr")):
        assert all(m["alpha"] is not None and m["scaling"] for m in report["modules"])
    if case in ("llama_loha", "llama_lokr_decomposed"):  # lokr_full stores w1, w2 whole: no rank in the tensors
        assert all(m["rank"] for m in report["modules"])

    proc = subprocess.run([str(peftc_binary), "adapter", "inspect", str(adapter), "--json"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    listed = json.loads(proc.stdout)
    saved = json.loads((adapter / "adapter_config.json").read_text())
    assert listed["peft_type"] == saved["peft_type"]
    assert sorted(m["module"] for m in listed["modules"]) == sorted(m["module"] for m in report["modules"])
    if kind != "linear":
        assert {m["kind"] for m in listed["modules"]} == {kind}


def _lycoris(tmp_path, name, tensors):
    folder = tmp_path / name
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "adapter_model.safetensors"))
    return folder


def _kinds(report):
    return {p["kind"] for p in report["problems"]}


def test_lycoris_loha_file_is_reported(fixtures_dir, peftc_binary, tmp_path):
    g = torch.Generator().manual_seed(0)
    t = {f"{MODULE}.{p}": torch.randn(shape, generator=g) for p, shape in
         (("hada_w1_a", (16, 2)), ("hada_w1_b", (2, 16)), ("hada_w2_a", (16, 2)), ("hada_w2_b", (2, 16)))}
    t[f"{MODULE}.alpha"] = torch.tensor(4.0)
    folder = _lycoris(tmp_path, "loha", t)
    status, report = doctor(peftc_binary, folder, fixtures_dir / "models" / "llama")
    assert status == 1
    assert "lycoris_method" in _kinds(report) and "unmatched_key" not in _kinds(report), report["problems"]
    (problem,) = [p for p in report["problems"] if p["kind"] == "lycoris_method"]
    assert "LyCORIS/kohya LoHa, not a PEFT adapter folder" in problem["message"]
    assert problem["modules"] == [MODULE] and f"{MODULE}.alpha" in problem["keys"]
    (module,) = report["modules"]
    assert module["method"] == "LYCORIS_LOHA" and module["rank"] == 2 and module["alpha"] == 4.0
    assert module["dora"] is None


@pytest.mark.parametrize("wd_on_out", [False, True])
def test_lycoris_lokr_with_dora_scale(wd_on_out, fixtures_dir, peftc_binary, tmp_path):
    g = torch.Generator().manual_seed(1)
    scale_shape = (16, 1) if wd_on_out else (1, 16)
    t = {f"{MODULE}.lokr_w1": torch.randn(4, 4, generator=g), f"{MODULE}.lokr_w2": torch.randn(4, 4, generator=g),
         f"{MODULE}.alpha": torch.tensor(1.0), f"{MODULE}.dora_scale": torch.rand(scale_shape, generator=g)}
    status, report = doctor(peftc_binary, _lycoris(tmp_path, "lokr", t), fixtures_dir / "models" / "llama")
    assert status == 1
    assert {"lycoris_method", "dora_convention"} <= _kinds(report), report["problems"]
    (module,) = report["modules"]
    assert module["method"] == "LYCORIS_LOKR" and module["dora"] == "dora_scale"
    (dora,) = [p for p in report["problems"] if p["kind"] == "dora_convention"]
    assert ("wd_on_out=True" if wd_on_out else "wd_on_out=False") in dora["message"]
    assert "lora_magnitude_vector [out]" in dora["message"] and dora["fix"] is None


def test_kohya_lora_dora_scale_is_not_a_magnitude(fixtures_dir, peftc_binary, tmp_path):
    g = torch.Generator().manual_seed(2)
    t = {f"{MODULE}.lora_down.weight": torch.randn(4, 16, generator=g),
         f"{MODULE}.lora_up.weight": torch.randn(16, 4, generator=g),
         f"{MODULE}.alpha": torch.tensor(4.0), f"{MODULE}.dora_scale": torch.rand(1, 16, generator=g)}
    status, report = doctor(peftc_binary, _lycoris(tmp_path, "kohya_dora", t), fixtures_dir / "models" / "llama")
    assert status == 1
    (module,) = report["modules"]
    assert module["dora"] == "dora_scale" and module["method"] == "LORA"
    (dora,) = [p for p in report["problems"] if p["kind"] == "dora_convention"]
    assert "wd_on_out=False" in dora["message"]
    assert all(r["to"] is None or "magnitude" not in r["to"] for r in report["renames"])


def test_peft_dora_magnitude_is_reported_as_peft(fixtures_dir, peftc_binary, tmp_path):
    import peft
    import transformers

    base = fixtures_dir / "models" / "llama"
    model = transformers.AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], use_dora=True)
    peft.get_peft_model(model, config).save_pretrained(str(tmp_path / "dora"))
    status, report = doctor(peftc_binary, tmp_path / "dora", base)
    assert status == 0, report["problems"]
    assert {m["dora"] for m in report["modules"]} == {"lora_magnitude_vector"}
    assert "dora_convention" not in _kinds(report)
