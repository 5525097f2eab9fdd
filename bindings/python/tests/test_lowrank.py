"""LoRA extraction and conversion to plain LoRA through the binding (``extract_lora``, ``convert_to_lora``,
``convert_initial``): the files equal those ``peftc adapter extract`` / ``adapter convert`` write from the
same inputs, the reports hold each module's rank and error, and errors carry the library's codes.
Numerics against numpy and PEFT are in tests/interop/test_lora_extract.py."""

from __future__ import annotations

import os
import re
import struct
import subprocess

import pytest

import peft_c
from peft_c_test_support import FIXTURES, HEADER, REPO

ADAPTERS = FIXTURES / "adapters"
BASE = FIXTURES / "models" / "llama"
FILES = ("adapter_model.safetensors", "adapter_config.json")


def peftc(*args):
    binary = os.environ.get("PEFTC") or str(REPO / "build" / "peftc")
    if not os.path.exists(binary):
        pytest.skip(f"no peftc at {binary} to compare with (set PEFTC)")
    result = subprocess.run([binary, *map(str, args)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def same_files(a, b):
    for name in FILES:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """The base with llama_lora merged: a "fine-tuned" model whose q_proj and v_proj changed."""
    out = tmp_path_factory.mktemp("tuned") / "tuned"
    peft_c.merge_checkpoint(BASE, out, [ADAPTERS / "llama_lora"])
    return out


def test_svd_constants_mirror_the_header():
    found = dict(re.findall(r"^#define\s+PEFT_SVD_([A-Z]+)\s+(\d+)", HEADER.read_text(), re.M))
    assert {k.lower(): int(v) for k, v in found.items()} == peft_c.lowrank.SVD_METHODS


def test_extract(tmp_path, tuned):
    report = peft_c.extract_lora(BASE, tuned, tmp_path / "out", rank=2, threads=2, modules=["q_proj", "v_proj"])
    assert report and all(m.rank == 2 and 0 <= m.error < 1 for m in report)
    assert all(m.name.endswith((".q_proj", ".v_proj")) for m in report)
    peftc("adapter", "extract", "--base", BASE, "--tuned", tuned, "--out", tmp_path / "ref", "--rank", 2,
          "--threads", 2, "--modules", "q_proj,v_proj")
    same_files(tmp_path / "out", tmp_path / "ref")

    energy = peft_c.extract_lora(BASE, tuned, tmp_path / "energy", energy=0.9, dtype="BF16", svd="randomized")
    assert energy and all(m.rank >= 1 for m in energy)
    peftc("adapter", "extract", "--base", BASE, "--tuned", tuned, "--out", tmp_path / "energy-ref", "--energy", 0.9,
          "--dtype", "bf16", "--svd", "randomized")
    same_files(tmp_path / "energy", tmp_path / "energy-ref")


def test_convert(tmp_path):
    with peft_c.Adapter.open(ADAPTERS / "llama_lora") as lora:
        report = peft_c.convert_to_lora(lora, tmp_path / "r2", rank=2)
        assert len(report) == len(lora.modules) and all(m.rank == 2 for m in report)
    peftc("adapter", "convert", ADAPTERS / "llama_lora", tmp_path / "r2-ref", "--to", "lora", "--rank", 2)
    same_files(tmp_path / "r2", tmp_path / "r2-ref")

    peft_c.convert_initial(ADAPTERS / "llama_lora", ADAPTERS / "llama_lora", tmp_path / "doubled")
    peftc("adapter", "convert", ADAPTERS / "llama_lora", tmp_path / "doubled-ref", "--to", "lora", "--initial",
          ADAPTERS / "llama_lora")
    same_files(tmp_path / "doubled", tmp_path / "doubled-ref")


def write_ia3_adapter(folder):
    """An IA3 adapter on the llama fixture's layer-0 k_proj (8 x 16), ia3_l = 1 + i / 16 (as
    tests/capi/test_lowrank.c writes it): multiplicative, so it converts against a base only."""
    folder.mkdir()
    (folder / "adapter_config.json").write_text(
        '{"peft_type": "IA3", "target_modules": ["k_proj"], "feedforward_modules": [], "task_type": "CAUSAL_LM"}')
    header = (b'{"base_model.model.model.layers.0.self_attn.k_proj.ia3_l": '
              b'{"dtype": "F32", "shape": [8, 1], "data_offsets": [0, 32]}}')
    values = struct.pack("<8f", *(1.0 + i / 16.0 for i in range(8)))
    (folder / "adapter_model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + values)
    return folder


def test_convert_against_base(tmp_path):
    ia3 = write_ia3_adapter(tmp_path / "ia3")
    with peft_c.Adapter.open(ia3) as adapter:
        with pytest.raises(peft_c.UnsupportedError) as info:
            peft_c.convert_to_lora(adapter, tmp_path / "nobase", rank=2)
        assert "IA3" in str(info.value) and "base" in str(info.value)
        report = peft_c.convert_to_lora(adapter, tmp_path / "r2", rank=2, base=BASE)
        assert [(m.name, m.rank) for m in report] == [("model.layers.0.self_attn.k_proj", 2)]
        assert 0 < report[0].error < 1  # dW = diag(l - 1) W is full rank: rank 2 loses some
        with pytest.raises(peft_c.NotFoundError):  # gpt2 has no k_proj
            peft_c.convert_to_lora(adapter, tmp_path / "gpt2", rank=2, base=FIXTURES / "models" / "gpt2")
        with pytest.raises(ValueError):
            peft_c.convert_to_lora(adapter, tmp_path / "nul", rank=2, base="a\0b")
    peftc("adapter", "convert", ia3, tmp_path / "r2-ref", "--to", "lora", "--rank", 2, "--base", BASE)
    same_files(tmp_path / "r2", tmp_path / "r2-ref")
    with peft_c.Adapter.open(tmp_path / "r2") as converted:
        assert len(converted.modules) == 1


def test_errors(tmp_path, tuned):
    with peft_c.Adapter.open(ADAPTERS / "llama_lora") as lora:
        with pytest.raises(peft_c.InvalidArgumentError) as info:
            peft_c.convert_to_lora(lora, tmp_path / "big", rank=100000)
        assert info.value.code == peft_c.ErrorCode.INVALID_ARGUMENT
        with pytest.raises(ValueError):
            peft_c.convert_to_lora(lora, tmp_path / "none")  # neither rank nor energy
        with pytest.raises(ValueError):
            peft_c.convert_to_lora(lora, tmp_path / "both", rank=2, energy=0.5)
        with pytest.raises(ValueError):
            peft_c.convert_to_lora(lora, tmp_path / "svd", rank=2, svd="fast")
    with peft_c.Adapter.open(ADAPTERS / "llama_dora") as dora, pytest.raises(peft_c.UnsupportedError):
        peft_c.convert_to_lora(dora, tmp_path / "dora", rank=2)
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.extract_lora(BASE, BASE, tmp_path / "same", rank=2)  # no weight changed
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.extract_lora(BASE, tuned, tmp_path / "x", energy=1.5)
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.extract_lora(BASE, tuned, tmp_path / "x", rank=2, modules=[""])
    with pytest.raises(TypeError):
        peft_c.extract_lora(BASE, tuned, tmp_path / "x", rank=2, modules="q_proj")
    with pytest.raises(peft_c.UnsupportedError):
        peft_c.convert_initial(ADAPTERS / "llama_lora", ADAPTERS / "llama_dora", tmp_path / "mixed")
    with pytest.raises(peft_c.IoError):
        peft_c.convert_initial(ADAPTERS / "llama_lora", tmp_path, tmp_path / "z")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("method,settings,cli", [
    ("linear", {}, []),
    ("ties", {"density": 0.5, "rank": 4}, ["--density", "0.5", "--rank", "4"]),
    ("dare_ties", {"density": 0.4, "seed": 9, "majority_sign_method": "frequency", "energy": 0.95},
     ["--density", "0.4", "--seed", "9", "--majority-sign", "frequency", "--energy", "0.95"]),
])
def test_combine_deltas_writes_what_peftc_writes(method, settings, cli, tmp_path):
    names, weights = ["llama_lora", "llama_rank_alpha_pattern"], [0.7, -1.3]
    adapters = [peft_c.Adapter.open(ADAPTERS / n) for n in names]
    report = peft_c.combine_deltas(adapters, weights, tmp_path / "ours", method=method, **settings)
    args = ["adapter", "combine", "--deltas", "--method", method, "--out", tmp_path / "cli", *cli]
    for name, weight in zip(names, weights):
        args += ["--adapter", f"{ADAPTERS / name}:{weight!r}"]
    peftc(*args)
    same_files(tmp_path / "ours", tmp_path / "cli")
    assert report and all(isinstance(m, peft_c.LowRankModule) for m in report)
    if method == "linear":  # exact: the ranks add up, nothing is lost
        assert all(m.error == 0 for m in report)
        q0 = next(m for m in report if m.name == "model.layers.0.self_attn.q_proj")
        assert q0.rank == 4 + 8  # llama_lora's 4 and the rank_pattern's q_proj 8
    else:
        assert any(m.error > 0 for m in report)


def test_combine_deltas_errors(tmp_path):
    lora = peft_c.Adapter.open(ADAPTERS / "llama_lora")
    second = peft_c.Adapter.open(ADAPTERS / "llama_lora_second")
    dora = peft_c.Adapter.open(ADAPTERS / "llama_dora")
    with pytest.raises(peft_c.InvalidArgumentError, match="density"):
        peft_c.combine_deltas([lora, second], [1, 1], tmp_path / "a", method="ties", rank=2)
    with pytest.raises(peft_c.InvalidArgumentError, match="rank or an energy"):
        peft_c.combine_deltas([lora, second], [1, 1], tmp_path / "a", method="ties", density=0.5)
    with pytest.raises(peft_c.UnsupportedError, match="DoRA"):
        peft_c.combine_deltas([lora, dora], [1, 1], tmp_path / "a")
    with pytest.raises(ValueError):
        peft_c.combine_deltas([lora], [1], tmp_path / "a", method="svd")
    with pytest.raises(ValueError):
        peft_c.combine_deltas([lora], [1], tmp_path / "a", rank=2, energy=0.5)
    assert not (tmp_path / "a").exists()
