"""`peftc adapter inspect --json` against PEFT itself.

1. Real adapters (the corpus) and the fixture adapters: the LoRA modules peftc reports are the ones in
   the file, each is targeted according to PEFT's own `check_target_module_exists`, and its rank,
   alpha and scaling are what PEFT's `get_pattern_key` and LoraLayer.update_layer give.
2. Adapters made here with PEFT on tiny random models, with every matching feature (regex
   target_modules, exclude_modules as list and regex, layers_to_transform with and without
   layers_pattern, rank_pattern / alpha_pattern with regex and anchored keys in a non-sorted file order,
   use_rslora, modules_to_save, all-linear): peftc's modules, ranks, alphas and scalings equal the
   values on the LoRA layers of the PeftModel that PEFT builds from the same saved adapter.
"""
from __future__ import annotations

import json
import math
import pathlib
import subprocess

import pytest

peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402
from peft import LoraConfig, PeftConfig, PeftModel, get_peft_model  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402
from peft.tuners.tuners_utils import _ExcludedModule, check_target_module_exists  # noqa: E402
from peft.utils.other import get_pattern_key  # noqa: E402

LORA_KINDS = {"linear", "conv1d", "embedding", "conv2d"}
PREFIX = "base_model.model."

# Fixture adapters that peft_c refuses on purpose, with the code it gives.
REFUSED_FIXTURES: dict[str, str] = {}  # fixture adapters peftc refuses to open, with the error code


def inspect(peftc, adapter_dir, *extra):
    run = subprocess.run([str(peftc), "adapter", "inspect", str(adapter_dir), "--json", *extra],
                         capture_output=True, text=True)
    return run


def inspect_ok(peftc, adapter_dir, *extra):
    run = inspect(peftc, adapter_dir, *extra)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


def lora_modules_in_file(adapter_dir: pathlib.Path) -> set[str]:
    """LoRA module names as PEFT's key layout defines them: the part before '.lora_'."""
    with safe_open(str(adapter_dir / "adapter_model.safetensors"), framework="np") as f:
        keys = list(f.keys())
    modules = set()
    for key in keys:
        key = key.removeprefix(PREFIX)
        if ".lora_" in key:
            modules.add(key.split(".lora_")[0])
    return modules


def peft_rank_alpha_scaling(config, name):
    """What LoraModel._create_and_replace and LoraLayer.update_layer compute for module `name`."""
    r_key = get_pattern_key(config.rank_pattern.keys(), name)
    alpha_key = get_pattern_key(config.alpha_pattern.keys(), name)
    r = config.rank_pattern.get(r_key, config.r)
    alpha = config.alpha_pattern.get(alpha_key, config.lora_alpha)
    scaling = alpha / math.sqrt(r) if config.use_rslora else alpha / r
    return r, alpha, scaling


def check_against_peft_functions(peftc, adapter_dir: pathlib.Path):
    config = PeftConfig.from_pretrained(str(adapter_dir))
    report = inspect_ok(peftc, adapter_dir)
    reported = {m["module"]: m for m in report["modules"] if m["kind"] in LORA_KINDS}
    assert set(reported) == lora_modules_in_file(adapter_dir)
    assert report["r"] == config.r
    assert report["lora_alpha"] == config.lora_alpha
    assert report["use_rslora"] == config.use_rslora
    assert report["use_dora"] == bool(config.use_dora)
    expandable = config.target_modules is None or (
        isinstance(config.target_modules, str) and config.target_modules.lower() == "all-linear")
    for name, module in reported.items():
        if config.target_parameters and name.split(".base_layer")[0].endswith(".experts"):
            continue  # LoRA on a stacked expert parameter: test_moe_experts.py merges it against PEFT
        if not expandable:
            found = check_target_module_exists(config, name)
            assert found and not isinstance(found, _ExcludedModule), f"PEFT does not target {name}"
        r, alpha, scaling = peft_rank_alpha_scaling(config, name)
        assert module["rank"] == r, name
        assert module["alpha"] == alpha, name
        assert module["scaling"] == pytest.approx(scaling, rel=1e-15), name
    return report


def corpus_adapters(corpus):
    return sorted(p.parent for p in corpus.rglob("adapter_config.json"))


def test_corpus_adapters_match_peft(peftc_binary, corpus_dir):
    adapters = corpus_adapters(corpus_dir)
    assert len(adapters) >= 10
    for adapter_dir in adapters:
        check_against_peft_functions(peftc_binary, adapter_dir)


def fixture_adapters(fixtures_dir):
    root = fixtures_dir / "adapters"
    return sorted(p.parent for p in root.glob("*/adapter_config.json")) if root.is_dir() else []


def test_fixture_adapters_match_peft(peftc_binary, fixtures_dir):
    adapters = fixture_adapters(fixtures_dir)
    if not adapters:
        pytest.skip(f"no fixture adapters in {fixtures_dir / 'adapters'} (run tests/fixtures/generate.py)")
    manifest = json.loads((fixtures_dir / "adapters" / "MANIFEST.json").read_text())
    for adapter_dir in adapters:
        name = adapter_dir.name
        base = fixtures_dir / manifest[name]["base"]
        if name in REFUSED_FIXTURES:
            run = inspect(peftc_binary, adapter_dir)
            assert run.returncode == 1
            assert f"peftc: error: {REFUSED_FIXTURES[name]}:" in run.stderr
            continue
        check_against_peft_functions(peftc_binary, adapter_dir)
        report = inspect_ok(peftc_binary, adapter_dir, "--base", str(base))
        assert report["validation"]["ok"], report["validation"]


# ---- adapters made here with PEFT ---------------------------------------------------------------

def tiny_llama(tmp_path: pathlib.Path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=24, num_hidden_layers=3,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                      vocab_size=32, max_position_embeddings=32)
    model = transformers.LlamaForCausalLM(config)
    base = tmp_path / "base"
    model.save_pretrained(base)
    return model, base


CASES = {
    "regex_targets": dict(target_modules=r".*\.(q_proj|v_proj)"),
    "regex_targets_layers": dict(target_modules=r"model\.layers\.[02]\.(self_attn\.o_proj|mlp\.\w+_proj)"),
    "exclude_list": dict(target_modules=["q_proj", "v_proj", "down_proj"],
                         exclude_modules=["model.layers.1.self_attn.q_proj", "v_proj"]),
    "exclude_regex": dict(target_modules=["q_proj", "k_proj"], exclude_modules=r".*layers\.2\..*"),
    "layers_to_transform_int": dict(target_modules=["q_proj", "up_proj"], layers_to_transform=1),
    "layers_to_transform_pattern": dict(target_modules=["q_proj", "o_proj"], layers_to_transform=[0, 2],
                                        layers_pattern="layers"),
    "rank_alpha_patterns": dict(
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"],
        r=4, lora_alpha=8,
        # Not alphabetical: for layers.2.k_proj the file order gives 3, sorted order would give 2.
        rank_pattern={"^model.layers.1.self_attn.k_proj": 6, r"layers\.2\..*proj": 3, "k_proj": 2},
        alpha_pattern={"o_proj": 3, r"model\.layers\.0\.self_attn\.(q|v)_proj": 5.5}),
    "rslora": dict(target_modules=["q_proj", "v_proj"], r=6, lora_alpha=7, use_rslora=True,
                   rank_pattern={"v_proj": 3}),
    "modules_to_save": dict(target_modules=["q_proj", "lm_head"], modules_to_save=["lm_head"]),
    "all_linear": dict(target_modules="all-linear"),
}


def peft_layers(peft_model):
    out = {}
    for name, module in peft_model.named_modules():
        if isinstance(module, LoraLayer) and "default" in module.r:
            out[name.removeprefix(PREFIX)] = (module.r["default"], module.lora_alpha["default"],
                                              module.scaling["default"])
    return out


def restore_pattern_order(adapter_dir: pathlib.Path, case: dict):
    """PEFT writes rank_pattern / alpha_pattern with sorted keys, but matched them in the order the
    user gave while training. Write them back in that order (not alphabetical in these cases), so that
    PEFT loads what it trained and the test covers "first key in file order"."""
    path = adapter_dir / "adapter_config.json"
    config = json.loads(path.read_text())
    for field in ("rank_pattern", "alpha_pattern"):
        if case.get(field):
            config[field] = dict(case[field])
    path.write_text(json.dumps(config, indent=2))


@pytest.mark.parametrize("case", sorted(CASES))
def test_peft_made_adapter(peftc_binary, tmp_path, case):
    model, base = tiny_llama(tmp_path)
    config = LoraConfig(task_type="CAUSAL_LM", init_lora_weights=False, **CASES[case])
    peft_model = get_peft_model(model, config)
    adapter_dir = tmp_path / "adapter"
    peft_model.save_pretrained(adapter_dir)
    restore_pattern_order(adapter_dir, CASES[case])

    # What PEFT builds when it loads this very file.
    fresh, _ = tiny_llama(tmp_path / "fresh")
    loaded = PeftModel.from_pretrained(fresh, str(adapter_dir))
    expected = peft_layers(loaded)
    assert expected, "PEFT made no LoRA layer"

    for extra in ((), ("--base", str(base))):
        report = inspect_ok(peftc_binary, adapter_dir, *extra)
        reported = {m["module"]: m for m in report["modules"] if m["kind"] in LORA_KINDS}
        assert set(reported) == set(expected)
        for name, (r, alpha, scaling) in expected.items():
            assert reported[name]["rank"] == r, name
            assert reported[name]["alpha"] == alpha, name
            assert reported[name]["scaling"] == pytest.approx(scaling, rel=1e-15), name
        if extra:
            assert report["validation"]["ok"]
    check_against_peft_functions(peftc_binary, adapter_dir)


# ---- the config, as PEFT writes it ---------------------------------------------------------------

def test_canonical_config_json(peftc_binary, corpus_dir, fixtures_dir):
    """`adapter inspect --config` is json.dumps(config, indent=2, sort_keys=True) of the file."""
    dirs = corpus_adapters(corpus_dir) + [d for d in fixture_adapters(fixtures_dir) if d.name not in REFUSED_FIXTURES]
    for adapter_dir in dirs:
        run = subprocess.run([str(peftc_binary), "adapter", "inspect", str(adapter_dir), "--config"],
                             capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        expected = json.dumps(json.loads((adapter_dir / "adapter_config.json").read_text()), indent=2, sort_keys=True)
        assert run.stdout == expected + "\n", adapter_dir


# ---- what PEFT's loader accepts and refuses ------------------------------------------------------

def test_default_adapter_name_in_keys(peftc_binary, tmp_path):
    """Keys that still carry the adapter name "default" (lora_A.default.weight): PEFT 0.21 loads them
    under the default name, and peftc reads the same modules and ranks (and says so in a note)."""
    from safetensors.torch import load_file, save_file

    model, base = tiny_llama(tmp_path)
    peft_model = get_peft_model(model, LoraConfig(target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    plain = tmp_path / "plain"
    peft_model.save_pretrained(plain)
    named = tmp_path / "named"
    named.mkdir()
    (named / "adapter_config.json").write_text((plain / "adapter_config.json").read_text())
    state = load_file(str(plain / "adapter_model.safetensors"))
    renamed = {k.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight"): v
               for k, v in state.items()}
    save_file(renamed, str(named / "adapter_model.safetensors"), metadata={"format": "pt"})

    fresh, _ = tiny_llama(tmp_path / "fresh")
    loaded = PeftModel.from_pretrained(fresh, str(named))
    for key, value in state.items():
        module, _, rest = key.removeprefix(PREFIX).partition(".lora_")
        layer = loaded.base_model.model.get_submodule(module)
        assert torch.equal(getattr(layer, "lora_" + rest.split(".")[0])["default"].weight, value)

    report = inspect_ok(peftc_binary, named)
    assert {m["module"] for m in report["modules"]} == set(peft_layers(loaded))
    assert any('"default"' in note for note in report["notes"])


def test_shape_mismatch_agrees_with_peft(peftc_binary, tmp_path):
    """An adapter loaded on a base with other MLP sizes: PEFT refuses it with size mismatches, and
    peftc's validation names exactly the same modules."""
    import re

    model, base = tiny_llama(tmp_path)
    peft_model = get_peft_model(model, LoraConfig(target_modules=["q_proj", "up_proj", "down_proj"],
                                                  init_lora_weights=False))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(adapter)
    other_config = transformers.LlamaConfig(hidden_size=16, intermediate_size=40, num_hidden_layers=3,
                                            num_attention_heads=2, num_key_value_heads=1, head_dim=8,
                                            vocab_size=32, max_position_embeddings=32)
    other = transformers.LlamaForCausalLM(other_config)
    other_dir = tmp_path / "other_base"
    other.save_pretrained(other_dir)

    with pytest.raises(RuntimeError) as failure:
        PeftModel.from_pretrained(other, str(adapter))
    peft_modules = set(re.findall(r"size mismatch for base_model\.model\.(\S+?)\.lora_[AB]\.", str(failure.value)))
    assert peft_modules

    run = inspect(peftc_binary, adapter, "--base", str(other_dir))
    assert run.returncode == 1
    validation = json.loads(run.stdout)["validation"]
    assert validation["code"] == "SHAPE_MISMATCH"
    peftc_modules = set(re.findall(r'module "([^"]+)"', validation["message"]))
    assert peftc_modules == peft_modules


# Configs PEFT itself refuses (LoraConfig.__post_init__ / PeftConfig) are INVALID_CONFIG; configs PEFT
# accepts but whose merge is not plain LoRA, or that rewrite the base at load, are UNSUPPORTED.
REFUSED_BY_PEFT = {
    "layers_pattern_alone": {"layers_pattern": "layers"},
    "layers_with_regex": {"target_modules": ".*q_proj", "layers_to_transform": [0]},
    "lora_bias_with_dora": {"lora_bias": True, "use_dora": True},
    "bad_task_type": {"task_type": "CLASSIFY"},
    "no_peft_type": {"peft_type": None},
}
UNSUPPORTED_BUT_VALID = {
    "pissa": {"init_lora_weights": "pissa"},
    "olora": {"init_lora_weights": "olora"},
    "qalora": {"use_qalora": True},
    "layer_replication": {"layer_replication": [[0, 2], [1, 3]]},
    "waveft": {"peft_type": "WAVEFT"},  # (VERA merges since issue 18)
}


@pytest.fixture(scope="module")
def plain_adapter(tmp_path_factory):
    root = tmp_path_factory.mktemp("plain")
    model, _ = tiny_llama(root)
    get_peft_model(model, LoraConfig(target_modules=["q_proj"], init_lora_weights=False)).save_pretrained(root / "a")
    return root / "a"


def patched(plain_adapter, tmp_path, patch):
    import shutil

    out = tmp_path / "patched"
    shutil.copytree(plain_adapter, out)
    config = json.loads((out / "adapter_config.json").read_text())
    for key, value in patch.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (out / "adapter_config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("case", sorted(REFUSED_BY_PEFT))
def test_configs_peft_refuses(peftc_binary, plain_adapter, tmp_path, case):
    adapter = patched(plain_adapter, tmp_path, REFUSED_BY_PEFT[case])
    with pytest.raises(Exception):
        PeftConfig.from_pretrained(str(adapter))
    run = inspect(peftc_binary, adapter)
    assert run.returncode == 1
    assert run.stderr.startswith("peftc: error: INVALID_CONFIG: "), run.stderr


@pytest.mark.parametrize("case", sorted(UNSUPPORTED_BUT_VALID))
def test_configs_peft_accepts_but_peftc_refuses(peftc_binary, plain_adapter, tmp_path, case):
    patch = UNSUPPORTED_BUT_VALID[case]
    adapter = patched(plain_adapter, tmp_path, patch)
    PeftConfig.from_pretrained(str(adapter))  # valid for PEFT
    run = inspect(peftc_binary, adapter)
    assert run.returncode == 1
    assert run.stderr.startswith("peftc: error: UNSUPPORTED: "), run.stderr
    field = next(k for k in patch if k != "feedforward_modules")
    assert f'"{field}"' in run.stderr


# ---- random configs: PEFT's functions decide, peftc must agree -----------------------------------

MODULE_NAMES = [f"model.layers.{layer}.{block}.{proj}" for layer in range(12)
                for block, projs in (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
                                     ("mlp", ("gate_proj", "up_proj", "down_proj")))
                for proj in projs] + [f"model.layers.{layer}.block_sparse_moe.experts.{e}.w1"
                                      for layer in range(3) for e in range(3)] + ["lm_head", "model.embed_tokens"]
SUFFIXES = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj", "self_attn.q_proj", "mlp.up_proj",
            "w1", "experts.1.w1", "lm_head", "layers.1.self_attn.v_proj", "model.layers.3.mlp.down_proj"]
REGEXES = [r".*\.(q|v)_proj", r"model\.layers\.\d*[13579]\..*", r".*layers\.1\d?\..*_proj", r".*(?<!gate)_proj",
           r"(?i).*Q_PROJ", r".*\.experts\.[0-1]\.w1", r"model\.layers\.(?P<l>\d+)\.mlp\.(up|down)_proj"]
KEYS = ["q_proj", "^model.layers.1.self_attn.q_proj", r"layers\.[2-4]\..*", "mlp.*", r"experts\.\d+\.w1", "o_proj",
        "^q_proj", "v_proj$", r"self_attn\.(k|v)_proj", "proj", "model.layers.10.*"]


def random_config(rng):
    config = {"peft_type": "LORA", "r": rng.choice([2, 4]), "lora_alpha": rng.choice([4, 8, 3.5]),
              "use_rslora": rng.random() < 0.3}
    if rng.random() < 0.35:
        config["target_modules"] = rng.choice(REGEXES)
    else:
        config["target_modules"] = rng.sample(SUFFIXES, rng.randint(1, 5))
        if rng.random() < 0.4:
            config["layers_to_transform"] = rng.choice([1, [0, 2], [1, 3, 10], []])
            if rng.random() < 0.5:
                config["layers_pattern"] = rng.choice(["layers", ["experts", "layers"], "h"])
    if rng.random() < 0.4:
        config["exclude_modules"] = rng.choice([rng.sample(SUFFIXES, 2), r".*\.1\..*", r"lm_head|.*o_proj"])
    if rng.random() < 0.2:
        config["modules_to_save"] = rng.choice([["lm_head"], ["up_proj"]])
    for field in ("rank_pattern", "alpha_pattern"):
        if rng.random() < 0.6:
            keys = rng.sample(KEYS, rng.randint(1, 4))
            config[field] = {k: rng.choice([1, 3, 6]) if field == "rank_pattern" else rng.choice([2, 5.5, 9])
                             for k in keys}
    return config


def expected_modules(config_dir):
    config = PeftConfig.from_pretrained(str(config_dir))
    out = {}
    for name in MODULE_NAMES:
        found = check_target_module_exists(config, name)
        if found and not isinstance(found, _ExcludedModule):
            out[name] = peft_rank_alpha_scaling(config, name)
    return out


def write_adapter(adapter_dir, config, modules):
    import numpy as np
    from safetensors.numpy import save_file

    adapter_dir.mkdir(parents=True, exist_ok=True)
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config))
    tensors = {}
    for name, rank in modules.items():
        tensors[f"{PREFIX}{name}.lora_A.weight"] = np.zeros((rank, 8), dtype=np.float32)
        tensors[f"{PREFIX}{name}.lora_B.weight"] = np.zeros((8, rank), dtype=np.float32)
    save_file(tensors, str(adapter_dir / "adapter_model.safetensors"), metadata={"format": "pt"})


@pytest.mark.parametrize("seed", range(40))
def test_random_configs_agree_with_peft(peftc_binary, tmp_path, seed):
    import random

    rng = random.Random(seed)
    config = random_config(rng)
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "adapter_config.json").write_text(json.dumps(config))
    expected = expected_modules(probe)
    if not expected:
        pytest.skip("this config targets none of the module names")
    adapter = tmp_path / "adapter"
    write_adapter(adapter, config, {name: r for name, (r, _, _) in expected.items()})
    report = inspect_ok(peftc_binary, adapter)
    reported = {m["module"]: m for m in report["modules"]}
    assert set(reported) == set(expected)
    for name, (r, alpha, scaling) in expected.items():
        assert (reported[name]["rank"], reported[name]["alpha"]) == (r, alpha), name
        assert reported[name]["scaling"] == pytest.approx(scaling, rel=1e-15), name

    # One more module that PEFT does not target: peftc refuses, naming it.
    untargeted = [n for n in MODULE_NAMES if n not in expected]
    if untargeted:
        extra = rng.choice(untargeted)
        bad = tmp_path / "bad"
        write_adapter(bad, config, {**{name: r for name, (r, _, _) in expected.items()}, extra: config["r"]})
        run = inspect(peftc_binary, bad)
        assert run.returncode == 1
        assert run.stderr.startswith("peftc: error: INVALID_CONFIG: ") and f'"{extra}"' in run.stderr
