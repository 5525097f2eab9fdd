"""GGUF files through the binding: file format and version, typed metadata as Python values, ggml types,
tensors (shape outermost first, F16 converted on read, a Q8_0 tensor readable only as bytes).

The file is tests/fixtures/gguf/bindings_sample.gguf (written by bindings_sample.py next to it, in the
byte layout of tests/capi/test_gguf.c); the expected values below are the ones that script packs.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import peft_c
from peft_c import GgufValueType as T
from peft_c_test_support import FIXTURES

SAMPLE = FIXTURES / "gguf" / "bindings_sample.gguf"

EXPECTED = {
    "general.architecture": "llama",
    "general.alignment": 64,
    "a.u8": 200,
    "a.i8": -2,
    "a.u16": 0x1234,
    "a.i16": -1,
    "a.i32": -7,
    "a.f32": 1.5,
    "a.bool": True,
    "a.u64": 2**64 - 1,
    "a.i64": -5,
    "a.f64": math.pi,
    "a.tokens": ["<s>", "", "hello"],
    "a.ids": [10, -20],
}


@pytest.fixture(params=["mmap", "pread", "memory"])
def sample(request):
    if request.param == "memory":
        ckpt = peft_c.Checkpoint.from_bytes(SAMPLE.read_bytes())
    else:
        ckpt = peft_c.Checkpoint.open(SAMPLE, use_pread=request.param == "pread")
    with ckpt:
        yield ckpt


def test_format_and_version(sample):
    assert sample.file_format() == "gguf"
    assert sample.file_format(-1) == "gguf"
    assert sample.gguf_version() == 3
    with pytest.raises(IndexError):
        sample.file_format(1)


def test_metadata_values_and_types(sample):
    meta = sample.gguf_metadata()
    assert list(meta) == list(EXPECTED)  # file order
    assert meta == EXPECTED
    assert type(meta["a.bool"]) is bool and type(meta["a.u8"]) is int and type(meta["a.f32"]) is float
    assert sample.gguf_value("a.u64") == 2**64 - 1
    assert sample.gguf_value("a.f64") == math.pi
    assert sample.gguf_type("general.alignment") == (T.U32, None)
    assert sample.gguf_type("a.i8") == (T.I8, None)
    assert sample.gguf_type("a.bool") == (T.BOOL, None)
    assert sample.gguf_type("a.tokens") == (T.ARRAY, T.STRING)
    assert sample.gguf_type("a.ids") == (T.ARRAY, T.I32)
    # The safetensors metadata getter sees nothing in a GGUF file.
    assert sample.metadata() is None


def test_missing_key_is_not_found(sample):
    with pytest.raises(peft_c.NotFoundError) as info:
        sample.gguf_value("no.such.key")
    assert info.value.code == peft_c.ErrorCode.NOT_FOUND
    assert "no.such.key" in str(info.value)
    assert isinstance(info.value, KeyError)
    with pytest.raises(peft_c.NotFoundError):
        sample.gguf_type("no.such.key")


def test_tensors(sample):
    assert sample.keys() == ("w", "q")
    w, q = sample.tensor("w"), sample.tensor("q")
    assert (w.dtype, w.ggml_type, w.shape) == ("F16", "F16", (2, 3))
    assert np.array_equal(sample.read("w"), np.arange(1, 7, dtype=np.float32).reshape(2, 3))
    assert np.array_equal(sample.view("w"), np.arange(1, 7, dtype=np.float16).reshape(2, 3))

    assert (q.dtype, q.ggml_type, q.shape, q.data_offsets) == (None, "Q8_0", (1, 32), (64, 98))
    raw = sample.view("q")
    assert raw.dtype == np.uint8 and raw.shape == (34,)
    assert raw[:2].view(np.float16)[0] == 1.0
    assert list(raw[2:].view(np.int8)) == list(range(-16, 16))
    block, size = peft_c.ggml_type_geometry(peft_c.ggml_type_from_name(q.ggml_type))
    assert q.nbytes == q.numel // block * size
    for dtype in ("F32", None):
        with pytest.raises(peft_c.UnsupportedError) as info:
            sample.read("q", dtype)
        assert info.value.code == peft_c.ErrorCode.UNSUPPORTED
        assert "block-quantized" in str(info.value)


def test_safetensors_file_has_no_gguf_side(np_file):
    with peft_c.Checkpoint.open(np_file) as ckpt:
        assert ckpt.file_format() == "safetensors"
        assert ckpt.gguf_version() is None
        assert ckpt.gguf_metadata() is None
        assert all(info.ggml_type is None and info.dtype is not None for info in ckpt.tensors())
        with pytest.raises(peft_c.NotFoundError):
            ckpt.gguf_value("general.architecture")


def test_ggml_types():
    assert peft_c.ggml_type_name(12) == "Q4_K"
    assert peft_c.ggml_type_name(4) is None  # the removed Q4_2
    assert peft_c.ggml_type_name(-1) is None
    assert peft_c.ggml_type_name(2**40) is None
    assert peft_c.ggml_type_from_name("BF16") == 30
    with pytest.raises(ValueError, match="bf16"):
        peft_c.ggml_type_from_name("bf16")
    assert peft_c.ggml_type_geometry(0) == (1, 4)
    assert peft_c.ggml_type_geometry(8) == (32, 34)
    assert peft_c.ggml_type_geometry(14) == (256, 210)
    with pytest.raises(peft_c.InvalidArgumentError) as info:
        peft_c.ggml_type_geometry(31)
    assert info.value.code == peft_c.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(TypeError):
        peft_c.ggml_type_name("Q4_K")


# ---- merge into a block-quantized GGUF base (quant, report) ---------------------------------------------

def _q8_0_llama(path, values):
    """A one-tensor llama GGUF written by hand: blk.0.ffn_down.weight, Q8_0, shape [16, 32]."""
    import struct

    def string(s):
        data = s.encode()
        return struct.pack("<Q", len(data)) + data

    blocks = b""
    for row in values.reshape(-1, 32):  # ggml's Q8_0: d = max|x| / 127 (f16), q = round(x / d)
        d = np.float16(np.abs(row).max() / 127)
        q = np.round(row / np.float32(d)).astype(np.int8)
        blocks += d.tobytes() + q.tobytes()
    kvs = [string("general.architecture") + struct.pack("<I", 8) + string("llama"),
           string("llama.attention.head_count") + struct.pack("<II", 4, 1),
           string("llama.attention.head_count_kv") + struct.pack("<II", 4, 1)]
    info = string("blk.0.ffn_down.weight") + struct.pack("<IQQIQ", 2, 32, 16, 8, 0)
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, len(kvs)) + b"".join(kvs) + info
    head += b"\0" * (-len(head) % 32)
    path.write_bytes(head + blocks)
    return path


def _down_proj_adapter(folder, rng):
    from peft_c_test_support import safetensors_bytes

    folder.mkdir()
    a = rng.standard_normal((4, 32)).astype(np.float32) * 0.1
    b = rng.standard_normal((16, 4)).astype(np.float32) * 0.1
    key = "base_model.model.model.layers.0.mlp.down_proj"
    header = {f"{key}.lora_A.weight": {"dtype": "F32", "shape": [4, 32], "data_offsets": [0, a.nbytes]},
              f"{key}.lora_B.weight": {"dtype": "F32", "shape": [16, 4], "data_offsets": [a.nbytes, a.nbytes + b.nbytes]}}
    (folder / "adapter_model.safetensors").write_bytes(safetensors_bytes(header, a.tobytes() + b.tobytes()))
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": 4, "lora_alpha": 8, "target_modules": ["down_proj"],
        "base_model_name_or_path": "", "task_type": "CAUSAL_LM"}))
    return folder


def test_merge_into_quantized_gguf(tmp_path):
    rng = np.random.default_rng(7)
    base = _q8_0_llama(tmp_path / "base.gguf", rng.standard_normal((16, 32)).astype(np.float32))
    adapter = _down_proj_adapter(tmp_path / "adapter", rng)

    kept = peft_c.merge_checkpoint(base, tmp_path / "kept.gguf", [adapter], report=True)
    assert kept.merged == 1 and len(kept.report) == 1
    entry = kept.report[0]
    assert entry["tensor"] == "blk.0.ffn_down.weight" and entry["base_type"] == entry["type"] == "Q8_0"
    assert entry["values"] == 512 and 0 < entry["rms"] <= entry["max"] and 0 <= entry["base_rms"] <= entry["base_max"]
    assert (tmp_path / "kept.gguf").stat().st_size == base.stat().st_size
    with peft_c.Checkpoint.open(tmp_path / "kept.gguf") as ckpt:
        assert ckpt.tensor("blk.0.ffn_down.weight").ggml_type == "Q8_0"

    f32 = peft_c.merge_checkpoint(base, tmp_path / "f32.gguf", [adapter], quant="f32", report=True)
    assert f32.report[0]["type"] == "F32" and f32.report[0]["rms"] == 0 == f32.report[0]["base_max"]
    assert peft_c.merge_checkpoint(base, tmp_path / "plain.gguf", [adapter]).report == ()

    with pytest.raises(peft_c.UnsupportedError):
        peft_c.merge_checkpoint(base, tmp_path / "x.gguf", [adapter], quant="IQ2_XS")
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.merge_checkpoint(base, tmp_path / "x.gguf", [adapter], quant="Q8_0", dtype="F16")
    with pytest.raises(ValueError):
        peft_c.merge_checkpoint(base, tmp_path / "x.gguf", [adapter], quant="Q9_9")
    assert not (tmp_path / "x.gguf").exists()
