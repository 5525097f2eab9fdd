"""Adapter and Translator, judged by the real PEFT and transformers packages.

Every fixture adapter of tests/fixtures/adapters is opened with peft_c against its base model and loaded
with ``PeftModel.from_pretrained`` on the same base: the LoRA layers, their kind, rank, scaling and
weights must agree. Every tensor must equal the one in adapter_model.safetensors. Real published
adapters of the corpus open too (without a base).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import numpy as np
import pytest

import peft_c
from peft_c_test_support import FIXTURES, HEADER, REPO

torch = pytest.importorskip("torch")
from safetensors import safe_open  # noqa: E402

ADAPTERS = FIXTURES / "adapters"
MANIFEST = ADAPTERS / "MANIFEST.json"
CORPUS = pathlib.Path(os.environ.get("PEFT_CORPUS") or REPO.parent / "shared" / "corpus" / "real")


def manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.exists() else {}


def fixture_names():
    names = sorted(manifest())
    if not names:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"{MANIFEST} not generated"))]
    return names


def corpus_adapters():
    found = sorted(p.parent for p in CORPUS.rglob("adapter_config.json")) if CORPUS.is_dir() else []
    found = [p for p in found if (p / "adapter_model.safetensors").exists()]
    if not found:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"real corpus not found at {CORPUS}"))]
    return [pytest.param(p, id=str(p.relative_to(CORPUS))) for p in found]


def file_tensors(folder: pathlib.Path) -> dict:
    with safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def same_values(ours: np.ndarray, tensor) -> bool:
    expected = tensor.to(torch.float32).numpy()
    return ours.shape == expected.shape and np.array_equal(ours, expected, equal_nan=True)


def test_layer_kinds_mirror_the_header():
    import re

    defines = dict(re.findall(r"^#define\s+PEFT_LAYER_([A-Z0-9_]+)\s+(\d+)", HEADER.read_text(), re.M))
    assert {name: int(v) for name, v in defines.items()} == {n: v for v, n in peft_c.LAYER_KINDS}


# ---- fixtures against PEFT --------------------------------------------------------------------------

_reference_cache: dict = {}


def peft_reference(name: str):
    """(LoRA layers {module: (kind, r, scaling)}, {module: {role: tensor}}) of PEFT's loaded model."""
    if name in _reference_cache:
        return _reference_cache[name]  # a (layers, weights) pair, or the exception PEFT raised
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from peft.tuners.lora import LoraLayer

    entry = manifest()[name]
    base_dir = FIXTURES / entry["base"]
    architecture = json.loads((base_dir / "config.json").read_text())["architectures"][0]
    base = getattr(transformers, architecture).from_pretrained(base_dir)
    try:
        model = peft.PeftModel.from_pretrained(base, ADAPTERS / name)
    except Exception as exc:  # the reference itself cannot load it with the installed packages
        _reference_cache[name] = exc
        return exc
    layers, weights = {}, {}
    for path, module in model.named_modules():
        if not isinstance(module, LoraLayer) or "default" not in module.r:
            continue
        short = path.removeprefix("base_model.model.")
        base_layer = module.get_base_layer()
        # ParamWrapper: LoRA on a stacked expert parameter (target_parameters), factors as a Linear's per expert.
        kind = {"Linear": "LINEAR", "Embedding": "EMBEDDING", "Conv2d": "CONV2D",
                "ParamWrapper": "LINEAR"}.get(type(module).__name__)
        if type(base_layer).__name__ == "Conv1D":
            kind = "CONV1D"
        layers[short] = (kind, module.r["default"], module.scaling["default"])
        if kind == "EMBEDDING":
            weights[short] = {"lora_embedding_A": module.lora_embedding_A["default"],
                              "lora_embedding_B": module.lora_embedding_B["default"]}
        else:
            weights[short] = {"lora_A.weight": module.lora_A["default"].weight,
                              "lora_B.weight": module.lora_B["default"].weight}
    _reference_cache[name] = (layers, weights)
    return layers, weights


@pytest.mark.parametrize("name", fixture_names())
def test_fixture_adapter_matches_peft(name):
    entry = manifest()[name]
    folder, base_dir = ADAPTERS / name, FIXTURES / entry["base"]
    config = json.loads((folder / "adapter_config.json").read_text())
    with peft_c.Adapter.open(folder, base_dir=base_dir) as adapter:
        assert adapter.config == config
        assert adapter.r == config.get("r", 8) == entry["r"]
        assert adapter.lora_alpha == config.get("lora_alpha", 8)
        assert adapter.use_rslora == bool(config.get("use_rslora")) == entry["use_rslora"]
        assert adapter.use_dora == bool(config.get("use_dora")) == entry["use_dora"]
        assert adapter.task_type == config.get("task_type")
        assert adapter.peft_type == config["peft_type"]
        assert adapter.base_model_name_or_path == config.get("base_model_name_or_path")
        adapter.validate(base_dir)

        tensors = file_tensors(folder)
        keys = [t.key for m in adapter for t in m.tensors]
        assert sorted(keys) == sorted(tensors)  # every tensor belongs to exactly one module
        for module in adapter:
            assert adapter.module(module.name) == module
            for t in module.tensors:
                assert t.key.endswith(t.role)
                assert t.dtype == {torch.float32: "F32", torch.bfloat16: "BF16",
                                   torch.float16: "F16"}[tensors[t.key].dtype]
                assert t.shape == tuple(tensors[t.key].shape)
                assert same_values(adapter.read(module, t.role), tensors[t.key]), t.key
                assert adapter.read(module, t.index, None).tobytes() == \
                    tensors[t.key].contiguous().view(torch.uint8).numpy().tobytes()

        reference = peft_reference(name)
        if isinstance(reference, Exception):
            pytest.skip(f"PEFT {pytest.importorskip('peft').__version__} cannot load this adapter on "
                        f"the installed transformers: {type(reference).__name__}: {reference}")
        layers, weights = reference
        ours = {m.name: (m.kind.name, m.rank, m.scaling) for m in adapter
                if m.kind.name in ("LINEAR", "CONV1D", "EMBEDDING", "CONV2D")}
        assert set(ours) == set(layers)
        for module_name, (kind, rank, scaling) in layers.items():
            assert ours[module_name][:2] == (kind, rank), module_name
            assert ours[module_name][2] == pytest.approx(scaling, rel=1e-12), module_name
            for role, weight in weights[module_name].items():
                assert same_values(adapter.read(module_name, role), weight.detach()), (module_name, role)


@pytest.mark.parametrize("name", fixture_names())
def test_fixture_adapter_opens_without_base(name):
    folder = ADAPTERS / name
    config = json.loads((folder / "adapter_config.json").read_text())
    with peft_c.Adapter.open(folder) as adapter:
        assert sorted(t.key for m in adapter for t in m.tensors) == sorted(file_tensors(folder))


def test_validate_against_the_wrong_base():
    if not MANIFEST.exists():
        pytest.skip("fixtures not generated")
    with peft_c.Adapter.open(ADAPTERS / "llama_lora") as adapter:
        with pytest.raises((peft_c.UnresolvedKeyError, peft_c.ShapeMismatchError)) as info:
            adapter.validate(FIXTURES / "models" / "gpt2")
        assert "q_proj" in info.value.message
        with pytest.raises(peft_c.PeftError):
            adapter.validate(FIXTURES / "no_such_model")


def test_trainable_tokens_and_embedding_modules():
    if not MANIFEST.exists():
        pytest.skip("fixtures not generated")
    config = json.loads((ADAPTERS / "llama_trainable_tokens" / "adapter_config.json").read_text())
    with peft_c.Adapter.open(ADAPTERS / "llama_trainable_tokens",
                             base_dir=FIXTURES / "models" / "llama") as adapter:
        tokens = [m for m in adapter if m.kind == peft_c.LayerKind.TRAINABLE_TOKENS]
        assert len(tokens) == 1
        expected = config["trainable_token_indices"]
        if isinstance(expected, dict):
            expected = next(iter(expected.values()))
        assert list(tokens[0].token_indices) == list(expected)
        assert all(m.token_indices is None for m in adapter if m is not tokens[0])


def test_lenient_loading_ignores_what_peft_ignores_and_lists_it(tmp_path):
    """llama_lora without "down_proj" in target_modules: strict opening refuses it; lenient opening
    drops the four down_proj tensors (PEFT's unexpected keys), one warning each; so does a lenient
    registration."""
    if not MANIFEST.exists():
        pytest.skip("fixtures not generated")
    src = ADAPTERS / "llama_lora"
    shutil.copytree(src, tmp_path / "adapter")
    config = (src / "adapter_config.json").read_text()
    (tmp_path / "adapter" / "adapter_config.json").write_text(config.replace('"down_proj",', ""))
    with pytest.raises(peft_c.InvalidConfigError):
        peft_c.Adapter.open(tmp_path / "adapter")
    with peft_c.Adapter.open(src) as strict:
        assert strict.warnings == []
    with peft_c.Adapter.open(tmp_path / "adapter", base_dir=FIXTURES / "models" / "llama", lenient=True) as adapter:
        assert len(adapter.warnings) == 4, adapter.warnings
        for warning in adapter.warnings:
            assert warning.startswith('unexpected key "base_model.model.model.layers.'), warning
            assert "mlp.down_proj.lora_" in warning, warning
        assert len(adapter) == 12
        warnings = adapter.warnings
    with peft_c.Registry("F32", 1 << 20) as registry:
        with pytest.raises(peft_c.InvalidConfigError):
            registry.register("strict", tmp_path / "adapter")
        registry.register("lenient", tmp_path / "adapter", base_dir=FIXTURES / "models" / "llama", lenient=True)
        registry.register("plain", src)
        assert registry.warnings("lenient") == warnings
        assert registry.warnings("plain") == []
        with pytest.raises(peft_c.NotFoundError):
            registry.warnings("strict")


# ---- the real corpus ----------------------------------------------------------------------------------

@pytest.mark.parametrize("folder", corpus_adapters())
def test_corpus_adapter_opens_and_reads_its_file(folder):
    config = json.loads((folder / "adapter_config.json").read_text())
    with peft_c.Adapter.open(folder) as adapter:
        assert adapter.config == config
        assert adapter.r == config.get("r", 8)
        tensors = file_tensors(folder)
        assert sorted(adapter.state_dict()) == sorted(tensors)
        for key, value in adapter.state_dict().items():
            assert same_values(value, tensors[key]), key
        for module in adapter:
            if module.kind.name in ("LINEAR", "CONV1D", "CONV2D"):
                a = module.tensor("lora_A.weight")
                assert module.rank == a.shape[0]
                expected = module.alpha / (module.rank ** 0.5 if adapter.use_rslora else module.rank)
                assert module.scaling == pytest.approx(expected, rel=1e-12)
        if adapter.family is not None:
            translator = adapter.translator()
            keys = [t.key for m in adapter for t in m.tensors]
            native = translator.to_native_many(keys)
            assert translator.to_hf_many(native, with_peft_prefix=True) == keys


# ---- translators -----------------------------------------------------------------------------------------

def test_builtin_families_are_the_tables_in_the_tree():
    tables = sorted(p.stem for p in (REPO / "data" / "arch").glob("*.json"))
    assert peft_c.Translator.builtin_families() == tables


@pytest.mark.parametrize("family", sorted(p.stem for p in (REPO / "data" / "arch").glob("*.json")))
def test_builtin_file_and_json_translators_agree(family):
    table_path = REPO / "data" / "arch" / f"{family}.json"
    builtin = peft_c.Translator.builtin(family)
    from_file = peft_c.Translator.from_file(table_path)
    from_json = peft_c.Translator.from_json(json.loads(table_path.read_text()))
    assert builtin.family == from_file.family == from_json.family == family
    keys = [a.key for name, entry in manifest().items()
            if (FIXTURES / entry["base"]).name.startswith(family) for a in _keys_of(name)]
    for key in keys:
        native = builtin.to_native(key)
        assert from_file.to_native(key) == from_json.to_native(key) == native
        assert builtin.to_hf(native, with_peft_prefix=True) == key
        assert builtin.to_hf(native) == key.removeprefix("base_model.model.")


def _keys_of(name):
    # Translators map the keys of a host's layers; LoRA on stacked expert parameters (target_parameters)
    # adapts no layer a host names, and serving refuses it, so those adapters have no keys to translate.
    if json.loads((ADAPTERS / name / "adapter_config.json").read_text()).get("target_parameters"):
        return []
    try:
        with peft_c.Adapter.open(ADAPTERS / name) as adapter:
            return [t for m in adapter for t in m.tensors]
    except peft_c.PeftError:
        return []


def test_translator_errors():
    llama = peft_c.Translator.builtin("llama")
    with pytest.raises(peft_c.UnresolvedKeyError) as info:
        llama.to_native("base_model.model.no.such.module.lora_A.weight")
    assert "no.such.module" in info.value.message and isinstance(info.value, KeyError)
    good = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"
    with pytest.raises(peft_c.UnresolvedKeyError) as info:
        llama.to_native_many([good, "bad.one", "bad.two"])
    assert "bad.one" in info.value.message and "bad.two" in info.value.message
    assert llama.to_native_many([]) == []
    with pytest.raises(peft_c.UnresolvedKeyError):
        llama.to_hf("not/a/native/name")
    with pytest.raises(peft_c.NotFoundError):
        peft_c.Translator.builtin("no_such_family")
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.Translator.builtin("../llama")
    with pytest.raises(peft_c.InvalidConfigError):
        peft_c.Translator.from_json("{")
    with pytest.raises(peft_c.IoError):
        peft_c.Translator.from_file(REPO / "data" / "arch" / "missing.json")
    with pytest.raises(peft_c.NotFoundError):
        peft_c.Translator.detect(model_name="completely-unknown-model")
    with pytest.raises(ValueError):
        llama.to_native("a\0b")
    llama.close()
    with pytest.raises(ValueError):
        llama.to_native(good)


def test_detect():
    assert peft_c.Translator.detect(model_name="meta-llama/Llama-3.2-1B").family == "llama"
    if MANIFEST.exists():
        assert peft_c.Translator.detect(FIXTURES / "models" / "gpt2").family == "gpt2"


def test_translator_from_many_threads():
    from concurrent.futures import ThreadPoolExecutor

    llama = peft_c.Translator.builtin("llama")
    keys = [f"base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight" for i in range(50)]
    expected = llama.to_native_many(keys)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda _: [llama.to_native(k) for k in keys], range(16)))
    assert all(r == expected for r in results)


# ---- adapter errors ------------------------------------------------------------------------------------

@pytest.fixture
def llama_copy(tmp_path):
    if not MANIFEST.exists():
        pytest.skip("fixtures not generated")
    folder = tmp_path / "adapter"
    shutil.copytree(ADAPTERS / "llama_lora", folder)
    return folder


def test_missing_folder(tmp_path):
    with pytest.raises(peft_c.NotFoundError):
        peft_c.Adapter.open(tmp_path / "nothing")


def test_pickle_weights_are_unsupported(llama_copy):
    (llama_copy / "adapter_model.safetensors").rename(llama_copy / "adapter_model.bin")
    with pytest.raises(peft_c.UnsupportedError):
        peft_c.Adapter.open(llama_copy)


def test_invalid_config_json(llama_copy):
    (llama_copy / "adapter_config.json").write_text("{ not json")
    with pytest.raises(peft_c.InvalidConfigError):
        peft_c.Adapter.open(llama_copy)


def test_non_lora_peft_type(llama_copy):
    config = json.loads((llama_copy / "adapter_config.json").read_text())
    config["peft_type"] = "PREFIX_TUNING"
    (llama_copy / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(peft_c.UnsupportedError, match="PREFIX_TUNING"):
        peft_c.Adapter.open(llama_copy)


def test_lora_tensors_of_an_untargeted_module(llama_copy):
    weights = llama_copy / "adapter_model.safetensors"
    with peft_c.Checkpoint.open(weights) as ckpt:
        tensors = {name: ckpt.read(name, None) for name in ckpt}
    stray = "base_model.model.model.layers.0.input_layernorm"
    tensors[stray + ".lora_A.weight"] = np.zeros((4, 16), np.float32)
    tensors[stray + ".lora_B.weight"] = np.zeros((16, 4), np.float32)
    peft_c.save_file(tensors, weights)
    with pytest.raises(peft_c.InvalidConfigError, match="input_layernorm"):
        peft_c.Adapter.open(llama_copy)


def test_keys_without_the_peft_prefix_are_read_as_base_modules(llama_copy):
    weights = llama_copy / "adapter_model.safetensors"
    with peft_c.Checkpoint.open(weights) as ckpt:
        tensors = {name: ckpt.read(name, None) for name in ckpt}
    tensors["classifier.weight"] = np.ones((2, 2), np.float32)
    peft_c.save_file(tensors, weights)
    with peft_c.Adapter.open(llama_copy) as adapter:
        module = adapter.module("classifier")
        assert module.kind == peft_c.LayerKind.FULL and module.tensor("weight").key == "classifier.weight"
        assert any("base_model.model." in note for note in adapter.notes)


def test_lora_a_without_lora_b(llama_copy):
    weights = llama_copy / "adapter_model.safetensors"
    with peft_c.Checkpoint.open(weights) as ckpt:
        names = list(ckpt)
        dropped = next(n for n in names if n.endswith("lora_B.weight"))
        tensors = {name: ckpt.read(name, None) for name in names if name != dropped}
    peft_c.save_file(tensors, weights)
    with pytest.raises(peft_c.PeftError) as info:
        peft_c.Adapter.open(llama_copy)
    assert info.value.code in (peft_c.ErrorCode.INVALID_CHECKPOINT, peft_c.ErrorCode.INVALID_CONFIG)
    assert dropped.removesuffix(".lora_B.weight").removeprefix("base_model.model.") in info.value.message


def test_damaged_weights_give_format_errors(llama_copy):
    weights = llama_copy / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1])
    with pytest.raises(peft_c.MetadataIncompleteBufferError):
        peft_c.Adapter.open(llama_copy)


def test_adapter_lifetime(llama_copy):
    adapter = peft_c.Adapter.open(llama_copy)
    translator = adapter.translator()
    module = adapter.modules[0]
    adapter.close()
    adapter.close()
    with pytest.raises(ValueError):
        adapter.read(module, 0)
    # the translator keeps working: a child keeps its parent's table alive
    assert translator.to_native(module.tensors[0].key)
    with pytest.raises(KeyError):
        module.tensor("no_such_role")
