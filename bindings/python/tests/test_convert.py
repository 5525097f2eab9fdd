"""peft_c.convert and the dtype helpers, judged by numpy, torch and ml_dtypes."""

from __future__ import annotations

import numpy as np
import pytest

import peft_c

ml_dtypes = pytest.importorskip("ml_dtypes")
torch = pytest.importorskip("torch")


def special_f32(rng) -> np.ndarray:
    """Random values across the range plus the awkward ones: ties, subnormals, overflow, NaN, inf."""
    values = np.concatenate([
        rng.standard_normal(2000).astype(np.float32) * np.float32(1e3),
        rng.standard_normal(500).astype(np.float32) * np.float32(1e-6),
        np.frombuffer(rng.integers(0, 2**32, 3000, dtype=np.uint32).tobytes(), dtype=np.float32),
        np.array([0.0, -0.0, 1.0, -1.0, 65504.0, 65520.0, 1e-8, 3.4e38, -3.4e38,
                  np.inf, -np.inf, np.nan, 1.00390625, 1.01171875, 2.0**-133, 2.0**-149], np.float32),
    ])
    return values


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality of two float arrays, except that any NaN equals any NaN (payloads may differ)."""
    assert a.dtype == b.dtype and a.shape == b.shape
    width = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    with np.errstate(invalid="ignore"):
        fa, fb = a.astype(np.float64), b.astype(np.float64)
    nan = np.isnan(fa) & np.isnan(fb)
    return bool(np.all((a.view(width) == b.view(width)) | nan))


def test_f32_to_bf16_rounds_like_torch():
    src = special_f32(np.random.default_rng(0))
    ours = peft_c.convert(src, "F32", "BF16")
    assert ours.dtype == np.dtype(ml_dtypes.bfloat16) and ours.shape == src.shape
    theirs = torch.from_numpy(src).to(torch.bfloat16).view(torch.uint16).numpy()
    assert same_bits(ours, theirs.view(ml_dtypes.bfloat16))


def test_f32_to_f16_rounds_like_numpy():
    src = special_f32(np.random.default_rng(1))
    ours = peft_c.convert(src, "F32", "F16")
    with np.errstate(over="ignore"):
        assert same_bits(ours, src.astype(np.float16))


@pytest.mark.parametrize("name,ml_name", [
    ("BF16", "bfloat16"), ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"),
    ("F16", "float16"),
])
def test_widening_to_f32_is_exact(name, ml_name):
    bits = 16 if name in ("BF16", "F16") else 8
    raw_type = np.uint16 if bits == 16 else np.uint8
    every = np.arange(2**bits, dtype=np.uint32).astype(raw_type)  # every bit pattern
    ml_type = np.float16 if ml_name == "float16" else getattr(ml_dtypes, ml_name)
    expected = every.view(ml_type).astype(np.float32)
    ours = peft_c.convert(every, name, "F32")  # raw integers read as `name`
    assert ours.dtype == np.float32 and ours.shape == every.shape
    assert same_bits(ours, expected)


@pytest.mark.parametrize("np_type", [np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
                                     np.int64, np.uint64, np.bool_, np.float64])
def test_integers_bool_and_f64_to_f32_like_numpy(np_type):
    rng = np.random.default_rng(2)
    if np_type is np.bool_:
        src = rng.integers(0, 2, 100).astype(bool)
    elif np_type is np.float64:
        src = rng.standard_normal(1000) * 1e30
    else:
        info = np.iinfo(np_type)
        src = rng.integers(info.min, info.max, 1000, dtype=np_type, endpoint=True)
        src[:2] = [info.min, info.max]
    ours = peft_c.convert(src, None, "F32")  # the source dtype taken from numpy
    assert same_bits(ours, src.astype(np.float32))


def test_int64_to_f64_and_f16_like_numpy():
    src = np.array([2**53 + 1, -(2**63), 2**62 + 2**10 + 1, 70000, -70000], dtype=np.int64)
    assert same_bits(peft_c.convert(src, "I64", "F64"), src.astype(np.float64))
    with np.errstate(over="ignore"):
        assert same_bits(peft_c.convert(src, "I64", "F16"), src.astype(np.float16))


def test_same_dtype_is_a_copy_even_for_packed_types():
    packed = np.array([0x12, 0x34, 0x56], dtype=np.uint8)  # 4 F6 values, or 6 F4 values
    out = peft_c.convert(packed, "F6_E2M3", "F6_E2M3")
    assert out.tobytes() == packed.tobytes() and out.dtype == np.uint8
    assert peft_c.convert(packed, "F4", "F4").tobytes() == packed.tobytes()
    c = np.array([1 + 2j], dtype=np.complex64)
    assert peft_c.convert(c, None, "C64").tobytes() == c.tobytes()


def test_shape_is_kept_when_item_sizes_match_and_flat_otherwise():
    src = np.ones((2, 3), dtype=np.uint16)
    assert peft_c.convert(src, "BF16", "F32").shape == (2, 3)
    assert peft_c.convert(src.view(np.uint8), "BF16", "F32").shape == (6,)


def test_non_contiguous_and_big_endian_inputs():
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert np.array_equal(peft_c.convert(base[:, ::2], None, "F64"), base[:, ::2].astype(np.float64))
    big = np.arange(5, dtype=">f4")
    assert np.array_equal(peft_c.convert(big, None, "F64"), np.arange(5, dtype=np.float64))


def test_empty_input():
    out = peft_c.convert(np.zeros(0, dtype=np.float32), None, "BF16")
    assert out.shape == (0,)


def test_unsupported_pair_raises():
    with pytest.raises(peft_c.UnsupportedError) as info:
        peft_c.convert(np.ones(3, dtype=np.float32), "F32", "I32")
    assert info.value.code == peft_c.ErrorCode.UNSUPPORTED


def test_bytes_that_do_not_hold_whole_elements():
    with pytest.raises(ValueError):
        peft_c.convert(np.zeros(3, dtype=np.uint8), "F32", "F64")


def test_as_dtype_accepts_names_values_enums_and_numpy_types():
    assert peft_c.as_dtype("BF16") is peft_c.DType.BF16
    assert peft_c.as_dtype(17) is peft_c.DType.F32
    assert peft_c.as_dtype(peft_c.DType.F16) is peft_c.DType.F16
    assert peft_c.as_dtype(np.float64) is peft_c.DType.F64
    assert peft_c.as_dtype(np.dtype(ml_dtypes.bfloat16)) is peft_c.DType.BF16
    assert peft_c.as_dtype(np.dtype(ml_dtypes.float8_e4m3fn)) is peft_c.DType.F8_E4M3
    with pytest.raises(ValueError):
        peft_c.as_dtype("f32")
    with pytest.raises(ValueError):
        peft_c.as_dtype(22)
    with pytest.raises(ValueError):
        peft_c.as_dtype(np.float128 if hasattr(np, "float128") else np.str_)


def test_numpy_dtypes_have_the_right_item_size():
    for value, name, bits in peft_c.DTYPES:
        np_type = peft_c.numpy_dtype(name)
        if name in ("F4", "F6_E2M3", "F6_E3M2"):
            assert np_type is None
        else:
            assert np_type.itemsize * 8 == bits
            raw = peft_c.numpy_dtype(name, use_ml_dtypes=False)
            assert raw.itemsize * 8 == bits
