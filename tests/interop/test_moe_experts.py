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

Host buffers (`peft_merge_buffer_apply`, and a registry's adapter swapped into a host model, through
the Python binding): the fused parameters as transformers 5 holds them in memory and, for Qwen3-MoE
and Mixtral, the per-expert tensors as saved get PEFT's merge_and_unload values within f32 rounding,
and come back bit for bit on removal (exact swaps) or within f32 rounding (arithmetic unmerge).

GGUF (whose experts llama.cpp's converter stacks as blk.L.ffn_gate_exps / ffn_up_exps / ffn_down_exps;
gpt-oss's fused gate_up_proj split into its even and odd rows): `peftc merge` into convert_hf_to_gguf.py's file of the base equals that
converter's file of PEFT's merge_and_unload (F32, within 1e-6 of each tensor's largest value), and
llama-export-lora applying peft_c's GGUF LoRA of the adapter (stacked per-expert pairs) gives peft_c's
own GGUF merge within 1e-6. A host model holding the GGUF file's tensors by their GGUF names (a
translator made from the file) gets peft_c's GGUF merge bit for bit from a swap.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import numpy as np
import pytest

from gguf_reference import convert_hf_to_gguf, export_lora, relative_error, tensors

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


SAVED_PARTS = {  # the per-expert tensors of gate_up_proj (gate rows, then up rows) and of down_proj
    "qwen3_moe": ("model.layers.{l}.mlp.experts.{e}.", ("gate_proj", "up_proj"), "down_proj"),
    "mixtral": ("model.layers.{l}.block_sparse_moe.experts.{e}.", ("w1", "w3"), "w2"),
}


def host_tensors(case):
    """(base, want): the buffers a host holds for the adapted layers and PEFT's merge_and_unload of them.

    Two forms: "fused", the parameters as transformers 5 holds them in memory; "saved" (Qwen3-MoE,
    Mixtral), the per-expert tensors as save_pretrained writes them. q_proj is in both."""
    import copy

    from safetensors.numpy import load_file

    kind, base, adapter, peft_model = case
    with torch.no_grad():
        reference = {k: v.numpy() for k, v in copy.deepcopy(peft_model).merge_and_unload().state_dict().items()}
    in_memory = {k: v.detach().numpy().copy() for k, v in load(base).state_dict().items()}
    saved = load_file(str(base / "model.safetensors"))
    forms = {"fused": ({}, {}), "saved": ({}, {})}
    for layer in range(2):
        q = f"model.layers.{layer}.self_attn.q_proj.weight"
        for form, source in (("fused", in_memory), ("saved", saved)):
            forms[form][0][q], forms[form][1][q] = source[q].copy(), reference[q]
        for param in ("gate_up_proj", "down_proj"):
            name = f"model.layers.{layer}.mlp.experts.{param}"
            forms["fused"][0][name], forms["fused"][1][name] = in_memory[name].copy(), reference[name]
        if kind not in SAVED_PARTS:
            continue
        prefix, (gate, up), down = SAVED_PARTS[kind]
        for e in range(EXPERTS):
            gate_up = reference[f"model.layers.{layer}.mlp.experts.gate_up_proj"][e]
            rows = gate_up.shape[0] // 2
            at = prefix.format(l=layer, e=e)
            for part, want in ((gate, gate_up[:rows]), (up, gate_up[rows:]),
                               (down, reference[f"model.layers.{layer}.mlp.experts.down_proj"][e])):
                forms["saved"][0][f"{at}{part}.weight"] = saved[f"{at}{part}.weight"].copy()
                forms["saved"][1][f"{at}{part}.weight"] = want
    if kind not in SAVED_PARTS:
        del forms["saved"]
    return forms


def assert_merged(kind, name, got, want, original):
    assert float(np.abs(got - want).max()) <= 1e-6 * float(np.abs(want).max()), (kind, name)
    assert not np.array_equal(got, original), name


def test_host_buffer_merge_matches_peft(case, peft_c):
    kind, base, adapter, peft_model = case
    with peft_c.Adapter.open(str(adapter)) as opened:
        for form, (buffers, want) in host_tensors(case).items():
            for name, weight in buffers.items():
                original = weight.copy()
                record = peft_c.merge_into(opened, name, weight, keep_original_rows=True)
                assert_merged(kind, name, weight, want[name], original)
                record.remove(weight)
                assert np.array_equal(weight, original), (form, name)


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "arithmetic"])
def test_host_model_swaps_expert_adapter(case, peft_c, exact):
    """A registry takes the adapter and a host model swaps it into either form of buffers and out again
    (exact: bit for bit; arithmetic: PEFT's unmerge, within f32 rounding); unmerged apply refuses the
    layers the expert LoRA adapts, and a host with neither form of an adapted parameter is told its name."""
    kind, base, adapter, peft_model = case
    with peft_c.Registry("F32", 1 << 26) as registry:
        registry.register("a", str(adapter))
        lease = registry.acquire("a")
        assert lease.nbytes > 0  # q_proj's factors; the expert factors are not charged
        for form, (buffers, want) in host_tensors(case).items():
            original = {name: array.copy() for name, array in buffers.items()}
            host = peft_c.HostModel()
            host.set_exact(exact)
            for name, array in buffers.items():
                host.add_weight(name, array)
            stats = host.swap(lease, 1.0)
            assert stats.layers_merged == len(buffers), form
            for name, array in buffers.items():
                assert_merged(kind, name, array, want[name], original[name])
            host.swap(None)
            for name, array in buffers.items():
                if exact:
                    assert np.array_equal(array, original[name]), (form, name)
                else:
                    assert float(np.abs(array - original[name]).max()) <= 1e-6 * float(np.abs(want[name]).max())
            host.close()

        expert_layer = next(name for name in buffers if ".experts." in name)
        x = np.ones((1, 32), np.float32)
        y = np.zeros((1, buffers[expert_layer].shape[-2]), np.float32)
        with pytest.raises(peft_c.UnsupportedError, match="target_parameters"):
            peft_c.lora_apply(expert_layer, lease, None, x, y)

        host = peft_c.HostModel()
        q = np.zeros((32, 32), np.float32)
        host.add_weight("model.layers.0.self_attn.q_proj.weight", q)
        with pytest.raises(peft_c.UnresolvedKeyError, match=r"model\.layers\.0\.mlp\.experts\.gate_up_proj"):
            host.swap(lease, 1.0)
        assert not q.any()
        host.close()
        lease.release()


# --- GGUF ------------------------------------------------------------------------------------------------

def assert_gguf_close(got: dict, want: dict, base: dict) -> set:
    """The same tensors, types and shapes; F32 values within 1e-6 of the tensor's largest; returns the changed."""
    assert got.keys() == want.keys()
    changed = set()
    for name, (kind, ne, values) in want.items():
        assert got[name][:2] == (kind, ne), name
        assert relative_error(got[name][2], values) <= 1e-6, (name, relative_error(got[name][2], values))
        if not np.array_equal(base[name][2], values):
            changed.add(name)
    return changed


@pytest.fixture(scope="module")
def gguf_case(case, tmp_path_factory):
    """(kind, base GGUF, adapter folder, converter's GGUF of PEFT's merge_and_unload) for the GGUF kinds."""
    kind, base, adapter, peft_model = case
    root = tmp_path_factory.mktemp(f"{kind}_gguf")
    merged = root / "peft_merged"
    with torch.no_grad():
        import copy
        copy.deepcopy(peft_model).merge_and_unload().save_pretrained(str(merged))
    return kind, convert_hf_to_gguf(base, root / "base.gguf"), adapter, convert_hf_to_gguf(merged, root / "merged.gguf")


def test_gguf_merge_matches_peft_merge(gguf_case, peftc_binary, tmp_path):
    kind, base_gguf, adapter, reference = gguf_case
    out = tmp_path / "ours.gguf"
    run = peftc(peftc_binary, "merge", "--base", base_gguf, "--out", out, "--adapter", adapter)
    assert run.returncode == 0, run.stderr
    changed = assert_gguf_close(tensors(out), tensors(reference), tensors(base_gguf))
    stacked = {f"blk.{l}.ffn_{w}_exps.weight" for l in range(2) for w in ("gate", "up", "down")}
    assert stacked <= changed, (kind, sorted(changed))
    assert {"blk.0.attn_q.weight", "blk.1.attn_q.weight"} <= changed


def test_llama_export_lora_applies_our_gguf_lora(gguf_case, peftc_binary, tmp_path):
    kind, base_gguf, adapter, _ = gguf_case
    lora = tmp_path / "adapter.gguf"
    run = peftc(peftc_binary, "adapter", "export", adapter, lora, "--format", "gguf", "--base", base_gguf)
    assert run.returncode == 0, run.stderr
    lora_tensors = tensors(lora)
    # Stacked pairs: lora_a (E, r, in), lora_b (E, out, r) as ne reversed; down_proj's rank pattern 3.
    assert lora_tensors["blk.0.ffn_gate_exps.weight.lora_a"][1] == [32, 2, EXPERTS]
    assert lora_tensors["blk.1.ffn_down_exps.weight.lora_b"][1] == [3, 32, EXPERTS]
    theirs = export_lora(base_gguf, [(lora, 1.0)], tmp_path / "llama.gguf")
    ours = tmp_path / "ours.gguf"
    run = peftc(peftc_binary, "merge", "--base", base_gguf, "--out", ours, "--adapter", adapter)
    assert run.returncode == 0, run.stderr
    changed = assert_gguf_close(tensors(theirs), tensors(ours), tensors(base_gguf))
    assert {f"blk.{l}.ffn_{w}_exps.weight" for l in range(2) for w in ("gate", "up", "down")} <= changed


def test_host_model_swaps_into_gguf_buffers(gguf_case, peft_c, peftc_binary, tmp_path):
    """A llama.cpp-family host holding the GGUF file's tensors (stacked experts [E, out, in], attn_q in
    the converter's row order) by their GGUF names, through a translator made from the file: a swap
    gives peft_c's own GGUF merge bit for bit, and a swap to none the file's bytes; so does the buffer
    merge of each tensor by its GGUF name, and its removal."""
    kind, base_gguf, adapter, _ = gguf_case
    ours = tmp_path / "ours.gguf"
    run = peftc(peftc_binary, "merge", "--base", base_gguf, "--out", ours, "--adapter", adapter)
    assert run.returncode == 0, run.stderr
    want = {name: values for name, (_, _, values) in tensors(ours).items()}
    checkpoint = peft_c.Checkpoint.open(str(base_gguf))
    translator = peft_c.Translator.from_gguf(checkpoint)
    adapted = {f"blk.{l}.{t}.weight" for l in range(2) for t in ("attn_q", "ffn_gate_exps", "ffn_up_exps",
                                                                   "ffn_down_exps")}
    buffers = {name: checkpoint.read(name, dtype=None) for name in sorted(adapted)}
    assert buffers["blk.0.ffn_gate_exps.weight"].shape == (EXPERTS, 16, 32)
    original = {name: array.copy() for name, array in buffers.items()}
    host = peft_c.HostModel()
    host.set_translator(translator)
    for name, array in buffers.items():
        host.add_weight(name, array)
    with peft_c.Registry("F32", 1 << 26) as registry:
        registry.register("a", str(adapter))
        lease = registry.acquire("a")
        stats = host.swap(lease, 1.0)
        lease.release()
    assert stats.layers_merged == len(buffers)
    for name, array in buffers.items():
        assert array.tobytes() == want[name].astype(array.dtype).tobytes(), (kind, name)  # bit for bit
        assert not np.array_equal(array, original[name]), name
    host.swap(None)
    for name, array in buffers.items():
        assert array.tobytes() == original[name].tobytes(), name
    host.close()

    # peft_merge_buffer_apply with the same translator: the same bytes, and back bit for bit.
    with peft_c.Adapter.open(str(adapter)) as opened:
        for name, array in buffers.items():
            record = peft_c.merge_into(opened, name, array, translator=translator, keep_original_rows=True)
            assert array.tobytes() == want[name].astype(array.dtype).tobytes(), (kind, name)
            record.remove(array)
            assert array.tobytes() == original[name].tobytes(), name
