"""`peftc adapter export A OUT.gguf --format gguf --split-into BASE_OUT`, against llama.cpp and PEFT.

What a GGUF LoRA cannot hold (DoRA, lora_B.bias, modules_to_save) is merged into a copy of the base
(BASE_OUT) and the rest exported as the GGUF adapter. llama-export-lora applying OUT.gguf to BASE_OUT (as
GGUF: converted by convert_hf_to_gguf.py for a Hugging Face folder base) must equal PEFT's
merge_and_unload() converted by convert_hf_to_gguf.py (F32: <= 1e-6 relative), for a GGUF base and for a
Hugging Face folder base. Failures leave neither output behind.

The base is a tiny llama with attention biases (lora_B.bias needs a base bias; q and k biases are RoPE
permuted by the converter, like their weights) and untied embeddings; the adapters are made here with
PEFT, their parameters perturbed so that every part (B, DoRA magnitudes, lora_B.bias, the saved module
copies) matters.

Skipped (with the reason) when PEFT_LLAMA_CPP_BIN is not set; scripts/test.sh sets it.
"""

from __future__ import annotations

import json
import pathlib
import subprocess

import numpy as np
import pytest

from gguf_reference import convert_hf_to_gguf, export_lora, tensors, llama_cpp, peft_merged_gguf, relative_error

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"

# name -> LoraConfig arguments. A config is DoRA or not, lora_bias or not, for all its modules, so each
# adapter mixes one unrepresentable kind with plain pairs or whole modules.
ADAPTERS = {
    "plain_and_modules_to_save": dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                      "up_proj", "down_proj"],
                                      modules_to_save=["lm_head", "embed_tokens"], use_rslora=True),
    "dora_and_lm_head": dict(target_modules=["q_proj", "k_proj", "v_proj", "down_proj"], use_dora=True,
                             modules_to_save=["lm_head"]),
    "lora_bias": dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_bias=True),
}


def run_peftc(peftc: pathlib.Path, *args, expect: int = 0) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(peftc), *map(str, args)], capture_output=True, text=True)
    assert proc.returncode == expect, f"peftc {' '.join(map(str, args))}: exit {proc.returncode}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The base model folder and the adapter folders: (base, {name: adapter folder})."""
    llama_cpp()  # skip early without the reference tools
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("split")
    config = json.loads((FIXTURES / "models" / "llama" / "config.json").read_text())
    config.update(attention_bias=True, tie_word_embeddings=False)
    config.pop("transformers_version", None)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(".bias"):
                p.normal_(0.0, 0.1)  # transformers initialises biases to zero
    base = root / "base"
    model.save_pretrained(str(base))

    adapters = {}
    for i, (name, kwargs) in enumerate(ADAPTERS.items()):
        torch.manual_seed(100 + i)
        model = LlamaForCausalLM.from_pretrained(str(base), dtype=torch.float32)
        peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, **kwargs))
        with torch.no_grad():
            for pname, p in peft_model.named_parameters():
                if p.requires_grad:  # factors, magnitudes, lora_B.bias, the saved module copies
                    p.add_(torch.randn_like(p) * 0.05)
        folder = root / name
        peft_model.save_pretrained(str(folder))
        cfg = json.loads((folder / "adapter_config.json").read_text())
        cfg["base_model_name_or_path"] = str(base)
        (folder / "adapter_config.json").write_text(json.dumps(cfg))
        adapters[name] = folder
    return base, adapters


def assert_equals_peft(merged: pathlib.Path, base: pathlib.Path, adapter: pathlib.Path, tmp_path: pathlib.Path):
    reference = tensors(peft_merged_gguf(base, [(adapter, 1.0)], tmp_path / "peft_merged"))
    got, original = tensors(merged), tensors(convert_hf_to_gguf(base, outtype="f32"))
    assert got.keys() == reference.keys()
    changed = 0
    for name, (kind, ne, want) in reference.items():
        assert got[name][:2] == (kind, ne), name
        assert relative_error(got[name][2], want) <= 1e-6, name
        changed += not np.array_equal(original[name][2], want)
    assert changed > 0


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_split_with_gguf_base(peftc_binary, tmp_path, made, adapter):
    base, adapters = made
    base_gguf = convert_hf_to_gguf(base, outtype="f32")
    out, base_out = tmp_path / "adapter.gguf", tmp_path / "base_out.gguf"
    run_peftc(peftc_binary, "adapter", "export", adapters[adapter], out, "--format", "gguf", "--base", base_gguf,
              "--split-into", base_out)
    pairs = {name for name in tensors(out)}
    if adapter == "plain_and_modules_to_save":
        assert "blk.0.attn_q.weight.lora_a" in pairs and "blk.1.ffn_down.weight.lora_b" in pairs
    else:  # every LoRA module is DoRA or has lora_B.bias: merged whole
        assert pairs == set()
    assert_equals_peft(export_lora(base_out, [(out, 1.0)], tmp_path / "merged.gguf"), base, adapters[adapter],
                       tmp_path)


@pytest.mark.parametrize("adapter", list(ADAPTERS))
def test_split_with_hf_folder_base(peftc_binary, tmp_path, made, adapter):
    base, adapters = made
    out, base_out = tmp_path / "adapter.gguf", tmp_path / "base_out"
    run_peftc(peftc_binary, "adapter", "export", adapters[adapter], out, "--format", "gguf", "--base", base,
              "--split-into", base_out)
    assert (base_out / "config.json").is_file() and (base_out / "model.safetensors").is_file()
    merged = export_lora(convert_hf_to_gguf(base_out, outtype="f32"), [(out, 1.0)], tmp_path / "merged.gguf")
    assert_equals_peft(merged, base, adapters[adapter], tmp_path)


def test_split_adapter_equals_plain_export_of_the_rest(peftc_binary, tmp_path, made):
    """The exported part is what the plain export writes for those modules: the same pairs, byte for byte,
    as the export of the adapter without its modules_to_save."""
    base, adapters = made
    folder = adapters["plain_and_modules_to_save"]
    plain = tmp_path / "plain"
    plain.mkdir()
    cfg = json.loads((folder / "adapter_config.json").read_text())
    cfg["modules_to_save"] = None
    (plain / "adapter_config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file
    weights = {k: v for k, v in load_file(str(folder / "adapter_model.safetensors")).items()
               if "lora_" in k}
    save_file(weights, str(plain / "adapter_model.safetensors"))
    run_peftc(peftc_binary, "adapter", "export", plain, tmp_path / "want.gguf", "--format", "gguf")
    run_peftc(peftc_binary, "adapter", "export", folder, tmp_path / "got.gguf", "--format", "gguf",
              "--split-into", tmp_path / "base_out")
    assert (tmp_path / "got.gguf").read_bytes() == (tmp_path / "want.gguf").read_bytes()


def test_split_failures_leave_nothing(peftc_binary, tmp_path, made):
    base, adapters = made
    base_gguf = convert_hf_to_gguf(base, outtype="f32")
    out, base_out = tmp_path / "adapter.gguf", tmp_path / "base_out.gguf"
    # Trainable tokens are merged into safetensors checkpoints only: the merge into a GGUF base refuses
    # them after the adapter part was written under a temporary name.
    proc = run_peftc(peftc_binary, "adapter", "export", FIXTURES / "adapters" / "llama_trainable_tokens", out,
                     "--format", "gguf", "--base", base_gguf, "--split-into", base_out, expect=1)
    assert "UNSUPPORTED" in proc.stderr and "trainable" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    # The merged base may not be the base or the adapter file.
    proc = run_peftc(peftc_binary, "adapter", "export", adapters["lora_bias"], out, "--format", "gguf", "--base",
                     base_gguf, "--split-into", base_gguf, expect=1)
    assert "INVALID_ARGUMENT" in proc.stderr and "is the base" in proc.stderr
    proc = run_peftc(peftc_binary, "adapter", "export", adapters["lora_bias"], out, "--format", "gguf", "--base",
                     base_gguf, "--split-into", out, expect=1)
    assert "INVALID_ARGUMENT" in proc.stderr and "same path" in proc.stderr
    # A previous output stays as it was when the split fails.
    out.write_bytes(b"previous")
    run_peftc(peftc_binary, "adapter", "export", FIXTURES / "adapters" / "llama_trainable_tokens", out,
              "--format", "gguf", "--base", base_gguf, "--split-into", base_out, expect=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adapter.gguf"] and out.read_bytes() == b"previous"
