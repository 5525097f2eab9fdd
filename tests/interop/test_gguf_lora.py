"""PEFT LoRA adapters to GGUF and merges into GGUF bases, against llama.cpp itself.

- `peftc adapter export A OUT.gguf --format gguf`: llama-export-lora applied to peft_c's GGUF adapter
  gives the tensors of PEFT's merge_and_unload() converted by convert_hf_to_gguf.py (plain, rsLoRA and
  rank/alpha-pattern adapters: the scale llama.cpp applies is PEFT's); for plain adapters the file
  holds convert_lora_to_gguf.py's tensors exactly.
- `peftc merge --base BASE.gguf`: equals llama-export-lora on the same base and adapter (F32, F16).
- What GGUF cannot hold is refused with every module named.

Skipped (with the reason) when PEFT_LLAMA_CPP_BIN is not set; scripts/test.sh sets it.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from gguf_reference import (assert_same_lora_file, assert_same_merge, convert_hf_to_gguf, convert_lora_to_gguf,
                            export_lora, peft_merged_gguf, read_gguf, relative_error, run_peftc, tensors)

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
MODELS = FIXTURES / "models"
ADAPTERS = FIXTURES / "adapters"

# (base model, adapter): plain adapters of each architecture, and the llama ones whose scale is not
# lora_alpha / r (what convert_lora_to_gguf.py gets wrong).
EXACT_SCALE = [("llama", "llama_lora"), ("llama", "llama_rslora"), ("llama", "llama_rank_alpha_pattern"),
               ("llama", "llama_all_linear"), ("qwen2", "qwen2_lora"), ("gemma", "gemma_lora"),
               ("phi3", "phi3_lora")]
PLAIN = [("llama", "llama_lora"), ("qwen2", "qwen2_lora"), ("gemma", "gemma_lora"), ("phi3", "phi3_lora")]


def export_gguf(peftc, adapter: str, base: pathlib.Path, out: pathlib.Path, *extra: str) -> pathlib.Path:
    run_peftc(peftc, "adapter", "export", ADAPTERS / adapter, out, "--format", "gguf", "--base", base, *extra)
    return out


@pytest.mark.parametrize("model,adapter", EXACT_SCALE, ids=[a for _, a in EXACT_SCALE])
def test_exported_adapter_applies_peft_scale(peftc_binary, tmp_path, model, adapter):
    base_gguf = convert_hf_to_gguf(MODELS / model, outtype="f32")
    ours = export_gguf(peftc_binary, adapter, MODELS / model, tmp_path / "adapter.gguf")
    merged = export_lora(base_gguf, [(ours, 1.0)], tmp_path / "merged.gguf")

    reference = tensors(peft_merged_gguf(MODELS / model, [(ADAPTERS / adapter, 1.0)], tmp_path / "peft_merged"))
    got, base = tensors(merged), tensors(base_gguf)

    assert got.keys() == reference.keys()
    changed = 0
    for name, (kind, ne, want) in reference.items():
        assert got[name][:2] == (kind, ne), name
        assert relative_error(got[name][2], want) <= 1e-6, name
        changed += not np.array_equal(base[name][2], want)
    assert changed > 0  # the adapter did change the model


@pytest.mark.parametrize("model,adapter", PLAIN, ids=[a for _, a in PLAIN])
def test_plain_adapter_equals_convert_lora_to_gguf(peftc_binary, tmp_path, model, adapter):
    ours = export_gguf(peftc_binary, adapter, MODELS / model, tmp_path / "ours.gguf")
    assert_same_lora_file(ours, convert_lora_to_gguf(ADAPTERS / adapter, MODELS / model, outtype="f32"))


def test_gguf_base_works_like_hf_base(peftc_binary, tmp_path):
    """The base may be the GGUF model itself: same file as with the Hugging Face folder."""
    from_hf = export_gguf(peftc_binary, "llama_rslora", MODELS / "llama", tmp_path / "a.gguf")
    from_gguf = export_gguf(peftc_binary, "llama_rslora", convert_hf_to_gguf(MODELS / "llama", outtype="f16"),
                            tmp_path / "b.gguf")
    assert from_hf.read_bytes() == from_gguf.read_bytes()


@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0"])
def test_factor_types_equal_convert_lora_to_gguf(peftc_binary, tmp_path, outtype):
    ours = export_gguf(peftc_binary, "llama_lora", MODELS / "llama", tmp_path / "ours.gguf", "--dtype", outtype)
    assert_same_lora_file(ours, convert_lora_to_gguf(ADAPTERS / "llama_lora", MODELS / "llama", outtype=outtype))


def test_unrepresentable_modules_are_refused(peftc_binary, tmp_path):
    proc = run_peftc(peftc_binary, "adapter", "export", ADAPTERS / "llama_dora", tmp_path / "x.gguf", "--format",
                     "gguf", "--base", MODELS / "llama", expect=1)
    assert "UNSUPPORTED" in proc.stderr and "DoRA" in proc.stderr and "q_proj" in proc.stderr
    proc = run_peftc(peftc_binary, "adapter", "export", ADAPTERS / "qwen2_lora_bias", tmp_path / "y.gguf", "--format",
                     "gguf", "--base", MODELS / "qwen2", expect=1)
    assert "UNSUPPORTED" in proc.stderr and "lora_B.bias" in proc.stderr
    assert not (tmp_path / "x.gguf").exists() and not (tmp_path / "y.gguf").exists()


# --- merges into GGUF bases ------------------------------------------------------------------------------

MERGES = [("llama", "f32", [("llama_lora", 1.0)]), ("llama", "f16", [("llama_lora", 1.0)]),
          ("llama", "f32", [("llama_lora", 1.0), ("llama_lora_second", -0.5)]),
          ("qwen2", "f32", [("qwen2_lora", 1.0)]), ("qwen2", "f16", [("qwen2_lora", 1.0)]),
          ("phi3", "f32", [("phi3_lora", 0.7)]), ("gemma", "f16", [("gemma_lora", 1.0)])]


@pytest.mark.parametrize("model,outtype,adapters", MERGES,
                         ids=[f"{m}-{t}-{'+'.join(a for a, _ in ads)}" for m, t, ads in MERGES])
def test_merge_into_gguf_base_equals_llama_export_lora(peftc_binary, tmp_path, model, outtype, adapters):
    base = convert_hf_to_gguf(MODELS / model, outtype=outtype)
    reference = export_lora(base, [(convert_lora_to_gguf(ADAPTERS / a, MODELS / model), w) for a, w in adapters])
    out = tmp_path / "merged.gguf"
    args = ["merge", "--base", base, "--out", out]
    for a, w in adapters:
        args += ["--adapter", f"{ADAPTERS / a}:{w!r}"]
    run_peftc(peftc_binary, *args)

    assert assert_same_merge(out, reference, base) > 0


def test_merge_into_gguf_base_refuses_before_writing(peftc_binary, tmp_path):
    base = convert_hf_to_gguf(MODELS / "llama", outtype="f32")
    out = tmp_path / "merged.gguf"
    proc = run_peftc(peftc_binary, "merge", "--base", base, "--out", out, "--adapter", ADAPTERS / "llama_trainable_tokens",
                     expect=1)
    assert "UNSUPPORTED" in proc.stderr and "trainable" in proc.stderr
    proc = run_peftc(peftc_binary, "merge", "--base", base, "--out", out, "--adapter", ADAPTERS / "gpt2_lora",
                     expect=1)
    assert "UNRESOLVED_KEY" in proc.stderr and "c_attn" in proc.stderr
    proc = run_peftc(peftc_binary, "merge", "--base", base, "--out", out, "--adapter", ADAPTERS / "llama_lora",
                     "--dtype", "bf16", "--quant", "Q8_0", expect=1)
    assert "INVALID_ARGUMENT" in proc.stderr
    assert not out.exists()
