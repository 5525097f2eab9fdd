"""`peftc adapter export` and `peftc adapter combine` against the real PEFT, transformers and safetensors:

* every fixture adapter re-exported by peftc is byte-identical to what PEFT wrote, loads with
  `PeftModel.from_pretrained` with no missing or unexpected keys, and gives the source adapter's logits;
* every corpus adapter's export equals `safetensors.torch.save(tensors, metadata={"format": "pt"})` byte for
  byte, and its config equals `json.dumps(config, indent=2, sort_keys=True)` byte for byte;
* random JSON in a config (unicode, control characters, floats of every magnitude) comes out exactly as
  Python's json.dumps writes it;
* `--dtype` exports hold torch's conversions; `--peft-version 0.13` configs carry only fields PEFT 0.13 knows
  (docs/peft-semantics.md, "Fields per PEFT release") and still give the source adapter's logits;
* combinations equal PEFT's own `add_weighted_adapter` ("cat" and "linear") on the same base: the factors,
  the merged delta weights, and a forward pass.

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA, PEFT_CORPUS (see conftest.py).
"""
from __future__ import annotations

import json
import math
import pathlib
import random
import struct
import subprocess
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
from peft import LoraConfig, PeftModel  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402
from peft.utils import load_peft_weights, set_peft_model_state_dict  # noqa: E402
from safetensors.torch import load_file, save  # noqa: E402

from merge_support import dare_keep  # noqa: E402

import os  # noqa: E402

# The same locations conftest.py uses (its helpers are fixtures, not imports).
REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = pathlib.Path(os.environ.get("PEFT_CORPUS") or REPO.parent / "shared" / "corpus" / "real")
FIXTURES = pathlib.Path(os.environ.get("PEFT_TEST_DATA") or REPO / "tests" / "fixtures")
NO_CORPUS = f"real corpus not found at {CORPUS} (set PEFT_CORPUS to its folder)"

ADAPTERS = FIXTURES / "adapters"
MANIFEST = json.loads((ADAPTERS / "MANIFEST.json").read_text()) if (ADAPTERS / "MANIFEST.json").exists() else {}
REFUSED_AT_OPEN: set[str] = set()  # fixture adapters peft_c refuses to open
# The reference stack cannot load these (transformers 4 module names on a transformers 5 model).
NOT_LOADABLE = {"vit_lora_v4_names"}

# LoraConfig + base config fields of PEFT 0.13 (docs/peft-semantics.md, "Fields per PEFT release";
# extracted from the v0.13.0 tag).
FIELDS_013 = {
    "task_type", "peft_type", "auto_mapping", "base_model_name_or_path", "revision", "inference_mode",
    "r", "target_modules", "lora_alpha", "lora_dropout", "fan_in_fan_out", "bias", "use_rslora",
    "modules_to_save", "init_lora_weights", "layers_to_transform", "layers_pattern", "rank_pattern",
    "alpha_pattern", "megatron_config", "megatron_core", "loftq_config", "use_dora", "layer_replication",
}


def exportable():
    return [name for name in sorted(MANIFEST) if name not in REFUSED_AT_OPEN]


def corpus_adapters():
    if not CORPUS.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=NO_CORPUS), id="absent")]
    dirs = sorted(p.parent for p in CORPUS.rglob("adapter_config.json") if (p.parent / "adapter_model.safetensors").exists())
    return [pytest.param(d, id=str(d.relative_to(CORPUS))) for d in dirs]


def run(peftc, *args, ok=True):
    result = subprocess.run([str(peftc), *map(str, args)], capture_output=True, text=True)
    if ok:
        assert result.returncode == 0, result.stderr
    return result


# ---- the reference side -----------------------------------------------------------------------------


def base_dir(name: str) -> pathlib.Path:
    return FIXTURES / MANIFEST[name]["base"]


def load_base(base: pathlib.Path):
    architecture = json.loads((base / "config.json").read_text())["architectures"][0]
    return getattr(transformers, architecture).from_pretrained(base, dtype="auto").eval()


def example_inputs(base: pathlib.Path) -> dict:
    if base.name.startswith("vit"):
        return {"pixel_values": torch.linspace(-1, 1, 3 * 8 * 8).reshape(1, 3, 8, 8)}
    ids = torch.tensor([[1, 5, 7, 9, 11, 3, 2, 4]])
    if base.name == "t5":
        return {"input_ids": ids, "decoder_input_ids": ids[:, :4]}
    return {"input_ids": ids}


def load_clean(base: pathlib.Path, adapter: pathlib.Path):
    """PeftModel.from_pretrained, checking that nothing is missing (its warning) or unexpected (the load
    result of loading the same weights again, filtered as PeftModel.load_adapter filters it)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = PeftModel.from_pretrained(load_base(base), adapter).eval()
    missing = [str(w.message) for w in caught if "missing adapter keys" in str(w.message)]
    assert not missing, missing
    result = set_peft_model_state_dict(model, load_peft_weights(str(adapter)), adapter_name="default")
    assert [k for k in result.missing_keys if "lora_" in k and "default" in k] == []
    assert result.unexpected_keys == [], result.unexpected_keys
    return model


def logits(model, base: pathlib.Path) -> torch.Tensor:
    with torch.no_grad():
        return model(**example_inputs(base)).logits.float()


# ---- export -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", exportable())
def test_fixture_export_is_peft_save_pretrained(name, peftc_binary, tmp_path):
    source = ADAPTERS / name
    out = tmp_path / name
    run(peftc_binary, "adapter", "export", source, out)
    assert (out / "adapter_model.safetensors").read_bytes() == (source / "adapter_model.safetensors").read_bytes()
    assert (out / "adapter_config.json").read_bytes() == (source / "adapter_config.json").read_bytes()
    if name in NOT_LOADABLE:
        return
    base = base_dir(name)
    exported = load_clean(base, out)
    original = PeftModel.from_pretrained(load_base(base), source).eval()
    assert torch.equal(logits(exported, base), logits(original, base))


@pytest.mark.parametrize("corpus_adapter", corpus_adapters())
def test_corpus_export_matches_the_reference_writers(corpus_adapter, peftc_binary, tmp_path):
    out = tmp_path / "out"
    run(peftc_binary, "adapter", "export", corpus_adapter, out)
    tensors = load_file(corpus_adapter / "adapter_model.safetensors")
    renamed = {}
    for key, value in tensors.items():  # PEFT's saved key of each tensor (all corpus keys already are)
        assert key.startswith("base_model.model."), key
        renamed[key] = value
    assert (out / "adapter_model.safetensors").read_bytes() == save(renamed, metadata={"format": "pt"})
    config = json.loads((corpus_adapter / "adapter_config.json").read_text())
    config["inference_mode"] = True
    assert (out / "adapter_config.json").read_text() == json.dumps(config, indent=2, sort_keys=True)
    # PEFT reads the config back (unknown fields dropped with a warning where there are any).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        LoraConfig.from_pretrained(out)


def _random_string(rng: random.Random) -> str:
    pools = [range(0x20, 0x7F), range(0, 0x20), [0x7F, 0xA0, 0xE9, 0x2603, 0xFFFD, 0xFEFF],
             range(0x1F600, 0x1F650), range(0x4E00, 0x4E20), [ord('"'), ord("\\"), ord("/")]]
    return "".join(chr(rng.choice(rng.choice(pools))) for _ in range(rng.randint(0, 12)))


def _random_float(rng: random.Random) -> float:
    while True:
        choice = rng.random()
        if choice < 0.5:
            value = struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0]
        elif choice < 0.8:
            value = rng.uniform(-1, 1) * 10.0 ** rng.randint(-8, 20)
        else:
            value = float(rng.randint(-10**6, 10**6)) / rng.choice([1, 2, 4, 10, 100, 3])
        if math.isfinite(value):
            return value


def _random_value(rng: random.Random, depth: int = 0):
    kind = rng.randint(0, 8 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.random() < 0.5
    if kind == 2:
        return rng.choice([rng.randint(-2**63, 2**64 - 1), rng.randint(-1000, 1000)])
    if kind in (3, 4):
        return _random_float(rng)
    if kind == 5:
        return _random_string(rng)
    if kind in (6, 7):
        return {_random_string(rng): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}
    return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]


@pytest.mark.parametrize("seed", range(6))
def test_config_text_is_pythons_json_dumps(seed, peftc_binary, tmp_path):
    rng = random.Random(seed)
    source = tmp_path / "src"
    source.mkdir()
    (source / "adapter_model.safetensors").write_bytes((ADAPTERS / "llama_lora" / "adapter_model.safetensors").read_bytes())
    config = json.loads((ADAPTERS / "llama_lora" / "adapter_config.json").read_text())
    for i in range(40):
        config[f"x_{i}_{_random_string(rng)}"] = _random_value(rng)
    config["lora_dropout"] = _random_float(rng)
    # Written compactly and unsorted: the export must not depend on the source's layout.
    (source / "adapter_config.json").write_text(json.dumps(config, ensure_ascii=False))
    out = tmp_path / "out"
    run(peftc_binary, "adapter", "export", source, out)
    assert (out / "adapter_config.json").read_text() == json.dumps(config, indent=2, sort_keys=True)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_dtype_export_holds_torchs_conversion(dtype, peftc_binary, tmp_path):
    torch_dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    source = ADAPTERS / "llama_lora"
    out = tmp_path / dtype
    run(peftc_binary, "adapter", "export", source, out, "--dtype", dtype)
    written = load_file(out / "adapter_model.safetensors")
    for key, value in load_file(source / "adapter_model.safetensors").items():
        assert written[key].dtype == torch_dtype
        assert torch.equal(written[key], value.to(torch_dtype)), key
    model = load_clean(base_dir("llama_lora"), out)
    # autocast_adapter_dtype brings the factors back to f32 when loading: the rounded values, exactly.
    state = {k: v for k, v in model.state_dict().items() if "lora_" in k}
    assert state and all(v.dtype == torch.float32 for v in state.values())


@pytest.mark.parametrize("name", exportable())
def test_export_for_peft_013(name, peftc_binary, tmp_path):
    source = ADAPTERS / name
    out = tmp_path / name
    result = run(peftc_binary, "adapter", "export", source, out, "--peft-version", "0.13", ok=False)
    config = json.loads((source / "adapter_config.json").read_text())
    if result.returncode != 0:
        # Refused: the message names a field that matters and that PEFT 0.13 lacks or reads differently.
        assert result.returncode == 1 and "UNSUPPORTED" in result.stderr, result.stderr
        field = result.stderr.split('field "', 1)[1].split('"', 1)[0]
        if field in FIELDS_013:
            assert field in ("rank_pattern", "alpha_pattern", "layers_to_transform"), result.stderr
            assert config[field], result.stderr
        else:
            assert config.get(field) not in (None, False, [], {}, ""), result.stderr
        assert not out.exists()
        return
    written = json.loads((out / "adapter_config.json").read_text())
    # PEFT 0.13's LoraConfig(**config) raises TypeError on any other field.
    assert set(written) <= FIELDS_013, sorted(set(written) - FIELDS_013)
    for key, value in written.items():
        assert value == (True if key == "inference_mode" else config[key]), key
    LoraConfig(**{k: v for k, v in written.items() if k != "peft_type"})
    if name in NOT_LOADABLE:
        return
    base = base_dir(name)
    exported = load_clean(base, out)
    original = PeftModel.from_pretrained(load_base(base), source).eval()
    assert torch.equal(logits(exported, base), logits(original, base))


# ---- combine ------------------------------------------------------------------------------------------

COMBINATIONS = [
    # (adapters, weights, combination_type)
    (["llama_lora", "llama_lora_second"], [0.7, -1.3], "cat"),
    (["llama_lora", "llama_lora_second"], [0.7, -1.3], "linear"),
    (["llama_lora_second", "llama_lora"], [1.0, 0.25], "linear"),
    (["llama_lora"], [2.0], "linear"),
    (["llama_lora"], [-0.5], "cat"),  # one adapter: PEFT forces "linear"
    (["llama_rslora", "llama_lora"], [1.0, 1.0], "cat"),  # use_rslora inherited: sqrt(r) scaling
    (["llama_lora", "llama_rslora"], [0.5, 2.0], "linear"),
    (["llama_rank_alpha_pattern", "llama_lora"], [1.0, 0.5], "cat"),  # rank_pattern: padding to max ranks
    (["llama_lora", "llama_layers_to_transform", "llama_all_linear"], [1.0, -1.0, 0.3], "cat"),
    (["llama_lora", "llama_all_linear"], [1.0, 1.0], "linear"),
    (["llama_regex", "llama_regex"], [1.0, 2.0], "cat"),
    (["gpt2_lora", "gpt2_lora"], [1.0, 0.5], "cat"),  # Conv1D layers
    (["qwen2_lora", "qwen2_lora"], [1.0, 0.5], "linear"),
]


def _peft_combination(dirs, weights, how, base):
    model = PeftModel.from_pretrained(load_base(base), dirs[0], adapter_name="a0").eval()
    for i, d in enumerate(dirs[1:], start=1):
        model.load_adapter(d, adapter_name=f"a{i}")
    model.add_weighted_adapter([f"a{i}" for i in range(len(dirs))], weights, "combined", combination_type=how)
    model.set_adapter("combined")
    return model


def _factors(layer, name):
    if name in layer.lora_A:
        return layer.lora_A[name].weight, layer.lora_B[name].weight
    return layer.lora_embedding_A[name], layer.lora_embedding_B[name]


def _check_combination(peftc, dirs, weights, how, base, out):
    args = ["adapter", "combine", "--method", how, "--out", out]
    for d, weight in zip(dirs, weights):
        args += ["--adapter", f"{d}:{weight!r}"]
    run(peftc, *args)
    ours = load_clean(base, out)
    reference = _peft_combination(dirs, weights, how, base)

    # The config PEFT would save for the combination (target_modules: a set, in hash order for PEFT).
    reference_config = reference.peft_config["combined"].to_dict()
    written = json.loads((out / "adapter_config.json").read_text())
    for key in ("r", "lora_alpha", "use_rslora", "rank_pattern", "alpha_pattern", "layers_to_transform",
                "task_type", "base_model_name_or_path"):
        assert written[key] == reference_config[key], key
    targets = reference_config["target_modules"]
    if isinstance(targets, str):
        assert written["target_modules"] == targets
    elif len(written["target_modules"]) < 20:
        assert set(written["target_modules"]) == set(targets)
    else:  # PEFT shortens 20+ names to suffixes against the base's modules; the same modules are adapted:
        assert len(targets) < len(written["target_modules"])

    # Factors and merged deltas, module by module.
    ours_layers = {n: m for n, m in ours.named_modules() if isinstance(m, LoraLayer)}
    ref_layers = {n: m for n, m in reference.named_modules() if isinstance(m, LoraLayer)
                  and ("combined" in m.lora_A or "combined" in m.lora_embedding_A)}
    assert set(ours_layers) == set(ref_layers)
    for module_name, layer in ours_layers.items():
        ref = ref_layers[module_name]
        assert layer.scaling["default"] == ref.scaling["combined"], module_name
        a, b = _factors(layer, "default")
        ra, rb = _factors(ref, "combined")
        assert a.shape == ra.shape and b.shape == rb.shape, module_name
        # -0.0 and 0.0 compare equal: PEFT's padding is a random init times 0.0
        assert torch.equal(a, ra), module_name
        assert torch.equal(b, rb), module_name
        with torch.no_grad():
            assert torch.equal(layer.get_delta_weight("default"), ref.get_delta_weight("combined")), module_name
    assert torch.equal(logits(ours, base), logits(reference, base))


@pytest.mark.parametrize("names,weights,how", COMBINATIONS,
                         ids=["+".join(c[0]) + f"-{c[2]}" for c in COMBINATIONS])
def test_combine_equals_add_weighted_adapter(names, weights, how, peftc_binary, tmp_path):
    _check_combination(peftc_binary, [ADAPTERS / n for n in names], weights, how, base_dir(names[0]),
                       tmp_path / "combined")


def _make_adapter(base: pathlib.Path, out: pathlib.Path, seed: int, **lora) -> pathlib.Path:
    """A PEFT adapter with seeded random factors, saved without full embedding copies."""
    model = peft.get_peft_model(load_base(base), LoraConfig(**lora))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
    model.save_pretrained(out, save_embedding_layers=False)
    return out


@pytest.mark.parametrize("how", ["cat", "linear"])
def test_combine_embedding_and_conv_layers(how, peftc_binary, tmp_path):
    llama = FIXTURES / "models" / "llama"
    rank2 = 2 if how == "cat" else 4  # cat takes different ranks
    first = _make_adapter(llama, tmp_path / "e1", 1, r=4, lora_alpha=8, target_modules=["embed_tokens", "q_proj"],
                          task_type="CAUSAL_LM")
    second = _make_adapter(llama, tmp_path / "e2", 2, r=rank2, lora_alpha=4, target_modules=["embed_tokens"],
                           task_type="CAUSAL_LM")
    _check_combination(peftc_binary, [first, second], [0.8, -0.6], how, llama, tmp_path / "emb")

    vit = FIXTURES / "models" / "vit"
    c1 = _make_adapter(vit, tmp_path / "c1", 3, r=4, lora_alpha=8, target_modules=["projection"])
    c2 = _make_adapter(vit, tmp_path / "c2", 4, r=rank2, lora_alpha=16, target_modules=["projection"])
    _check_combination(peftc_binary, [c1, c2], [1.5, 0.5], how, vit, tmp_path / "conv")


def test_combine_refuses_what_peft_would_get_wrong(peftc_binary, tmp_path):
    out = tmp_path / "refused"
    for names in (["llama_dora", "llama_lora"], ["qwen2_lora_bias", "qwen2_lora"],
                  ["bert_seqcls_lora", "bert_seqcls_lora"], ["llama_layers_to_transform", "llama_lora"]):
        args = ["adapter", "combine", "--method", "cat", "--out", out]
        for name in names:
            args += ["--adapter", f"{ADAPTERS / name}:1"]
        result = run(peftc_binary, *args, ok=False)
        assert result.returncode == 1 and "UNSUPPORTED" in result.stderr, (names, result.stderr)
        assert not out.exists()


def test_layers_to_transform_inheritance_is_what_peft_does(tmp_path):
    """The refusal above is justified: PEFT's combination with llama_layers_to_transform first silently
    loses llama_lora's layer-0 modules."""
    model = _peft_combination([ADAPTERS / "llama_layers_to_transform", ADAPTERS / "llama_lora"], [1.0, 1.0], "cat",
                              base_dir("llama_lora"))
    adapted = {n for n, m in model.named_modules() if isinstance(m, LoraLayer) and "combined" in m.lora_A}
    assert adapted and all(".layers.1." in n for n in adapted)
    from_lora = {n for n, m in model.named_modules() if isinstance(m, LoraLayer) and "a1" in m.lora_A}
    assert any(".layers.0." in n for n in from_lora)


# ---- the pruning combination types (ties, dare_*, magnitude_prune) ------------------------------------

def _dare_mask(seed: int, module: str, adapter: int, factor: int, shape, density: float) -> torch.Tensor:
    keep = dare_keep(seed, module, adapter, factor, math.prod(shape), density)
    return torch.tensor(keep, dtype=torch.float32).reshape(shape)


def _peft_masks(model, adapters, seed, density):
    """The masks torch.bernoulli must return, in the order add_weighted_adapter asks for them: per module
    (named_modules order), the lora_A factors of the adapters that have it, then their lora_B factors."""
    masks = []
    for name, layer in model.named_modules():
        if not isinstance(layer, LoraLayer):
            continue
        present = [a for a in adapters if a in layer.lora_A]
        if not present:
            continue
        module = name[len("base_model.model."):]
        for factor in (0, 1):
            for i, a in enumerate(present):
                weight = (layer.lora_A if factor == 0 else layer.lora_B)[a].weight
                masks.append(_dare_mask(seed, module, i, factor, tuple(weight.shape), density))
    return masks


PRUNING = [
    # (combination_type, density, majority_sign_method, weights)
    ("ties", 0.5, "total", [0.7, -1.3]),
    ("ties", 0.3, "frequency", [1.0, 0.4]),
    ("magnitude_prune", 0.6, "total", [0.7, -1.3]),
    ("dare_linear", 0.5, "total", [0.7, -1.3]),
    ("dare_ties", 0.4, "total", [1.0, 0.5]),
    ("dare_ties", 0.7, "frequency", [-0.8, 1.2]),
    ("ties", 1.0, "total", [0.7, -1.3]),  # density 1: nothing pruned, the election remains
]


@pytest.mark.parametrize("how,density,sign,weights", PRUNING, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in PRUNING])
def test_pruning_combinations_equal_add_weighted_adapter(how, density, sign, weights, peftc_binary, tmp_path,
                                                         monkeypatch):
    """ties / dare_* / magnitude_prune equal PEFT's, bit for bit; for DARE PEFT is given peft_c's masks (its own
    come from torch's global generator)."""
    seed = 1234567
    dirs = [ADAPTERS / "llama_lora", ADAPTERS / "llama_lora_second"]
    base = base_dir("llama_lora")
    out = tmp_path / "combined"
    args = ["adapter", "combine", "--method", how, "--out", out, "--density", repr(density),
            "--majority-sign", sign, "--seed", str(seed)]
    for d, weight in zip(dirs, weights):
        args += ["--adapter", f"{d}:{weight!r}"]
    run(peftc_binary, *args)
    ours = load_clean(base, out)

    model = PeftModel.from_pretrained(load_base(base), dirs[0], adapter_name="a0").eval()
    model.load_adapter(dirs[1], adapter_name="a1")
    if how.startswith("dare") and density < 1:
        masks = _peft_masks(model, ["a0", "a1"], seed, density)
        def bernoulli(p, *a, **k):
            mask = masks.pop(0)
            assert mask.shape == p.shape and torch.all(p == density)
            return mask
        monkeypatch.setattr(torch, "bernoulli", bernoulli)
    model.add_weighted_adapter(["a0", "a1"], weights, "combined", combination_type=how, density=density,
                               majority_sign_method=sign)
    monkeypatch.undo()
    if how.startswith("dare") and density < 1:
        assert not masks
    model.set_adapter("combined")

    ours_layers = {n: m for n, m in ours.named_modules() if isinstance(m, LoraLayer)}
    ref_layers = {n: m for n, m in model.named_modules() if isinstance(m, LoraLayer) and "combined" in m.lora_A}
    assert set(ours_layers) == set(ref_layers) and ours_layers
    pruned = 0
    for name, layer in ours_layers.items():
        a, b = _factors(layer, "default")
        ra, rb = _factors(ref_layers[name], "combined")
        assert torch.equal(a, ra), name
        assert torch.equal(b, rb), name
        pruned += int((a == 0).sum()) + int((b == 0).sum())
    if density < 1:
        assert pruned > 0  # the pruning did something
    assert torch.equal(logits(ours, base), logits(model, base))


def test_dare_masks_keep_the_density_and_change_with_the_seed(peftc_binary, tmp_path):
    """The statistics of the masks: the kept fraction is the density within 4 standard deviations, and
    another seed gives other masks."""
    dirs = [ADAPTERS / "llama_lora", ADAPTERS / "llama_lora_second"]
    factors = {}
    for seed in (1, 2):
        out = tmp_path / f"s{seed}"
        args = ["adapter", "combine", "--method", "dare_linear", "--out", out, "--density", "0.25", "--seed", str(seed)]
        for d in dirs:
            args += ["--adapter", f"{d}:1.0"]
        run(peftc_binary, *args)
        factors[seed] = load_file(str(out / "adapter_model.safetensors"))
    assert factors[1].keys() == factors[2].keys()
    assert any(not torch.equal(factors[1][k], factors[2][k]) for k in factors[1])
    # One adapter alone: the kept fraction of its factors is the mask's.
    out = tmp_path / "one"
    run(peftc_binary, "adapter", "combine", "--method", "dare_linear", "--out", out, "--density", "0.25",
        "--adapter", f"{dirs[0]}:1.0", "--adapter", f"{dirs[0]}:0.0")
    combined = load_file(str(out / "adapter_model.safetensors"))
    source = load_file(str(dirs[0] / "adapter_model.safetensors"))
    kept = total = 0
    for key, value in combined.items():
        kept += int((value != 0).sum())
        total += value.numel()
        assert source[key].shape == value.shape
    p = 0.25
    assert abs(kept / total - p) < 4 * math.sqrt(p * (1 - p) / total), (kept, total)


def test_pruning_combinations_refuse_bad_settings(peftc_binary, tmp_path):
    dirs = [ADAPTERS / "llama_lora", ADAPTERS / "llama_lora_second"]
    base_args = ["adapter", "combine", "--out", tmp_path / "x"]
    for d in dirs:
        base_args += ["--adapter", f"{d}:1.0"]
    result = run(peftc_binary, *base_args, "--method", "ties", ok=False)
    assert result.returncode == 1 and "INVALID_ARGUMENT" in result.stderr and "density" in result.stderr
    result = run(peftc_binary, *base_args, "--method", "ties", "--density", "1.5", ok=False)
    assert result.returncode == 2 and "density" in result.stderr
    result = run(peftc_binary, *base_args, "--method", "ties", "--density", "0.5", "--majority-sign", "max", ok=False)
    assert result.returncode == 2
    # unequal ranks, as PEFT
    result = run(peftc_binary, "adapter", "combine", "--out", tmp_path / "y", "--method", "dare_ties", "--density",
                 "0.5", "--adapter", f"{ADAPTERS / 'llama_rank_alpha_pattern'}:1", "--adapter",
                 f"{ADAPTERS / 'llama_lora'}:1", ok=False)
    assert result.returncode == 1 and "INVALID_ARGUMENT" in result.stderr and "rank" in result.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
