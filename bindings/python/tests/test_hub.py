"""peft_c.hub_resolve and peft_c.hub_cache_dir on a hub cache laid out as huggingface_hub lays it out
(blobs named by sha256, snapshots/<commit>/<file> -> ../../blobs/<sha256>, refs/<name>), and ids
accepted where folders are."""

from __future__ import annotations

import hashlib
import os
import pathlib

import pytest

import peft_c
from peft_c_test_support import FIXTURES

MAIN = "0123" * 10
TAGGED = "4567" * 10


def lay_snapshot(cache: pathlib.Path, repo: str, commit: str, source: pathlib.Path, refs=("main",)) -> pathlib.Path:
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (root / "blobs").mkdir(exist_ok=True)
    for file in sorted(source.iterdir()):
        data = file.read_bytes()
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    for ref in refs:
        (root / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
        (root / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    model = FIXTURES / "models" / "llama"
    if not (model / "model.safetensors").exists():
        pytest.skip(f"fixture {model} is absent (run tests/fixtures/generate.py)")
    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    snapshots = {
        "model": lay_snapshot(hub, "org/tiny", MAIN, model),
        "lora": lay_snapshot(hub, "org/tiny-lora", MAIN, FIXTURES / "adapters" / "llama_lora"),
        "second": lay_snapshot(hub, "org/tiny-lora", TAGGED, FIXTURES / "adapters" / "llama_lora_second",
                               refs=("v1",)),
    }
    return hub, snapshots


def test_resolve(cache):
    hub, snapshots = cache
    assert peft_c.hub_cache_dir() == str(hub)
    assert peft_c.hub_resolve("org/tiny") == str(snapshots["model"])
    assert peft_c.hub_resolve("org/tiny@main") == str(snapshots["model"])
    assert peft_c.hub_resolve("org/tiny-lora@v1") == str(snapshots["second"])
    assert peft_c.hub_resolve(f"org/tiny-lora@{TAGGED}") == str(snapshots["second"])
    assert peft_c.hub_resolve("org/tiny-lora@4567") == str(snapshots["second"])
    path = FIXTURES / "models" / "llama"
    assert peft_c.hub_resolve(path) == str(path)  # an existing path, as it is


def test_errors(cache):
    hub, _ = cache
    with pytest.raises(peft_c.NotFoundError, match="models--org--absent") as caught:
        peft_c.hub_resolve("org/absent")
    assert str(hub) in str(caught.value) and "downloads nothing" in str(caught.value)
    with pytest.raises(peft_c.NotFoundError, match=r'refs/ names "main"'):
        peft_c.hub_resolve("org/tiny@v9")
    for text in ("../up", "a/b/c", "/no/such/folder", "org/name@"):
        with pytest.raises(peft_c.InvalidArgumentError):
            peft_c.hub_resolve(text)
    with pytest.raises(ValueError):
        peft_c.hub_resolve("org/ti\0ny")


def test_ids_where_folders_are_taken(cache, tmp_path):
    with peft_c.Checkpoint.open("org/tiny") as by_id, peft_c.Checkpoint.open(FIXTURES / "models" / "llama") as by_path:
        assert list(by_id) == list(by_path)
    adapter = peft_c.Adapter.open("org/tiny-lora@v1", base_dir="org/tiny")
    assert len(adapter) > 0
    peft_c.merge_checkpoint("org/tiny", tmp_path / "ids", ["org/tiny-lora", ("org/tiny-lora@v1", 0.5)])
    peft_c.merge_checkpoint(FIXTURES / "models" / "llama", tmp_path / "paths",
                            [FIXTURES / "adapters" / "llama_lora", (FIXTURES / "adapters" / "llama_lora_second", 0.5)])
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "ids" / name).read_bytes() == (tmp_path / "paths" / name).read_bytes()
