"""transformers' checkpoint conversions (data/conversions/transformers.json) against the real packages.

transformers 5 builds Llava-family models with `model.language_model.*` / `model.vision_tower.*` in
memory and saves `language_model.model.*` / `vision_tower.*`; PEFT names adapter modules after the
model in memory. peft_c finds the saved tensor with the renames of transformers' own table.

* the committed data is what scripts/gen_conversions.py writes from the pinned transformers (the test
  regenerates it into a temporary file and compares): a new transformers needs a regenerated file;
* a tiny random Llava (Llama text model, CLIP vision tower) and Gemma 3 (SigLIP vision tower), each
  saved with save_pretrained, a LoRA on
  q_proj/v_proj (PEFT matches both the language model's and the vision tower's): `peftc merge` writes
  the base's saved names, transformers loads the result, and its logits on a text-and-image input
  are PEFT's unmerged forward's (max |difference| <= 1e-5 x max |logits|, f32);
* the same adapter with its keys renamed to the saved names (an adapter trained on a model loaded
  the transformers 4 way) merges to the same tensors;
* GGUF: `peftc adapter export --format gguf` of a LoRA on the language model alone writes the tensors
  and metadata llama.cpp's convert_lora_to_gguf.py writes (a GGUF model of a VLM is its language model);
  a LoRA that also adapts the vision tower is refused (UNSUPPORTED, naming its modules: llama.cpp
  applies no LoRA to the mmproj file), and with --split-into its vision-tower modules are merged into a
  copy of the base (the checkpoint merge's tensors) while the GGUF file is again the converter's.

Environment: PEFTC (the peftc binary); the GGUF tests skip without llama.cpp's tools
(PEFT_LLAMA_CPP_BIN, gguf_reference.py).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import warnings

import pytest
import torch

from gguf_reference import assert_same_lora_file, convert_lora_to_gguf, run_peftc, tensors
from merge_support import file_tensors, load_model, run_merge

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_data_matches_the_pinned_transformers(tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "transformers.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gen_conversions.py"), str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    committed = REPO / "data" / "conversions" / "transformers.json"
    assert out.read_text() == committed.read_text(), (
        "data/conversions/transformers.json is not what scripts/gen_conversions.py writes from this "
        "transformers: regenerate it")


# kind: (image token id, image tokens per image)
KINDS = {"llava": (63, 4), "gemma3": (299, 4)}


def make_base(kind: str, folder: pathlib.Path) -> pathlib.Path:
    """A tiny random VLM: Llava (Llama text model, CLIP vision tower; 8x8 images in 4x4 patches, the CLS
    feature dropped: 4 image tokens) or Gemma 3 (SigLIP; 16x16 images, 16 patches pooled to 4 tokens)."""
    import transformers

    torch.manual_seed(3)
    image_token, _ = KINDS[kind]
    if kind == "llava":
        text = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        vision = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                               num_attention_heads=2, image_size=8, patch_size=4)
        model = transformers.LlavaForConditionalGeneration(
            transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_index=image_token))
    else:
        text = transformers.Gemma3TextConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                             num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                             max_position_embeddings=64, sliding_window=16)
        vision = transformers.SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                                 num_attention_heads=2, image_size=16, patch_size=4)
        model = transformers.Gemma3ForConditionalGeneration(transformers.Gemma3Config(
            text_config=text, vision_config=vision, mm_tokens_per_image=4, image_token_index=image_token,
            boi_token_index=297, eoi_token_index=298))
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module", params=list(KINDS))
def base(request, tmp_path_factory) -> pathlib.Path:
    pytest.importorskip("transformers")
    return make_base(request.param, tmp_path_factory.mktemp(request.param))


def write_lora(base: pathlib.Path, folder: pathlib.Path, target_modules, seed: int) -> pathlib.Path:
    """PEFT's LoRA (r 4, alpha 8, random B) on `target_modules` of `base`, saved into `folder`."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(load_model(base), LoraConfig(r=4, lora_alpha=8, init_lora_weights=False,
                                                            target_modules=target_modules))
        model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def adapter(base, tmp_path_factory) -> pathlib.Path:
    """q_proj/v_proj wherever PEFT finds them: the language model's and the vision tower's."""
    return write_lora(base, tmp_path_factory.mktemp("lora"), ["q_proj", "v_proj"], seed=11)


@pytest.fixture(scope="module")
def language_model_adapter(base, tmp_path_factory) -> pathlib.Path:
    """q_proj/v_proj of the language model alone."""
    return write_lora(base, tmp_path_factory.mktemp("lm_lora"), r".*language_model.*\.(q_proj|v_proj)", seed=12)


def inputs(model) -> dict:
    config = model.config
    image_token = config.image_token_id
    size = config.vision_config.image_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 60, (2, 9), generator=g)
    ids[:, 1:5] = image_token  # 4 image tokens per image (KINDS)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids),
            "pixel_values": torch.randn(2, 3, size, size, generator=g)}


@torch.no_grad()
def logits(model) -> torch.Tensor:
    return model(**inputs(model)).logits.float()


def test_adapter_uses_in_memory_names(adapter, base):
    from safetensors import safe_open

    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert "base_model.model.model.language_model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert "base_model.model.model.vision_tower.encoder.layers.0.self_attn.v_proj.lora_B.weight" in keys
    saved = file_tensors(base)
    assert "language_model.model.layers.0.self_attn.q_proj.weight" in saved
    assert "vision_tower.encoder.layers.0.self_attn.v_proj.weight" in saved


def test_merge_equals_peft_forward(adapter, base, peftc_binary, tmp_path):
    from peft import PeftModel

    out = tmp_path / "merged"
    run_merge(peftc_binary, base, [(adapter, 1.0)], out)
    assert sorted(file_tensors(out)) == sorted(file_tensors(base))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = logits(PeftModel.from_pretrained(load_model(base), str(adapter)).eval())
    ours = logits(load_model(out))
    plain = logits(load_model(base))
    scale = float(ref.abs().max())
    assert float((plain - ref).abs().max()) / scale > 1e-3, "the adapter changes nothing: the test proves nothing"
    error = float((ours - ref).abs().max()) / scale
    assert error <= 1e-5, f"logits differ from PEFT's forward by {error:.3g} of their largest value"
    merged, original = file_tensors(out), file_tensors(base)
    for name in ["language_model.model.layers.1.self_attn.v_proj.weight",
                 "vision_tower.encoder.layers.0.self_attn.q_proj.weight"]:
        assert not torch.equal(merged[name], original[name]), f"{name} was not merged"


def test_saved_names_still_merge(adapter, base, peftc_binary, tmp_path):
    from safetensors.torch import load_file, save_file

    renamed = tmp_path / "renamed"
    renamed.mkdir()
    (renamed / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    tensors = load_file(str(adapter / "adapter_model.safetensors"))
    prefix = "base_model.model."

    def saved(key: str) -> str:
        module = key[len(prefix):]
        for memory, disk in (("model.language_model.", "language_model.model."),
                             ("model.vision_tower.", "vision_tower.")):
            if module.startswith(memory):
                return prefix + disk + module[len(memory):]
        raise AssertionError(key)

    save_file({saved(k): v for k, v in tensors.items()}, str(renamed / "adapter_model.safetensors"))
    a, b = tmp_path / "a", tmp_path / "b"
    run_merge(peftc_binary, base, [(adapter, 1.0)], a)
    run_merge(peftc_binary, base, [(renamed, 1.0)], b)
    ours, theirs = file_tensors(a), file_tensors(b)
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name


def assert_same_gguf_lora(ours: pathlib.Path, reference: pathlib.Path) -> None:
    assert len(tensors(reference)) == 8  # q and v of both layers, A and B: the test adapts something
    assert_same_lora_file(ours, reference)


def test_gguf_lora_of_the_language_model_equals_convert_lora_to_gguf(language_model_adapter, base, peftc_binary,
                                                                    tmp_path):
    reference = convert_lora_to_gguf(language_model_adapter, base, tmp_path / "reference.gguf", outtype="f32")
    ours = tmp_path / "ours.gguf"
    run_peftc(peftc_binary, "adapter", "export", language_model_adapter, ours, "--format", "gguf", "--base", base)
    assert_same_gguf_lora(ours, reference)


def test_gguf_lora_of_the_vision_tower_is_merged_into_the_base(adapter, base, peftc_binary, tmp_path):
    reference = convert_lora_to_gguf(adapter, base, tmp_path / "reference.gguf", outtype="f32")
    ours, merged = tmp_path / "ours.gguf", tmp_path / "merged"
    proc = run_peftc(peftc_binary, "adapter", "export", adapter, ours, "--format", "gguf", "--base", base, expect=1)
    assert "UNSUPPORTED" in proc.stderr and "model.vision_tower.encoder.layers.1.self_attn.v_proj" in proc.stderr
    assert "language_model.layers" not in proc.stderr
    assert not ours.exists()

    run_peftc(peftc_binary, "adapter", "export", adapter, ours, "--format", "gguf", "--base", base,
              "--split-into", merged)
    assert_same_gguf_lora(ours, reference)  # the converter leaves the vision tower out
    whole = tmp_path / "whole"
    run_merge(peftc_binary, base, [(adapter, 1.0)], whole)
    got, full, original = file_tensors(merged), file_tensors(whole), file_tensors(base)
    assert sorted(got) == sorted(original)
    vision = 0
    for name, value in got.items():
        if name.startswith("vision_tower.") and ("q_proj" in name or "v_proj" in name) and name.endswith(".weight"):
            assert torch.equal(value, full[name]) and not torch.equal(value, original[name]), name
            vision += 1
        else:
            assert torch.equal(value, original[name]), name
    assert vision == 4
