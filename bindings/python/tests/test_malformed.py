"""Every format error path, judged by the reference reader.

Each hand-made file below is given to ``safetensors.deserialize`` (the reference) and to peft_c, through
``Checkpoint.from_bytes`` and through a file with ``Checkpoint.open`` in both reading modes. The error
class peft_c raises must be the one of the reference's failure kind; a file the reference accepts must be
accepted. The malformed corpus of tests/fixtures/malformed (expected.json) is checked the same way.
"""

from __future__ import annotations

import json
import pathlib
import struct

import pytest

import peft_c
from peft_c_test_support import FIXTURES, reference_verdict, safetensors_bytes as st


def raw(header_text: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header_text)) + header_text + data


def f32(name="a", shape=(2,), offsets=(0, 8)):
    return {name: {"dtype": "F32", "shape": list(shape), "data_offsets": list(offsets)}}


REJECTED = {
    "empty_file": b"",
    "seven_bytes": b"\x02\0\0\0\0\0\0",
    "header_over_cap": struct.pack("<Q", 100_000_001) + b"{}",
    "header_u64_max": struct.pack("<Q", 2**64 - 1) + b"{}",
    "header_past_eof": struct.pack("<Q", 50) + b"{}",
    "invalid_utf8": raw(b'{"\xff":1}'),
    "invalid_utf8_in_padding": raw(b"{}  \xc3"),
    "nul_padding": raw(b"{}\0\0"),
    "not_an_object": raw(b"[]"),
    "truncated_json": raw(b'{"a":{"dtype":"F32"'),
    "unknown_dtype": st({"a": {"dtype": "F33", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
    "lowercase_dtype": st({"a": {"dtype": "f32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4),
    "missing_shape": st({"a": {"dtype": "F32", "data_offsets": [0, 4]}}, b"\0" * 4),
    "negative_dim": st(f32(shape=(-1,), offsets=(0, 4)), b"\0" * 4),
    "float_offset": raw(b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}}', b"\0" * 4),
    "three_offsets": st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4, 4]}}, b"\0" * 4),
    "metadata_not_string": st({"__metadata__": {"k": 1}}),
    "metadata_nested": st({"__metadata__": {"k": {"x": "y"}}}),
    "lone_surrogate": raw(b'{"\\ud800":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
    "control_char": raw(b'{"a\x01":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4),
    "trailing_garbage": raw(b"{} x"),
    "gap": st({**f32("a", (1,), (0, 4)), **f32("b", (1,), (8, 12))}, b"\0" * 12),
    "not_from_zero": st(f32(offsets=(4, 12)), b"\0" * 12),
    "end_before_begin": st({**f32("a", (1,), (0, 4)), **f32("b", (0,), (4, 0))}, b"\0" * 4),
    "overlap": st({**f32("a", (2,), (0, 8)), **f32("b", (1,), (4, 8))}, b"\0" * 8),
    "shape_overflow": st(f32(shape=(2**32, 2**32, 2**32), offsets=(0, 4)), b"\0" * 4),
    "bits_overflow": st({"a": {"dtype": "F64", "shape": [2**61], "data_offsets": [0, 8]}}, b"\0" * 8),
    "f4_odd_count": st({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}}, b"\0" * 2),
    "f6_partial": st({"a": {"dtype": "F6_E3M2", "shape": [3], "data_offsets": [0, 3]}}, b"\0" * 3),
    "span_too_short": st(f32(shape=(3,), offsets=(0, 8)), b"\0" * 8),
    "scalar_wrong_span": st(f32(shape=(), offsets=(0, 8)), b"\0" * 8),
    "trailing_byte": st(f32(), b"\0" * 9),
    "truncated_data": st(f32(), b"\0" * 7),
    "empty_header_extra_data": st({}, b"\0"),
}

ACCEPTED = {
    "empty_object": st({}),
    "trailing_whitespace": st({}, pad=b" \t\r\n"),
    "leading_whitespace": raw(b"\t\n{}\r "),
    "unknown_field_ignored": st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4],
                                       "extra": [1, {"x": None}]}}, b"\0" * 4),
    "metadata_null": st({"__metadata__": None}),
    "zero_size_tensors_share_offset": st({**f32("a", (0,), (0, 0)), **f32("b", (2, 0), (0, 0)),
                                          **f32("c", (1,), (0, 4))}, b"\0" * 4),
    "keys_out_of_data_order": st({**f32("z", (1,), (0, 4)), **f32("a", (1,), (4, 8))}, b"\0" * 8),
    "f6_four_values": st({"a": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}}, b"abc"),
    "scalar": st({"s": {"dtype": "I32", "shape": [], "data_offsets": [0, 4]}}, b"\1\0\0\0"),
    "empty_name": st(f32("", (1,), (0, 4)), b"\0" * 4),
    "escaped_name": raw(b'{"\\u00e9\\n":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}', b"\7"),
}


def peft_verdict(data: bytes, tmp_path: pathlib.Path):
    """The code name peft_c gives (None when it accepts), the same through every way of opening."""
    verdicts = set()
    path = tmp_path / "case.safetensors"
    path.write_bytes(data)
    openers = (lambda: peft_c.Checkpoint.from_bytes(data),
               lambda: peft_c.Checkpoint.open(path),
               lambda: peft_c.Checkpoint.open(path, use_pread=True))
    for opener in openers:
        try:
            opener().close()
            verdicts.add(None)
        except peft_c.PeftError as err:
            assert err.message, "an error must say what is wrong"
            assert type(err) is peft_c.ERROR_CLASSES[err.code]
            verdicts.add(err.code_name)
    assert len(verdicts) == 1, f"opening ways disagree: {verdicts}"
    return verdicts.pop()


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_like_the_reference(name, tmp_path):
    data = REJECTED[name]
    reference = reference_verdict(data)
    assert reference is not None, "the reference accepts this file; the case is wrong"
    assert not reference.startswith("OTHER"), reference
    assert peft_verdict(data, tmp_path) == reference


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_like_the_reference(name, tmp_path):
    data = ACCEPTED[name]
    assert reference_verdict(data) is None
    assert peft_verdict(data, tmp_path) is None


def test_rejected_files_raise_format_errors(tmp_path):
    data = REJECTED["gap"]
    with pytest.raises(peft_c.InvalidOffsetError) as info:
        peft_c.Checkpoint.from_bytes(data)
    err = info.value
    assert isinstance(err, peft_c.SafetensorsFormatError) and isinstance(err, ValueError)
    assert err.code == peft_c.ErrorCode.INVALID_OFFSET == 6 and err.code_name == "INVALID_OFFSET"
    assert "b" in err.message  # names the tensor at fault


def test_duplicate_names_are_rejected(tmp_path):
    # Stricter than the reference (documented): a duplicate with identical info is accepted by it.
    text = (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
            b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}')
    data = raw(text, b"\0" * 4)
    assert reference_verdict(data) is None
    assert peft_verdict(data, tmp_path) == "INVALID_HEADER"


# ---- the committed malformed corpus ----------------------------------------------------------------

MALFORMED = FIXTURES / "malformed"


def malformed_cases():
    expected_file = MALFORMED / "expected.json"
    if not expected_file.exists():
        return []
    expected = json.loads(expected_file.read_text())
    from peft_c_test_support import expected_entries

    return list(expected_entries(expected))


@pytest.mark.skipif(not (MALFORMED / "expected.json").exists(),
                    reason="tests/fixtures/malformed/expected.json not generated yet")
@pytest.mark.parametrize("case", malformed_cases(), ids=lambda c: c[0])
def test_malformed_corpus(case, tmp_path):
    name, code_name = case
    data = (MALFORMED / name).read_bytes()
    assert peft_verdict(data, tmp_path) == code_name
