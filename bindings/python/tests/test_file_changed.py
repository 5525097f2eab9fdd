"""Files that change under open handles: a safetensors file truncated or rewritten in place after it
was opened raises ``peft_c.IoError`` from every call that reads it (``Checkpoint.read`` and ``view``,
``Adapter.read``, ``Registry.acquire``), and a merge whose base or adapter is truncated by its progress
callback raises ``IoError`` and leaves no output; a file replaced by rename keeps serving the bytes
that were opened. Before the library read files with pread, these calls died of SIGBUS (which
would end this test run)."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np
import pytest

import peft_c
from peft_c_test_support import FIXTURES

ELEMENTS = 1 << 14  # 64 KiB per tensor: many pages, so a truncation removes whole mapped pages


def age(path) -> None:
    """Moves the modification time a day back, as for any file written before it is opened; a change
    made afterwards then moves it, whatever the file system's timestamp granularity."""
    past = time.time() - 86400
    os.utime(path, (past, past))


def write_pair(path, offset: float) -> None:
    from safetensors.numpy import save_file

    values = np.arange(ELEMENTS, dtype=np.float32) + offset
    save_file({"a": values, "b": -values}, str(path))
    age(path)


def copy_adapter(src, dst):
    shutil.copytree(src, dst)
    age(dst / "adapter_model.safetensors")
    return dst


@pytest.fixture(params=["mmap", "pread"])
def use_pread(request) -> bool:
    return request.param == "pread"


def test_truncated_between_calls(tmp_path, use_pread):
    path = tmp_path / "pair.safetensors"
    write_pair(path, 0.0)
    with peft_c.Checkpoint.open(path, use_pread=use_pread) as ckpt:
        np.testing.assert_array_equal(ckpt.read("b"), -np.arange(ELEMENTS, dtype=np.float32))
        os.truncate(path, os.path.getsize(path) // 2)
        for name in ("a", "b"):
            with pytest.raises(peft_c.IoError, match="truncated"):
                ckpt.read(name)
            with pytest.raises(peft_c.IoError, match="pair.safetensors"):
                ckpt.read(name, "BF16")
            with pytest.raises(peft_c.IoError, match="truncated"):
                ckpt.view(name)


def test_rewritten_in_place(tmp_path, use_pread):
    path = tmp_path / "pair.safetensors"
    write_pair(path, 0.0)
    with peft_c.Checkpoint.open(path, use_pread=use_pread) as ckpt:
        size, inode = os.path.getsize(path), os.stat(path).st_ino
        # Other values of the same size written into the same file (save_file itself makes a new
        # file, which is a replacement, not an overwrite).
        write_pair(tmp_path / "other.safetensors", 100.0)
        with open(path, "r+b") as f:
            f.write((tmp_path / "other.safetensors").read_bytes())
        assert os.path.getsize(path) == size and os.stat(path).st_ino == inode
        for name in ("a", "b"):
            with pytest.raises(peft_c.IoError, match="changed since it was opened"):
                ckpt.read(name)
            with pytest.raises(peft_c.IoError, match="changed since it was opened"):
                ckpt.view(name)


def test_replaced_by_rename_keeps_the_opened_file(tmp_path, use_pread):
    path = tmp_path / "pair.safetensors"
    write_pair(path, 0.0)
    with peft_c.Checkpoint.open(path, use_pread=use_pread) as ckpt:
        write_pair(tmp_path / "next.safetensors", 100.0)
        os.replace(tmp_path / "next.safetensors", path)
        np.testing.assert_array_equal(ckpt.read("a"), np.arange(ELEMENTS, dtype=np.float32))
        assert ckpt.view("b")[7] == -7.0
        with peft_c.Checkpoint.open(path) as fresh:
            assert fresh.read("a")[0] == 100.0


def test_pread_views_are_copies(tmp_path):
    path = tmp_path / "pair.safetensors"
    write_pair(path, 0.0)
    with peft_c.Checkpoint.open(path, use_pread=True) as ckpt:
        view = ckpt.view("b")
        os.truncate(path, 0)
        assert view[-1] == -(ELEMENTS - 1)
        with pytest.raises(peft_c.IoError):
            ckpt.view("a")


def test_adapter_truncated(tmp_path):
    folder = copy_adapter(FIXTURES / "adapters" / "llama_lora", tmp_path / "adapter")
    with peft_c.Adapter.open(folder) as adapter:
        module = adapter.modules[0]
        adapter.read(module, 0)
        weights = folder / "adapter_model.safetensors"
        os.truncate(weights, os.path.getsize(weights) // 2)
        with pytest.raises(peft_c.IoError, match="adapter_model.safetensors"):
            adapter.read(module, 0)


def test_registry_acquire_after_the_file_changed(tmp_path):
    adapters = FIXTURES / "adapters"
    with peft_c.Registry("F32", 1 << 20) as registry:
        truncated = copy_adapter(adapters / "llama_lora", tmp_path / "truncated")
        registry.register("truncated", truncated)
        os.truncate(truncated / "adapter_model.safetensors", 4096)
        overwritten = copy_adapter(adapters / "llama_lora", tmp_path / "overwritten")
        registry.register("overwritten", overwritten)
        # cp over a registered adapter: the same file, rewritten.
        shutil.copyfile(adapters / "llama_lora_second" / "adapter_model.safetensors",
                        overwritten / "adapter_model.safetensors")

        with pytest.raises(peft_c.IoError, match="truncated"):
            registry.acquire("truncated")
        with pytest.raises(peft_c.IoError, match="changed since it was opened"):
            registry.acquire("overwritten")
        assert registry.stats().loaded_bytes == 0
        # Registered again, the new file is served.
        registry.register("overwritten", overwritten)
        with registry.acquire("overwritten") as lease:
            assert lease.has_module("model.layers.0.self_attn.q_proj")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("victim", ["base", "adapter"])
def test_merge_input_truncated_while_merging(tmp_path, threads, victim):
    base = tmp_path / "base"
    shutil.copytree(FIXTURES / "models" / "llama", base)
    adapter = copy_adapter(FIXTURES / "adapters" / "llama_lora", tmp_path / "adapter")
    path = base / "model.safetensors" if victim == "base" else adapter / "adapter_model.safetensors"
    age(path)
    truncated = []

    def progress(done, total):
        if done > 0 and not truncated:
            os.truncate(path, 4096)
            truncated.append(done)

    out = tmp_path / "merged"
    with pytest.raises(peft_c.IoError, match=path.name):
        peft_c.merge_checkpoint(base, out, [adapter], threads=threads, progress=progress)
    assert truncated, "the callback never ran after the first tensor"
    assert not out.exists()
