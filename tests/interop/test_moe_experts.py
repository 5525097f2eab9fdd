"""LoRA on stacked MoE expert parameters (PEFT 0.21 `target_parameters`, ParamWrapper), merged by peftc.

Tiny random Qwen3-MoE, Mixtral and gpt-oss models are built with transformers 5 and saved with
save_pretrained: Qwen3-MoE and Mixtral are written one tensor per expert
(mlp.experts.E.gate_proj/up_proj/down_proj, block_sparse_moe.experts.E.w1/w3/w2), gpt-oss fused and
transposed (mlp.experts.gate_up_proj [E, H, 2I]). PEFT adapts gate_up_proj and down_proj of every
experts module (nested wrappers: `experts.base_layer.lora_A` is gate_up_proj) plus q_proj, with
random non-zero factors, a rank_pattern on down_proj and (one case) rsLoRA. `peftc merge` must give
a folder that transformers loads to the logits of PEFT's unmerged forward (within 1e-5 of the largest
logit), with tensors equal to PEFT's merge_and_unload within f32 rounding. Refusals: DoRA (by config)
is UNSUPPORTED, a target_parameters entry naming a parameter the architecture data does not know is
UNRESOLVED_KEY.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

EXPERTS = 3
TARGET_PARAMETERS = ["mlp.experts.gate_up_proj", "mlp.experts.down_proj"]


def build(kind: str):
    small = dict(vocab_size=96, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 max_position_embeddings=64, tie_word_embeddings=False)
    if kind == "qwen3_moe":
        config = transformers.Qwen3MoeConfig(**small, intermediate_size=48, moe_intermediate_size=16, head_dim=8,
                                             num_experts=EXPERTS, num_experts_per_tok=2, decoder_sparse_step=1,
                                             mlp_only_layers=[])
        return transformers.Qwen3MoeForCausalLM(config), "model.layers.1.mlp.experts.2.up_proj.weight"
    if kind == "mixtral":
        config = transformers.MixtralConfig(**small, intermediate_size=16, num_local_experts=EXPERTS,
                                            num_experts_per_tok=2)
        return transformers.MixtralForCausalLM(config), "model.layers.1.block_sparse_moe.experts.2.w3.weight"
    config = transformers.GptOssConfig(**small, intermediate_size=16, head_dim=8, num_local_experts=EXPERTS,
                                       num_experts_per_tok=2, sliding_window=16)
    return transformers.GptOssForCausalLM(config), "model.layers.1.mlp.experts.gate_up_proj"


def load(folder: pathlib.Path):
    model_class = getattr(transformers, json.loads((folder / "config.json").read_text())["architectures"][0])
    return model_class.from_pretrained(str(folder), dtype=torch.float32).eval()


def peftc(binary, *args):
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True)


@pytest.fixture(scope="module", params=["qwen3_moe", "mixtral", "gpt_oss"])
def case(request, tmp_path_factory):
    """(base folder, adapter folder, PEFT model) for one architecture."""
    from safetensors import safe_open

    kind = request.param
    torch.manual_seed(0)
    model, saved_key = build(kind)
    root = tmp_path_factory.mktemp(kind)
    base = root / "base"
    model.save_pretrained(str(base))
    with safe_open(str(base / "model.safetensors"), "pt") as f:
        assert saved_key in f.keys(), sorted(f.keys())
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"], target_parameters=TARGET_PARAMETERS,
                             rank_pattern={"mlp.experts.down_proj": 3}, init_lora_weights=False,
                             use_rslora=kind == "mixtral")
    torch.manual_seed(1)
    peft_model = peft.get_peft_model(load(base), config).eval()
    adapter = root / "adapter"
    peft_model.save_pretrained(str(adapter))
    return kind, base, adapter, peft_model


def test_merge_matches_peft(case, peftc_binary, tmp_path):
    from safetensors import safe_open

    kind, base, adapter, peft_model = case
    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "base_model.model.model.layers.0.mlp.experts.base_layer.lora_A.weight" in keys  # gate_up_proj, inner
    assert "base_model.model.model.layers.0.mlp.experts.lora_B.weight" in keys  # down_proj, outer
    out = tmp_path / "merged"
    run = peftc(peftc_binary, "merge", "--base", base, "--out", out, "--adapter", adapter)
    assert run.returncode == 0, run.stderr

    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = peft_model(input_ids=ids).logits
        merged = load(out)
        got = merged(input_ids=ids).logits
    scale = float(want.abs().max())
    assert float((got - want).abs().max()) <= 1e-5 * scale, (kind, float((got - want).abs().max()), scale)

    # Against PEFT's merge_and_unload, tensor by tensor (in transformers' in-memory names).
    with torch.no_grad():
        reference = peft_model.merge_and_unload().state_dict()
    ours = merged.state_dict()
    assert ours.keys() == reference.keys()
    changed = 0
    for name, value in reference.items():
        bound = 1e-6 * max(float(value.abs().max()), 1e-30)
        assert float((ours[name] - value).abs().max()) <= bound, name
        changed += "experts" in name
    assert changed >= 4


def patched(adapter: pathlib.Path, where: pathlib.Path, **fields) -> pathlib.Path:
    shutil.copytree(adapter, where)
    config = json.loads((where / "adapter_config.json").read_text())
    config.update(fields)
    (where / "adapter_config.json").write_text(json.dumps(config))
    return where


@pytest.mark.parametrize("fields, code", [
    ({"use_dora": True}, "UNSUPPORTED"),
    ({"target_parameters": ["mlp.experts.gate_up_proj", "mlp.experts.other_proj"]}, "UNRESOLVED_KEY"),
])
def test_refusals(case, peftc_binary, tmp_path, fields, code):
    kind, base, adapter, _ = case
    bad = patched(adapter, tmp_path / "bad", **fields)
    run = peftc(peftc_binary, "merge", "--base", base, "--out", tmp_path / "out", "--adapter", bad)
    assert run.returncode != 0
    assert run.stderr.startswith(f"peftc: error: {code}: "), run.stderr
    assert not (tmp_path / "out").exists()
