"""Control vectors through the binding (``ControlVector``, ``ControlRecord``): building and reading back,
saving to GGUF and safetensors and opening again, llama.cpp's float32 arithmetic of ``add`` and
``apply``, the exact removal, and the error classes of the library's codes."""

from __future__ import annotations

import numpy as np
import pytest

import peft_c

D1 = np.array([0.1, -0.25, 1.5, 3.0e-3], dtype=np.float32)
D3 = np.array([-1.0, 0.7, 0.0, 2.5], dtype=np.float32)


@pytest.fixture
def vector():
    with peft_c.ControlVector.new(4, "test-model") as v:
        v.set_direction(1, D1)
        v.set_direction(3, [float(x) for x in D3])  # a list of floats: converted to float32
        yield v


def check_sample(v):
    assert v.n_embd == 4
    assert v.model_hint == "test-model"
    assert v.layer_count == 2
    assert [v.layer(0), v.layer(1)] == [1, 3]
    assert v.layers == [1, 3]
    with pytest.raises(IndexError):
        v.layer(2)
    d1, d3 = v.direction(1), v.direction(3)
    assert d1.dtype == np.float32 and d1.tobytes() == D1.tobytes()
    assert d3.tobytes() == D3.tobytes()
    assert v.direction(2) is None


def test_new_and_read_back(vector):
    check_sample(vector)
    with peft_c.ControlVector.new(4) as w:
        assert w.model_hint == ""
        assert w.layers == []
        # Other dtypes: float64 and float16 arrays as they are, raw bytes with dtype=.
        w.set_direction(5, np.array([0.5, -2.0, 1e-3, 8.0]))
        assert w.direction(5).tolist() == np.array([0.5, -2.0, 1e-3, 8.0], np.float32).tolist()
        w.set_direction(6, np.array([1.0, 2.0, 3.0, 0.5], np.float16))
        assert w.direction(6).tolist() == [1.0, 2.0, 3.0, 0.5]
        w.set_direction(7, np.array([0x3F80, 0xC000, 0, 0x3E80], np.uint16).tobytes(), dtype="BF16")
        assert w.direction(7).tolist() == [1.0, -2.0, 0.0, 0.25]
        with pytest.raises(ValueError):
            w.set_direction(8, [1.0, 2.0, 3.0])  # three values for n_embd 4
    # The direction is a copy: changing it does not change the vector.
    d = vector.direction(1)
    d[:] = 0
    assert vector.direction(1).tobytes() == D1.tobytes()


@pytest.mark.parametrize("name,fmt", [("cv.gguf", "gguf"), ("cv.safetensors", "safetensors"),
                                      ("cv2.gguf", peft_c.FORMAT_GGUF),
                                      ("cv2.safetensors", peft_c.FORMAT_SAFETENSORS)])
def test_save_and_open(vector, tmp_path, name, fmt):
    path = tmp_path / name
    vector.save(path, fmt)
    with peft_c.ControlVector.open(path) as back:
        check_sample(back)


def test_add_is_float32_arithmetic(vector):
    s3 = np.array([0.3, 0.1, -7.0, 1e-7], np.float32)
    s4 = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    with peft_c.ControlVector.new(4) as src:
        src.set_direction(3, s3)
        src.set_direction(4, s4)
        vector.add(src, 0.5)
    half = np.float32(0.5)
    assert vector.layers == [1, 3, 4]
    assert vector.direction(1).tobytes() == D1.tobytes()
    assert vector.direction(3).tobytes() == (D3 + s3 * half).astype(np.float32).tobytes()
    assert vector.direction(4).tobytes() == (np.float32(0) + s4 * half).astype(np.float32).tobytes()
    vector.add(vector, 1.0)  # src may be the vector itself
    assert vector.direction(4).tobytes() == (s4 * half * np.float32(2)).tobytes()
    with peft_c.ControlVector.new(5) as other, pytest.raises(peft_c.ShapeMismatchError):
        vector.add(other, 1.0)


def test_apply_and_remove(vector):
    original = np.array([[1.0, 2.0, -3.0, 0.125], [10.0, -0.5, 0.333, 7.0]], np.float32)
    buf = original.copy()
    with vector.apply(3, 2.0, buf) as record:
        assert np.array_equal(buf, original + (D3 * np.float32(2.0)).astype(np.float32))
        assert buf.tobytes() == (original + D3 * np.float32(2.0)).astype(np.float32).tobytes()
        record.remove(buf)
        assert buf.tobytes() == original.tobytes()
        with pytest.raises(peft_c.InvalidArgumentError):
            record.remove(buf)  # spent
    assert record.closed

    assert vector.apply(1, 2.0, buf, record=False) is None
    assert buf.tobytes() == (original + D1 * np.float32(2.0)).astype(np.float32).tobytes()

    buf = original.copy()
    with vector.apply(2, 2.0, buf) as record:  # no direction for layer 2
        assert buf.tobytes() == original.tobytes()
        record.remove(buf)
    with pytest.raises(ValueError):
        vector.apply(3, 1.0, np.zeros(6, np.float32))  # not whole rows


def test_errors(vector, tmp_path):
    vector.set_direction(0, D1)
    with pytest.raises(peft_c.InvalidArgumentError) as info:
        vector.save(tmp_path / "zero.gguf", "gguf")
    assert info.value.code == peft_c.ErrorCode.INVALID_ARGUMENT
    vector.save(tmp_path / "zero.safetensors", "safetensors")
    with pytest.raises(peft_c.IoError) as info:
        peft_c.ControlVector.open(tmp_path / "missing.gguf")
    assert info.value.code == peft_c.ErrorCode.IO
    assert isinstance(info.value, OSError)
    with pytest.raises(peft_c.NonFiniteError):
        vector.set_direction(2, [1.0, float("nan"), 0.0, 0.0])
    assert vector.direction(2) is None
    with pytest.raises(peft_c.InvalidArgumentError):
        vector.set_direction(-1, D1)
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.ControlVector.new(0)
    vector.close()
    with pytest.raises(ValueError, match="closed"):
        vector.direction(1)
