"""`peftc doctor` against the real PEFT and transformers, on renamed variants of the committed fixture
adapters written by the committed generator tests/fixtures/generator/renamed_adapters.py:

* a clean fixture adapter gives exit 0 and `summary.ok`;
* every renamed variant (prefix missing or doubled, transformers' VLM renames, `.weight` suffix variants,
  lora_A vs lora_embedding_A, kohya names with per-module alphas, with or without a config) gives exit 1 with exactly the expected
  problem kinds, each with a fix;
* `--fix` writes an adapter that the doctor finds clean, that `PeftModel.from_pretrained` loads with no
  missing or unexpected adapter keys, and whose PEFT merge equals the source adapter's merge exactly;
* the llava names (`language_model.model.*` on a base holding `model.language_model.*`) are fixed too, and
  the fixed adapter merges with peft_c into the renamed base exactly as the source into the source base;
* a PEFT adapter on a real tiny llava (in-memory names `model.language_model.*`, checkpoint names
  `language_model.model.*` as transformers 5 saves them) needs no fix: its modules resolve through
  transformers' save renames, and peft_c merges it as PEFT does;
* problems without a fix (target modules without tensors, a resized vocabulary, transposed factors, a key
  nothing explains) are found with their kinds; errors give exit 2.

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA (see conftest.py).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("peft")
from peft import PeftModel  # noqa: E402
from peft.utils import load_peft_weights, set_peft_model_state_dict  # noqa: E402
from safetensors.numpy import load_file, save_file  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = pathlib.Path(os.environ.get("PEFT_TEST_DATA") or REPO / "tests" / "fixtures")
sys.path.insert(0, str(REPO / "tests" / "fixtures"))
from generator import renamed_adapters  # noqa: E402

ADAPTERS = FIXTURES / "adapters"
MODELS = FIXTURES / "models"

# (variant, source adapter, base model, the problem kinds the doctor must find)
VARIANTS = [
    ("missing_prefix", "llama_lora", "llama", {"missing_peft_prefix"}),
    ("double_prefix", "llama_lora", "llama", {"renamed_module"}),
    ("qwen2vl_text", "llama_lora", "llama", {"renamed_module"}),
    ("weight_suffix", "llama_lora", "llama", {"weight_suffix"}),
    ("kohya", "llama_lora", "llama", {"kohya_name"}),
    ("kohya_dotted", "llama_lora", "llama", {"kohya_name"}),
    ("kohya_no_config", "llama_lora", "llama", {"kohya_name", "missing_config"}),
    ("weight_suffix", "llama_embedding", "llama", {"weight_suffix"}),
    ("embedding_role", "llama_embedding", "llama", {"embedding_role"}),
    ("missing_prefix", "gemma3_text_lora", "gemma3_text", {"missing_peft_prefix"}),
    ("qwen2vl_text", "gemma3_text_lora", "gemma3_text", {"renamed_module"}),
]


def doctor(peftc, adapter, base=None, *extra):
    args = [str(peftc), "doctor", "--json", "--adapter", str(adapter)]
    if base is not None:
        args += ["--base", str(base)]
    result = subprocess.run(args + [str(e) for e in extra], capture_output=True, text=True)
    report = json.loads(result.stdout) if result.returncode in (0, 1) else None
    return result, report


def load_base(base: pathlib.Path):
    architecture = json.loads((base / "config.json").read_text())["architectures"][0]
    return getattr(transformers, architecture).from_pretrained(base, dtype="auto").eval()


def load_clean(base: pathlib.Path, adapter: pathlib.Path):
    """PeftModel.from_pretrained with no missing adapter keys (its warning) and no unexpected ones."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(load_base(base), adapter).eval()
    missing = [str(w.message) for w in caught if "missing adapter keys" in str(w.message)]
    assert not missing, missing
    result = set_peft_model_state_dict(model, load_peft_weights(str(adapter)), adapter_name="default")
    assert [k for k in result.missing_keys if "lora_" in k] == []
    assert result.unexpected_keys == [], result.unexpected_keys
    return model


def merged(model) -> dict:
    return {k: v.clone() for k, v in model.merge_and_unload().state_dict().items()}


def test_clean_fixtures_exit_0(peftc_binary):
    for name, base in [("llama_lora", "llama"), ("llama_embedding", "llama"), ("gpt2_lora", "gpt2"),
                       ("gemma3_text_lora", "gemma3_text"), ("llama_dora", "llama")]:
        result, report = doctor(peftc_binary, ADAPTERS / name, MODELS / base)
        assert result.returncode == 0, (name, result.stdout, result.stderr)
        assert report["summary"]["ok"] and report["problems"] == [] and report["renames"] == []
        assert report["summary"]["matched_modules"] == report["summary"]["modules"] > 0
        for module in report["modules"]:
            assert module["base_tensor"] and module["rank"] and module["scaling"] > 0


def test_report_fields(peftc_binary):
    _, report = doctor(peftc_binary, ADAPTERS / "llama_dora", MODELS / "llama")
    q = next(m for m in report["modules"] if m["module"] == "model.layers.0.self_attn.q_proj")
    assert q["base_tensor"] == "model.layers.0.self_attn.q_proj.weight"
    assert q["host_name"] == "transformer/layer_0/attention/query"
    assert q["dora"] == "lora_magnitude_vector" and q["kind"] == "linear"
    config = json.loads((ADAPTERS / "llama_dora" / "adapter_config.json").read_text())
    assert q["rank"] == config["r"] and q["scaling"] == config["lora_alpha"] / config["r"]
    assert report["family"] == "llama" and report["schema"] == 1


@pytest.mark.parametrize("variant,source,base,kinds", VARIANTS, ids=[f"{v[1]}-{v[0]}" for v in VARIANTS])
def test_renamed_variant_found_and_fixed(variant, source, base, kinds, peftc_binary, tmp_path):
    broken = renamed_adapters.VARIANTS[variant](ADAPTERS / source, tmp_path / "broken")
    result, report = doctor(peftc_binary, broken, MODELS / base)
    assert result.returncode == 1, result.stderr
    assert {p["kind"] for p in report["problems"]} == kinds, report["problems"]
    assert all(p["fix"] is not None for p in report["problems"])
    assert report["summary"]["fixable_problems"] == report["summary"]["problems"]

    fixed = tmp_path / "fixed"
    result, _ = doctor(peftc_binary, broken, MODELS / base, "--fix", fixed)
    assert result.returncode == 0, (result.stdout, result.stderr)
    again, report = doctor(peftc_binary, fixed, MODELS / base)
    assert again.returncode == 0 and report["problems"] == [], report["problems"]

    original = merged(load_clean(MODELS / base, ADAPTERS / source))
    repaired = merged(load_clean(MODELS / base, fixed))
    assert original.keys() == repaired.keys()
    for key, value in original.items():
        assert torch.equal(value, repaired[key]), key


def test_llava_names_on_renamed_base(peftc_binary, tmp_path):
    base = renamed_adapters.renamed_base(MODELS / "llama", tmp_path / "base")
    broken = renamed_adapters.llava_text(ADAPTERS / "llama_lora", tmp_path / "broken")
    result, report = doctor(peftc_binary, broken, base)
    assert result.returncode == 1
    assert {p["kind"] for p in report["problems"]} == {"renamed_module"}
    assert all(r["to"].startswith("base_model.model.model.language_model.") for r in report["renames"])
    fixed = tmp_path / "fixed"
    assert doctor(peftc_binary, broken, base, "--fix", fixed)[0].returncode == 0

    def merge(adapter, into, out):
        run = subprocess.run([str(peftc_binary), "merge", "--base", str(into), "--adapter", str(adapter),
                              "--out", str(out)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        return load_file(str(out / "model.safetensors"))

    reference = merge(ADAPTERS / "llama_lora", MODELS / "llama", tmp_path / "m0")
    repaired = merge(fixed, base, tmp_path / "m1")
    renamed = {("model.language_model." + k[6:] if k.startswith("model.") else k): v for k, v in reference.items()}
    assert renamed.keys() == repaired.keys()
    for key, value in renamed.items():
        assert (value == repaired[key]).all(), key


def test_llava_adapter_on_llava_checkpoint(peftc_binary, tmp_path):
    """A real tiny llava: transformers 5 saves its checkpoint under the old names (language_model.model.*)
    while PEFT names the adapter after the modules in memory (model.language_model.*). The doctor finds
    every module through transformers' save renames (data/conversions), and peft_c merges the adapter as it
    is into the checkpoint as PEFT does."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    text = transformers.LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                    num_attention_heads=2, num_key_value_heads=2)
    vision = transformers.CLIPVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                           num_attention_heads=2, image_size=8, patch_size=4)
    config = transformers.LlavaConfig(text_config=text, vision_config=vision, image_token_index=63)
    base = tmp_path / "llava"
    transformers.LlavaForConditionalGeneration(config).save_pretrained(base)
    model = get_peft_model(load_base(base), LoraConfig(r=2, lora_alpha=4, target_modules=r".*language_model.*\.(q_proj|v_proj)"))
    for name, parameter in model.named_parameters():
        if "lora_" in name:
            torch.nn.init.normal_(parameter)
    adapter = tmp_path / "adapter"
    model.save_pretrained(adapter)

    result, report = doctor(peftc_binary, adapter, base)
    # The in-memory names resolve through transformers' own save renames (data/conversions): nothing to fix.
    assert result.returncode == 0, report
    assert report["summary"]["ok"] and report["problems"] == [] and report["renames"] == []
    assert report["summary"]["matched_modules"] == report["summary"]["modules"] > 0

    original = merged(load_clean(base, adapter))
    run = subprocess.run([str(peftc_binary), "merge", "--base", str(base), "--adapter", str(adapter), "--out",
                          str(tmp_path / "merged")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    ours = load_file(str(tmp_path / "merged" / "model.safetensors"))
    for proj in ("q_proj", "v_proj"):
        theirs = original[f"model.language_model.layers.0.self_attn.{proj}.weight"].numpy()
        mine = ours[f"language_model.model.layers.0.self_attn.{proj}.weight"]
        assert abs(mine - theirs).max() <= 1e-6 * max(1.0, abs(theirs).max()), proj


def _edit(source: pathlib.Path, out: pathlib.Path, edit) -> pathlib.Path:
    tensors = load_file(str(source / "adapter_model.safetensors"))
    config = json.loads((source / "adapter_config.json").read_text())
    edit(tensors, config)
    out.mkdir(parents=True)
    save_file(tensors, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    return out


def test_problems_without_fix(peftc_binary, tmp_path):
    import numpy as np

    q0 = "base_model.model.model.layers.0.self_attn.q_proj."
    emb = "base_model.model.model.embed_tokens."

    def drop_module(t, c):
        del t[q0 + "lora_A.weight"], t[q0 + "lora_B.weight"]

    def transpose(t, c):
        t[q0 + "lora_A.weight"] = np.ascontiguousarray(t[q0 + "lora_A.weight"].T)
        t[q0 + "lora_B.weight"] = np.ascontiguousarray(t[q0 + "lora_B.weight"].T)

    def resize_vocab(t, c):
        a = t[emb + "lora_embedding_A"]
        t[emb + "lora_embedding_A"] = np.concatenate([a, a[:, :8]], axis=1)

    def odd_key(t, c):
        t[q0 + "lora_X.weight"] = np.zeros((2, 2), dtype=np.float32)

    cases = [
        ("llama_lora", drop_module, "target_without_tensors"),
        ("llama_lora", transpose, "shape_transposed"),
        ("llama_embedding", resize_vocab, "vocabulary_resized"),
        ("llama_lora", odd_key, "unmatched_key"),
    ]
    for source, edit, kind in cases:
        broken = _edit(ADAPTERS / source, tmp_path / kind, edit)
        result, report = doctor(peftc_binary, broken, MODELS / "llama")
        assert result.returncode == 1, (kind, result.stderr)
        kinds = [p["kind"] for p in report["problems"]]
        assert kinds == [kind], (kind, report["problems"])
        assert report["problems"][0]["fix"] is None


def test_errors_exit_2(peftc_binary, tmp_path):
    result, _ = doctor(peftc_binary, tmp_path / "absent", MODELS / "llama")
    assert result.returncode == 2 and "NOT_FOUND" in result.stderr
    result = subprocess.run([str(peftc_binary), "doctor"], capture_output=True, text=True)
    assert result.returncode == 2
