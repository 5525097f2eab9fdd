"""`peftc merge` against PEFT's merge_and_unload() on the tiny fixture models.

For each case the base folder and adapters are merged by `peftc merge`; PEFT merges the same
adapters into the same base (PeftModel.from_pretrained + merge_and_unload, or for several weighted
adapters add_weighted_adapter(combination_type="cat") + set_adapter + merge_and_unload, which sums
the weighted deltas exactly before one merge; see merge_support.peft_merged), and transformers'
save_pretrained writes the reference folder. Then:

* the tensors of both folders have the same names, dtypes and shapes;
* f32 weights agree within 1e-6 relative to each tensor's largest value; bf16/f16 weights are at
  most 1 ulp apart everywhere, and each is our f32 result rounded once: the same merge with
  `--dtype f32`, converted by torch (round to nearest even), gives them bit for bit. (How many
  elements equal PEFT's depends on torch's arithmetic on the machine, so it is not asserted.)
* the peftc output, loaded by transformers as it is, gives logits equal to PEFT's merged model:
  max |difference| <= 1e-5 x max |logits| (f32);
* config.json is the base's, with only `dtype` / `tie_word_embeddings` changed where documented.

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA.
"""

from __future__ import annotations

import json
import pathlib
import warnings
from dataclasses import dataclass, field

import pytest
import torch

from merge_support import (compare_weights, file_tensors, load_model, peft_merged, relative_logit_error,
                           run_merge, saved_tensors)


@dataclass
class Case:
    id: str
    base: str
    adapters: list  # (fixture adapter name, weight)
    args: list = field(default_factory=list)
    to_dtype: torch.dtype | None = None  # reference: PEFT's merged model converted to this dtype
    load_dtype: torch.dtype | None = None  # reference: the base loaded in this dtype


CASES = [
    Case("llama_plain", "llama", [("llama_lora", 1.0)]),
    Case("llama_rslora", "llama", [("llama_rslora", 1.0)]),
    Case("llama_rank_alpha_pattern", "llama", [("llama_rank_alpha_pattern", 1.0)]),
    Case("llama_dora", "llama", [("llama_dora", 1.0)]),
    Case("llama_embedding_and_lm_head", "llama", [("llama_embedding", 1.0)]),
    Case("llama_trainable_tokens", "llama", [("llama_trainable_tokens", 1.0)]),
    Case("llama_all_linear", "llama", [("llama_all_linear", 1.0)]),
    Case("llama_two_weighted", "llama", [("llama_lora", 0.7), ("llama_lora_second", -0.4)]),
    Case("llama_one_weighted", "llama", [("llama_lora", 2.5)]),
    Case("llama_bf16_base", "llama_bf16", [("llama_bf16_lora", 1.0)]),
    Case("llama_f16_base", "llama_f16", [("llama_f16_lora", 1.0)]),
    Case("llama_to_bf16", "llama", [("llama_lora", 1.0)], ["--dtype", "bf16"], to_dtype=torch.bfloat16),
    Case("llama_to_f16", "llama", [("llama_dora", 1.0)], ["--dtype", "f16"], to_dtype=torch.float16),
    Case("llama_f16_to_f32", "llama_f16", [("llama_f16_lora", 1.0)], ["--dtype", "f32"], load_dtype=torch.float32),
    Case("llama_resharded", "llama", [("llama_lora", 1.0)], ["--max-shard-size", "9KB"]),
    Case("mistral", "mistral", [("mistral_lora", 1.0)]),
    Case("qwen2", "qwen2", [("qwen2_lora", 1.0)]),
    Case("qwen2_lora_bias", "qwen2", [("qwen2_lora_bias", 1.0)]),
    Case("qwen2_bias_all", "qwen2", [("qwen2_bias_all", 1.0)]),
    Case("gemma_tied", "gemma", [("gemma_lora", 1.0)]),
    Case("phi3_fused", "phi3", [("phi3_lora", 1.0)]),
    Case("gpt2_conv1d", "gpt2", [("gpt2_lora", 1.0)]),
    Case("gpt_neox", "gpt_neox", [("gpt_neox_lora", 1.0)]),
    Case("bert_modules_to_save", "bert", [("bert_seqcls_lora", 1.0)]),
    Case("t5_encoder_decoder", "t5", [("t5_lora", 1.0)]),
]


def check_against_peft(peftc, base: pathlib.Path, adapters, tmp: pathlib.Path, args=(), to_dtype=None,
                       load_dtype=None):
    ours_dir, ref_dir = tmp / "ours", tmp / "ref"
    run_merge(peftc, base, adapters, ours_dir, *args)
    ref = peft_merged(base, adapters, load_dtype)
    if to_dtype is not None:
        ref = ref.to(to_dtype)
    stats = compare_weights(file_tensors(ours_dir), saved_tensors(ref, ref_dir))
    assert stats["f32_rel"] <= 1e-6, stats
    if stats["half_elements"]:
        assert stats["max_ulp"] <= 1, stats
        assert_rounded_once_from_f32(peftc, base, adapters, tmp, args, file_tensors(ours_dir))
    if to_dtype is not None:
        ref = load_model(ref_dir)  # as loaded, not converted in memory (which also converts rope buffers)
    ours = load_model(ours_dir)
    error = relative_logit_error(ours, ref)
    stats["logits_rel"] = error
    half = next(ours.parameters()).dtype != torch.float32
    assert error <= (1e-2 if half else 1e-5), f"logits differ by {error:.3g} of their largest value"
    return stats, ours_dir, ref_dir


def assert_rounded_once_from_f32(peftc, base: pathlib.Path, adapters, tmp: pathlib.Path, args, ours: dict):
    """Every 16-bit tensor of our output is the f32 result of the same merge rounded once to its dtype
    (peft_c.h: "computed in f32 and rounded once"), exactly, whatever kernels either side runs."""
    f32_args = list(args)
    if "--dtype" in f32_args:
        f32_args[f32_args.index("--dtype") + 1] = "f32"
    else:
        f32_args += ["--dtype", "f32"]
    f32_dir = tmp / "ours_f32"
    run_merge(peftc, base, adapters, f32_dir, *f32_args)
    wide = file_tensors(f32_dir)
    checked = 0
    for name, tensor in ours.items():
        if tensor.dtype in (torch.bfloat16, torch.float16):
            assert wide[name].dtype == torch.float32, name
            rounded = wide[name].to(tensor.dtype)
            assert torch.equal(rounded.view(torch.int16), tensor.view(torch.int16)), (
                f"{name}: not the f32 result rounded once")
            checked += 1
    assert checked > 0


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_merge_matches_peft(case, peftc_binary, fixtures_dir, tmp_path):
    base = fixtures_dir / "models" / case.base
    adapters = [(fixtures_dir / "adapters" / name, weight) for name, weight in case.adapters]
    for folder, _ in adapters:
        if not (folder / "adapter_model.safetensors").exists():
            pytest.skip(f"fixture {folder} is absent (run tests/fixtures/generate.py)")
    stats, ours_dir, _ = check_against_peft(peftc_binary, base, adapters, tmp_path, case.args, case.to_dtype,
                                            case.load_dtype)
    print(f"{case.id}: {stats}")  # shown with pytest -rP: the precision reached
    config = json.loads((ours_dir / "config.json").read_text())
    base_config = json.loads((base / "config.json").read_text())
    if case.to_dtype is not None or case.load_dtype is not None:
        wanted = str(case.to_dtype or case.load_dtype).removeprefix("torch.")
        assert config.pop("dtype") == wanted
        base_config.pop("dtype")
        # Rewritten exactly as transformers writes a config.
        assert (ours_dir / "config.json").read_text() == json.dumps(
            {**base_config, "dtype": wanted}, indent=2, sort_keys=True) + "\n"
    else:
        assert (ours_dir / "config.json").read_bytes() == (base / "config.json").read_bytes()
    assert config == base_config
    if "--max-shard-size" in case.args:
        index = json.loads((ours_dir / "model.safetensors.index.json").read_text())
        assert len(set(index["weight_map"].values())) > 1


def make_gemma_adapter(folder: pathlib.Path, base: pathlib.Path, **config) -> None:
    """A random (trained-looking) PEFT adapter on the tied-embedding gemma fixture."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1234)
    model = load_model(base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, **config))
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "modules_to_save" in name:
                    param.add_(0.05 * torch.randn_like(param))
        peft_model.save_pretrained(str(folder))


@pytest.mark.parametrize("variant", ["replace_embedding", "lora_embedding"])
def test_tied_embeddings_follow_peft(variant, peftc_binary, fixtures_dir, tmp_path):
    """modules_to_save on a tied input embedding unties it (PEFT swaps the module; lm_head keeps the
    original values and tie_word_embeddings becomes false); LoRA on it keeps the tie with
    --tied-embeddings shared (PEFT merges in place into the one shared parameter; the default unties
    instead, to equal PEFT's unmerged forward: test_tied_embeddings.py)."""
    base = fixtures_dir / "models" / "gemma"
    if not (base / "model.safetensors").exists():
        pytest.skip("fixture models/gemma is absent")
    adapter = tmp_path / "adapter"
    if variant == "replace_embedding":
        make_gemma_adapter(adapter, base, target_modules=["q_proj"], modules_to_save=["embed_tokens"])
    else:
        make_gemma_adapter(adapter, base, target_modules=["q_proj", "embed_tokens"])
    args = [] if variant == "replace_embedding" else ["--tied-embeddings", "shared"]
    _, ours_dir, ref_dir = check_against_peft(peftc_binary, base, [(adapter, 1.0)], tmp_path, args)
    ours = json.loads((ours_dir / "config.json").read_text())
    ref = json.loads((ref_dir / "config.json").read_text())
    assert ours["tie_word_embeddings"] is ref["tie_word_embeddings"] is (variant != "replace_embedding")
