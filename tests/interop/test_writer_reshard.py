"""Resharded checkpoints written by `peftc convert --max-shard-size` load in transformers and
safetensors with every tensor equal, and match huggingface_hub's own sharded save byte for byte.

Models: the tiny ones under tests/fixtures/models (made by transformers from a config, no download);
when that folder is absent a tiny Llama is built here from a config.

Environment: PEFTC = path of peftc.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess

import pytest
import torch
import safetensors.torch as st_torch
from safetensors import safe_open

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = pathlib.Path(os.environ.get("PEFT_TEST_DATA") or REPO / "tests" / "fixtures")
MODELS = FIXTURES / "models"


def _peftc() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("PEFTC") or REPO / "build" / "peftc")
    if not path.exists():
        pytest.fail(f"peftc not found at {path}: build it or set PEFTC", pytrace=False)
    return path


def _model_dirs():
    dirs = sorted(p.parent for p in MODELS.glob("*/model.safetensors")) if MODELS.is_dir() else []
    return [pytest.param(d, id=d.name) for d in dirs] or [pytest.param(None, id="built-here")]


@pytest.fixture(params=_model_dirs())
def model_dir(request, tmp_path_factory):
    if request.param is not None:
        return request.param
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("tiny_llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    return folder


def run_convert(*args):
    result = subprocess.run([str(_peftc()), "convert", *map(str, args)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result


def file_order(path: pathlib.Path):
    """Tensor names in data order (the order peftc declares them in)."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return sorted(header, key=lambda k: tuple(header[k]["data_offsets"]))


def load_folder(folder: pathlib.Path):
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}, shard.name
        part = st_torch.load_file(str(shard))
        assert not set(part) & set(tensors), "a tensor is in two shards"
        tensors.update(part)
    return tensors


def shard_size_for(source: dict) -> int:
    """A limit that gives several shards and puts the largest tensor in a shard of its own."""
    sizes = sorted(t.numel() * t.element_size() for t in source.values())
    return max(sizes[len(sizes) // 2] * 2, 1)


def test_reshard_loads_in_transformers_and_matches_huggingface_hub(model_dir, tmp_path):
    from huggingface_hub import save_torch_state_dict
    import transformers

    source_file = model_dir / "model.safetensors"
    source = st_torch.load_file(str(source_file))
    limit = shard_size_for(source)
    out = tmp_path / "resharded"
    run_convert(source_file, out, "--max-shard-size", limit)
    shards = sorted(p.name for p in out.glob("model-*.safetensors"))
    assert len(shards) >= 2, shards
    assert all(p.name in shards or p.name == "model.safetensors.index.json" for p in out.iterdir())

    # safetensors: every tensor back, bit for bit.
    loaded = load_folder(out)
    assert set(loaded) == set(source)
    for name, tensor in source.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name].view(-1).view(torch.uint8),
                                                                   tensor.view(-1).view(torch.uint8)), name

    # The index, exactly as transformers v4 writes it.
    index_text = (out / "model.safetensors.index.json").read_text()
    index = json.loads(index_text)
    total = sum(t.numel() * t.element_size() for t in source.values())
    assert index["metadata"] == {"total_size": total}
    assert index_text == json.dumps(index, indent=2, sort_keys=True) + "\n"

    # huggingface_hub's save of the same tensors in the same order: identical shards, same index.
    hub = tmp_path / "hub"
    hub.mkdir()
    ordered = {name: source[name] for name in file_order(source_file)}
    save_torch_state_dict(ordered, hub, max_shard_size=limit)
    assert sorted(p.name for p in hub.glob("*.safetensors")) == shards
    for name in shards:
        assert (hub / name).read_bytes() == (out / name).read_bytes(), name
    hub_index = json.loads((hub / "model.safetensors.index.json").read_text())
    assert hub_index["weight_map"] == index["weight_map"]
    assert hub_index["metadata"]["total_size"] == total

    # transformers: the model loads from the resharded folder with no missing or unexpected key.
    for extra in ("config.json", "generation_config.json"):
        if (model_dir / extra).exists():
            shutil.copy(model_dir / extra, out / extra)
    config = json.loads((model_dir / "config.json").read_text())
    model_class = getattr(transformers, config["architectures"][0])
    reference = model_class.from_pretrained(model_dir)
    model, info = model_class.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    expected_state = reference.state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, expected_state[name]), name


def test_reshard_with_dtype_and_back_to_one_file(model_dir, tmp_path):
    import transformers

    source_file = model_dir / "model.safetensors"
    source = st_torch.load_file(str(source_file))
    out = tmp_path / "bf16"
    run_convert(source_file, out, "--dtype", "bf16", "--max-shard-size", shard_size_for(source) // 2)
    loaded = load_folder(out)
    for name, tensor in source.items():
        expected = tensor.to(torch.bfloat16) if tensor.is_floating_point() and tensor.element_size() >= 2 else tensor
        assert loaded[name].dtype == expected.dtype, name
        assert torch.equal(loaded[name].view(-1).view(torch.uint8), expected.view(-1).view(torch.uint8)), name
    shutil.copy(model_dir / "config.json", out / "config.json")
    config = json.loads((model_dir / "config.json").read_text())
    model_class = getattr(transformers, config["architectures"][0])
    model, info = model_class.from_pretrained(out, dtype=torch.bfloat16, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info

    # Back to one file in place (no limit): the stale shards and index go, the tensors stay.
    run_convert(out, out, "--max-shard-size", "1GB")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    again = st_torch.load_file(str(out / "model.safetensors"))
    assert set(again) == set(loaded)
    for name in loaded:
        assert torch.equal(again[name].view(-1).view(torch.uint8), loaded[name].view(-1).view(torch.uint8)), name


def test_transformers_sharded_save_is_reproduced(tmp_path):
    """save_pretrained(max_shard_size=...) → peftc convert (no options) → identical shards and index."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=3,
                         num_attention_heads=2, num_key_value_heads=1)
    torch.manual_seed(1)
    saved = tmp_path / "saved"
    LlamaForCausalLM(config).save_pretrained(saved, max_shard_size="6KB")
    files = sorted(p.name for p in saved.glob("model*"))
    assert "model.safetensors.index.json" in files and len(files) >= 3
    out = tmp_path / "copy"
    run_convert(saved, out)
    assert sorted(p.name for p in out.iterdir()) == files
    for name in files:
        assert (out / name).read_bytes() == (saved / name).read_bytes(), name


def test_rewrite_in_place_uses_tokenized_shard_names_that_transformers_loads(model_dir, tmp_path):
    """A second sharded write into the same folder cannot reuse the shard names the live index lists
    (a kill would mix old and new shards), so its shards carry a per-write token; the index names
    them, and transformers and safetensors load them like any others."""
    import transformers

    source_file = model_dir / "model.safetensors"
    source = st_torch.load_file(str(source_file))
    limit = shard_size_for(source)
    out = tmp_path / "twice"
    run_convert(source_file, out, "--max-shard-size", limit)
    first = sorted(p.name for p in out.glob("*.safetensors"))
    run_convert(source_file, out, "--max-shard-size", limit)
    second = sorted(p.name for p in out.glob("*.safetensors"))
    assert len(second) == len(first) and not set(first) & set(second), (first, second)
    assert all(".peft-" in name for name in second), second
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == second
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    loaded = load_folder(out)
    assert set(loaded) == set(source)
    shutil.copy(model_dir / "config.json", out / "config.json")
    config = json.loads((model_dir / "config.json").read_text())
    model_class = getattr(transformers, config["architectures"][0])
    model, info = model_class.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    reference = model_class.from_pretrained(model_dir).state_dict()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, reference[name]), name
