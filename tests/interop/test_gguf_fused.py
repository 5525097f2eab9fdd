"""GGUF adapters, merges and imports for the architectures whose GGUF weights llama.cpp's converter
transforms: GPT-2 (Conv1D weights transposed to [out, in]), GPT-NeoX and BLOOM (fused query_key_value
rows from per-head [q, k, v] to [all q; all k; all v]) and Falcon (the same from key/value groups).

For tiny random models of each, made here with transformers and converted by convert_hf_to_gguf.py:
- llama-export-lora applied to peft_c's GGUF adapter gives the tensors of PEFT's merge_and_unload()
  converted by convert_hf_to_gguf.py (F32, <= 1e-6 relative);
- `peftc merge --base BASE.gguf` equals llama-export-lora (F32 and F16 bases);
- GGUF -> PEFT: PEFT loads the import cleanly, and its merge equals llama.cpp's and the original's;
- a Falcon whose fused query_key_value the converter cannot reorder is refused, naming the module.

Skipped (with the reason) when PEFT_LLAMA_CPP_BIN is not set; scripts/test.sh sets it.
"""

from __future__ import annotations

import pathlib
import warnings

import numpy as np
import pytest
import torch

from gguf_reference import convert_hf_to_gguf, export_lora
from merge_support import peft_merged
from test_gguf_import import assert_imported_merge_equals_llama_cpp, gguf_of_peft_merge, import_gguf
from test_gguf_lora import ADAPTERS, MODELS, relative_error, run_peftc, tensors

# name: (transformers config class, its arguments, LoraConfig arguments). Every head count differs
# from its key/value count or is > 1, so a wrong row order changes the result.
CASES = {
    # n_ctx: read by the GPT-2 converter, no longer a GPT2Config field.
    "gpt2": ("GPT2Config", dict(n_embd=16, n_head=2, n_layer=2, vocab_size=64, n_positions=32, n_ctx=32,
                                bos_token_id=0, eos_token_id=0),
             dict(target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True)),
    "gpt_neox": ("GPTNeoXConfig", dict(hidden_size=16, num_attention_heads=4, num_hidden_layers=2,
                                       intermediate_size=32, vocab_size=64, max_position_embeddings=32),
                 dict(target_modules=["query_key_value", "dense", "dense_h_to_4h", "dense_4h_to_h"])),
    "bloom": ("BloomConfig", dict(hidden_size=16, n_head=4, n_layer=2, vocab_size=64),
              dict(target_modules=["query_key_value", "dense_4h_to_h"], use_rslora=True)),
    # Falcon-40B's layout: groups of 2 query heads, one key and one value head.
    "falcon_grouped": ("FalconConfig", dict(hidden_size=32, num_attention_heads=8, num_kv_heads=2,
                                            new_decoder_architecture=True, num_hidden_layers=2, vocab_size=64),
                       dict(target_modules=["query_key_value", "dense"], rank_pattern={"query_key_value": 2},
                            alpha_pattern={"dense": 3})),
    # Falcon-RW's layout: per head [q, k, v] (as many key/value heads as attention heads).
    "falcon_per_head": ("FalconConfig", dict(hidden_size=16, num_attention_heads=4, multi_query=False,
                                             new_decoder_architecture=False, num_hidden_layers=2, vocab_size=64),
                        dict(target_modules=["query_key_value", "dense_h_to_4h"])),
}


@pytest.fixture(scope="session")
def fused_models(tmp_path_factory) -> dict[str, tuple[pathlib.Path, pathlib.Path]]:
    """name -> (model folder, PEFT adapter folder), seeded: random weights and random nonzero LoRA factors."""
    import transformers
    from peft import LoraConfig, get_peft_model

    root = tmp_path_factory.mktemp("fused")
    out = {}
    for name, (config_class, config_args, lora_args) in CASES.items():
        torch.manual_seed(sum(map(ord, name)))
        config = getattr(transformers, config_class)(**config_args)
        model_dir, adapter_dir = root / name, root / f"{name}_lora"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            transformers.AutoModelForCausalLM.from_config(config).save_pretrained(str(model_dir))
            model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir))
            peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, **lora_args))
        with torch.no_grad():  # B of a typical size, so that the merged weights differ well above rounding
            for param_name, param in peft_model.named_parameters():
                if "lora_B" in param_name:
                    param.normal_(0.0, 0.5)
        peft_model.save_pretrained(str(adapter_dir))
        out[name] = (model_dir, adapter_dir)
    return out


def export_gguf(peftc, adapter: pathlib.Path, base: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    run_peftc(peftc, "adapter", "export", adapter, out, "--format", "gguf", "--base", base)
    return out


def assert_close_and_changed(got: dict, reference: dict, base: dict) -> None:
    assert got.keys() == reference.keys()
    changed = 0
    for name, (kind, ne, want) in reference.items():
        assert got[name][:2] == (kind, ne), name
        assert relative_error(got[name][2], want) <= 1e-6, name
        changed += not np.array_equal(base[name][2], want)
    assert changed > 0  # the adapter did change the model


@pytest.mark.parametrize("name", list(CASES))
def test_exported_adapter_applies_like_peft_merge(peftc_binary, fused_models, tmp_path, name):
    model, adapter = fused_models[name]
    base_gguf = convert_hf_to_gguf(model, outtype="f32")
    ours = export_gguf(peftc_binary, adapter, model, tmp_path / "adapter.gguf")
    got = tensors(export_lora(base_gguf, [(ours, 1.0)], tmp_path / "merged.gguf"))
    # test_gguf_import's helpers take a fixture model name; an absolute folder stands for itself.
    reference = gguf_of_peft_merge(model, adapter, tmp_path / "peft_merged")
    assert_close_and_changed(got, reference, tensors(base_gguf))


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_base_gives_the_same_adapter(peftc_binary, fused_models, tmp_path, name):
    """Head counts from the GGUF base's metadata reorder as those from config.json do."""
    model, adapter = fused_models[name]
    from_hf = export_gguf(peftc_binary, adapter, model, tmp_path / "a.gguf")
    from_gguf = export_gguf(peftc_binary, adapter, convert_hf_to_gguf(model, outtype="f16"), tmp_path / "b.gguf")
    assert from_hf.read_bytes() == from_gguf.read_bytes()


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("name", list(CASES))
def test_merge_into_gguf_base_equals_llama_export_lora(peftc_binary, fused_models, tmp_path, name, outtype):
    model, adapter = fused_models[name]
    base = convert_hf_to_gguf(model, outtype=outtype)
    ours = export_gguf(peftc_binary, adapter, model, tmp_path / "adapter.gguf")
    want = tensors(export_lora(base, [(ours, 0.75)], tmp_path / "reference.gguf"))
    out = tmp_path / "merged.gguf"
    run_peftc(peftc_binary, "merge", "--base", base, "--out", out, "--adapter", f"{adapter}:0.75")
    got, before = tensors(out), tensors(base)
    assert got.keys() == want.keys()
    changed = 0
    for tensor, (kind, ne, values) in want.items():
        assert got[tensor][:2] == (kind, ne), tensor
        if np.array_equal(before[tensor][2], values):
            assert np.array_equal(got[tensor][2], values), tensor
            continue
        changed += 1
        if kind == "F32":
            assert relative_error(got[tensor][2], values) <= 1e-6, tensor
        else:  # both round the same f32 sum once; the sums may differ in their last bits
            steps = np.abs(got[tensor][2].view(np.int16).astype(np.int32) - values.view(np.int16).astype(np.int32))
            assert steps.max() <= 1, tensor
    assert changed > 0


@pytest.mark.parametrize("name", list(CASES))
def test_import_round_trip(peftc_binary, fused_models, tmp_path, name):
    model, adapter = fused_models[name]
    ours = export_gguf(peftc_binary, adapter, model, tmp_path / "adapter.gguf")
    # Loads cleanly in PEFT; its merge equals llama-export-lora's merge of the GGUF adapter.
    assert_imported_merge_equals_llama_cpp(peftc_binary, tmp_path, model, ours)
    # And the original's merge.
    folder = import_gguf(peftc_binary, ours, model, tmp_path / "again")
    want = peft_merged(model, [(adapter, 1.0)]).state_dict()
    got = peft_merged(model, [(folder, 1.0)]).state_dict()
    assert got.keys() == want.keys()
    for tensor, value in want.items():
        assert relative_error(got[tensor].to(torch.float64).numpy(), value.to(torch.float64).numpy()) <= 1e-6, tensor


def test_unconvertible_fused_qkv_is_refused(peftc_binary, tmp_path):
    """The Falcon fixture is multi-query (one key/value head) but its config.json says num_kv_heads 2, which
    is what llama.cpp's converter reads: its reorder cannot apply to the 32 rows, and neither can ours."""
    out = tmp_path / "x.gguf"
    proc = run_peftc(peftc_binary, "adapter", "export", ADAPTERS / "falcon_lora", out, "--format", "gguf",
                     "--base", MODELS / "falcon", expect=1)
    assert "transformer.h.0.self_attention.query_key_value" in proc.stderr
    assert "32 rows are not 2 query + 2 key + 2 value heads" in proc.stderr
    assert not out.exists()
