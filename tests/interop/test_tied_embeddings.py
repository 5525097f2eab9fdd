"""Merges into bases with tied embeddings (`tie_word_embeddings: true`) against PEFT's own forward.

transformers saves a tied model with the input embedding only (`model.embed_tokens.weight`). PEFT
wraps each side in its own layer, so the adapter's forward sees each side's own changes; its
merge_and_unload writes every change into the one shared tensor, so the merged model's logits differ
from the adapter's. For tiny random Llama and Qwen2 models with tied embeddings and PEFT adapters on
`lm_head`, `embed_tokens`, both, with ensure_weight_tying, modules_to_save copies and trainable tokens:

* `peftc merge` (tied embeddings policy "untie", the default), loaded by transformers, gives PEFT's
  unmerged forward logits: max |difference| <= 1e-5 x max |logits| (f32);
* where one side changes alone, lm_head.weight is written and tie_word_embeddings is false, with a
  note; where PEFT applies the same change to both sides (trainable tokens, ensure_weight_tying's tied
  LoRA) the output stays tied and lm_head.weight is not written;
* `peftc doctor` names each adapter's tied case and says whether the default merge unties;
* `--tied-embeddings shared` writes what PEFT's merge_and_unload saves (the same tensors, f32 values
  within 1e-6 of the largest; byte for byte where one module changes the shared tensor).

Environment: PEFTC (the peftc binary).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import warnings

import pytest
import torch

from merge_support import compare_weights, file_tensors, load_model, logits, model_inputs, run_merge

ARCHITECTURES = ["llama", "qwen2"]

# name: (LoraConfig arguments, whether the merged output stays tied)
CASES = {
    "lm_head": (dict(target_modules=["q_proj", "lm_head"]), False),
    "lm_head_dora": (dict(target_modules=["lm_head"], use_dora=True), False),
    "embed_tokens": (dict(target_modules=["v_proj", "embed_tokens"]), False),
    "both": (dict(target_modules=["embed_tokens", "lm_head"]), False),
    "ensure_weight_tying": (dict(target_modules=["embed_tokens", "lm_head"], ensure_weight_tying=True), True),
    "save_lm_head": (dict(target_modules=["q_proj"], modules_to_save=["lm_head"]), False),
    "save_embed_tied": (dict(target_modules=["q_proj"], modules_to_save=["embed_tokens"], ensure_weight_tying=True),
                        False),
    "trainable_tokens": (dict(target_modules=["q_proj"], trainable_token_indices=[3, 17, 40]), True),
    "tokens_and_lm_head": (dict(target_modules=["lm_head"], trainable_token_indices=[5, 9]), False),
}

# The case `peftc doctor` names for each (its report's tied_embeddings.case).
DOCTOR_CASES = {"lm_head": "output_only", "lm_head_dora": "output_only", "embed_tokens": "input_only", "both": "both",
                "ensure_weight_tying": "ensure_weight_tying", "save_lm_head": "modules_to_save",
                "save_embed_tied": "modules_to_save", "trainable_tokens": "trainable_tokens",
                "tokens_and_lm_head": "output_only"}

# Cases whose changes land in the shared tensor alike with --tied-embeddings shared and PEFT's
# merge_and_unload, one module changing it (so PEFT's in-place merge and ours round the same way).
SHARED_EXACT = ["lm_head", "embed_tokens", "trainable_tokens"]
SHARED_CLOSE = ["both", "ensure_weight_tying"]


def make_base(arch: str, folder: pathlib.Path) -> pathlib.Path:
    import transformers

    torch.manual_seed(7)
    common = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    if arch == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module", params=ARCHITECTURES)
def base(request, tmp_path_factory) -> pathlib.Path:
    pytest.importorskip("transformers")
    folder = make_base(request.param, tmp_path_factory.mktemp(f"tied_{request.param}"))
    from safetensors import safe_open

    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys(), "transformers stored the tied output embedding"
    return folder


def make_adapter(base: pathlib.Path, folder: pathlib.Path, config: dict, save_embedding_layers="auto") -> None:
    """A random (trained-looking) adapter: LoRA factors, modules_to_save copies and token rows moved.
    save_embedding_layers: PEFT's save_pretrained argument ("auto" saves the embeddings' base weights
    with an adapter on them)."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1234)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(load_model(base), LoraConfig(r=4, lora_alpha=8, init_lora_weights=False, **config))
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "modules_to_save" in name or "trainable_tokens_delta" in name:
                    param.add_(0.5 * torch.randn_like(param))
        peft_model.save_pretrained(str(folder), save_embedding_layers=save_embedding_layers)


def peft_forward(base: pathlib.Path, adapter: pathlib.Path, inputs) -> torch.Tensor:
    """The logits of PEFT's unmerged model: the base with the saved adapter loaded."""
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(load_model(base), str(adapter)).eval()
    return logits(model, inputs)


def peft_merge_and_unload(base: pathlib.Path, adapter: pathlib.Path, out: pathlib.Path) -> dict:
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(load_model(base), str(adapter)).merge_and_unload()
        model.save_pretrained(str(out))
    return file_tensors(out)


@pytest.mark.parametrize("case", list(CASES))
def test_merge_equals_peft_forward(case, base, peftc_binary, tmp_path):
    config, stays_tied = CASES[case]
    adapter = tmp_path / "adapter"
    make_adapter(base, adapter, config)
    out = tmp_path / "merged"
    stdout = run_merge(peftc_binary, base, [(adapter, 1.0)], out)

    merged = load_model(out)
    inputs = model_inputs(merged)
    ours, ref = logits(merged, inputs), peft_forward(base, adapter, inputs)
    error = float((ours - ref).abs().max()) / float(ref.abs().max())
    assert error <= 1e-5, f"{case}: logits differ from PEFT's forward by {error:.3g} of their largest value"

    written = json.loads((out / "config.json").read_text())
    assert written["tie_word_embeddings"] is stays_tied

    # The doctor names the case and says what this merge did (the report is not a problem).
    doctor = subprocess.run([str(peftc_binary), "doctor", "--adapter", str(adapter), "--base", str(base), "--json"],
                            capture_output=True, text=True)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    tied = json.loads(doctor.stdout)["tied_embeddings"]
    assert tied["case"] == DOCTOR_CASES[case]
    assert ("tie_word_embeddings is set to false" in tied["untie"]) is not stays_tied
    assert ("lm_head.weight" in file_tensors(out)) is not stays_tied
    if not stays_tied:
        assert "tie_word_embeddings set to false" in stdout
        if case == "embed_tokens":  # the output embedding is the base's own
            original = file_tensors(base)["model.embed_tokens.weight"]
            assert torch.equal(file_tensors(out)["lm_head.weight"], original)


@pytest.mark.parametrize("case", SHARED_EXACT + SHARED_CLOSE)
def test_shared_policy_equals_merge_and_unload(case, base, peftc_binary, tmp_path):
    config, _ = CASES[case]
    adapter = tmp_path / "adapter"
    make_adapter(base, adapter, config)
    out = tmp_path / "merged"
    stdout = run_merge(peftc_binary, base, [(adapter, 1.0)], out, "--tied-embeddings", "shared")
    ours = file_tensors(out)
    ref = peft_merge_and_unload(base, adapter, tmp_path / "peft")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    if case in SHARED_EXACT:
        assert sorted(ours) == sorted(ref)
        for name in ours:
            assert torch.equal(ours[name], ref[name]), f"{case}: {name} differs from merge_and_unload's"
    else:
        assert compare_weights(ours, ref)["f32_rel"] <= 1e-6
    if case != "trainable_tokens":
        assert "tied embeddings policy \"shared\"" in stdout


def test_saved_embedding_weight_reaches_both_sides_of_an_untied_pair(base, peftc_binary, tmp_path):
    """An adapter saved with the embedding's base_layer weight (save_embedding_layers) whose rows differ
    from the base's, as when new tokens' rows were set before training: PEFT loads that weight into the
    shared parameter, so the untied output starts from it too, not from the base checkpoint's embedding."""
    from safetensors.torch import load_file, save_file

    adapter = tmp_path / "adapter"
    make_adapter(base, adapter, CASES["embed_tokens"][0], save_embedding_layers=True)
    path = adapter / "adapter_model.safetensors"
    tensors = load_file(str(path))
    [key] = [k for k in tensors if k.endswith("embed_tokens.base_layer.weight")]
    torch.manual_seed(99)
    tensors[key][40:48] = torch.randn_like(tensors[key][40:48])  # the "new tokens'" rows
    save_file(tensors, str(path), metadata={"format": "pt"})

    out = tmp_path / "merged"
    stdout = run_merge(peftc_binary, base, [(adapter, 1.0)], out)
    assert "tie_word_embeddings set to false" in stdout
    merged = load_model(out)
    inputs = model_inputs(merged)
    ours, ref = logits(merged, inputs), peft_forward(base, adapter, inputs)
    error = float((ours - ref).abs().max()) / float(ref.abs().max())
    assert error <= 1e-5, f"logits differ from PEFT's forward by {error:.3g} of their largest value"
    assert torch.equal(file_tensors(out)["lm_head.weight"], tensors[key])


def test_untied_stays_loadable_by_transformers_as_untied(base, peftc_binary, tmp_path):
    """The untied output holds both tensors; transformers does not tie them again on load."""
    adapter = tmp_path / "adapter"
    make_adapter(base, adapter, CASES["lm_head"][0])
    out = tmp_path / "merged"
    run_merge(peftc_binary, base, [(adapter, 1.0)], out)
    merged = load_model(out)
    assert merged.lm_head.weight.data_ptr() != merged.model.embed_tokens.weight.data_ptr()


def test_unknown_policy_is_a_usage_error(base, peftc_binary, tmp_path):
    adapter = tmp_path / "adapter"
    make_adapter(base, adapter, CASES["lm_head"][0])
    proc = subprocess.run([str(peftc_binary), "merge", "--base", str(base), "--out", str(tmp_path / "m"),
                           "--adapter", str(adapter), "--tied-embeddings", "both"], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stderr
    assert "--tied-embeddings" in proc.stderr
