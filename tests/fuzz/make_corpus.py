#!/usr/bin/env python3
"""Writes the seed corpus tests/fuzz/corpus/header/ and tests/fuzz/corpus_codes.json.

Valid seeds come from the reference writer (safetensors.torch.save); malformed ones are written by
hand, one or more per rule of the reference reader (see src/safetensors/header_sax.hpp and
header_parser.cpp). corpus_codes.json then records, for every file in the corpus directory
(including fuzzer findings added there by hand), the error kind the real `safetensors` package
reports; tests/unit/test_header_parser.cpp checks the parser against it (files named stricter_*
are accepted by the reference and rejected by peft_c on purpose).

Run with the pinned reference environment:
  $(scripts/python-env.sh)/bin/python tests/fuzz/make_corpus.py
"""
import os
import struct
import sys

import torch
from safetensors.torch import save

HERE = os.path.dirname(os.path.abspath(__file__))
CORPUS = os.path.join(HERE, "corpus", "header")
sys.path.insert(0, HERE)
from differential import reference_codes  # noqa: E402


def framed(header, data_len=0, pad=True):
    if isinstance(header, str):
        header = header.encode("utf-8")
    if pad:
        header += b" " * ((-len(header)) % 8)
    return struct.pack("<Q", len(header)) + header + b"\0" * data_len


def one(name, dtype, shape, offsets, extra=""):
    return '"%s":{"dtype":"%s","shape":%s,"data_offsets":[%d,%d]%s}' % (
        name, dtype, str(list(shape)).replace(" ", ""), offsets[0], offsets[1], extra)


def valid_seeds():
    z = torch.zeros
    yield "valid_i32_2x2", save({"test": z((2, 2), dtype=torch.int32)})
    yield "valid_i32_f16_alignment", save({"test1": z((2, 2), dtype=torch.int32),
                                           "test2": z((2, 2), dtype=torch.float16)})
    yield "valid_metadata", save({"test1": z((2, 2), dtype=torch.int32)}, metadata={"framework": "pt"})
    yield "valid_empty", save({})
    yield "valid_empty_metadata", save({}, metadata={"framework": "pt"})
    yield "valid_f32_attn", save({"attn.0": torch.arange(6, dtype=torch.float32).reshape(1, 2, 3)})
    yield "valid_scalar", save({"s": torch.tensor(7, dtype=torch.int32)})
    yield "valid_zero_sized", save({"e": z((2, 0)), "f": z((0,), dtype=torch.float16), "g": z((1,))})
    yield "valid_all_torch_dtypes", save({
        "bool": z(3, dtype=torch.bool), "u8": z(3, dtype=torch.uint8), "i8": z(3, dtype=torch.int8),
        "e5m2": z(3, dtype=torch.float8_e5m2), "e4m3": z(3, dtype=torch.float8_e4m3fn),
        "e8m0": z(3, dtype=torch.float8_e8m0fnu), "i16": z(3, dtype=torch.int16),
        "u16": z(3, dtype=torch.uint16), "f16": z(3, dtype=torch.float16), "bf16": z(3, dtype=torch.bfloat16),
        "i32": z(3, dtype=torch.int32), "u32": z(3, dtype=torch.uint32), "f32": z(3),
        "c64": z(3, dtype=torch.complex64), "f64": z(3, dtype=torch.float64), "i64": z(3, dtype=torch.int64),
        "u64": z(3, dtype=torch.uint64)}, metadata={"format": "pt", "b": "2", "a": "\u00e9\n"})
    yield "valid_unicode_names", save({"\u00e9\u4e2d\U0001F600": z(1), "q\"\\\n\x01": z(1)})
    # Sub-byte dtypes, hand-written (torch has no F6): F4 [1,2] is one byte, F6 [4] three.
    yield "valid_f4_f6", framed("{" + one("a", "F6_E2M3", [4], (0, 3)) + "," + one("b", "F4", [1, 2], (3, 4)) + "}", 4)
    # Accepted by the reference although odd: whitespace around the object, tensors in any JSON
    # order, unknown fields of any JSON.
    yield "valid_leading_whitespace", framed(b"\t\n{}\r ")
    yield "valid_json_order", framed("{" + one("b", "U8", [2], (2, 4)) + "," + one("a", "U8", [2], (0, 2)) + "}", 4)
    yield "valid_unknown_fields", framed("{" + one("t", "F32", [1], (0, 4),
        ',"x":[null,true,-5,1.5e300,"s",{"k":[]}],"x":18446744073709551616') + "}", 4)
    yield "valid_depth_127", framed("{" + one("t", "U8", [], (0, 1), ',"d":' + "[" * 125 + "]" * 125) + "}", 1)
    yield "valid_metadata_null", framed('{"__metadata__":null}')
    yield "valid_metadata_dup_key", framed('{"__metadata__":{"a":"1","a":"2"}}')
    yield "valid_escaped_names", framed('{"\\u005f_metadata__":{"k":"\\ud83d\\ude00"},"\\u0074":{"d\\u0074ype":"F\\u00332","shape":[1],"data_offsets":[0,4]}}', 4)
    yield "valid_max_u64_dim", framed("{" + one("z", "F32", [18446744073709551615, 0], (0, 0)) + "}")
    yield "valid_float_edge", framed("{" + one("t", "U8", [], (0, 1), ',"f":1.79769313486231581e308') + "}", 1)


def malformed_seeds():
    yield "bad_too_small_0", b""
    yield "bad_too_small_7", b"\x02\0\0\0\0\0\0"
    yield "bad_too_large", struct.pack("<Q", 100_000_001) + b"{}"
    yield "bad_length_past_end", struct.pack("<Q", 64) + b"{}"
    yield "bad_length_u64_max", struct.pack("<Q", 2**64 - 1)
    yield "bad_utf8", framed(b'{"\xff":1}')
    yield "bad_utf8_surrogate", framed(b'{"\xed\xa0\x80":1}')
    yield "bad_utf8_overlong", framed(b'{"\xc0\xaf":1}')
    yield "bad_utf8_in_padding", struct.pack("<Q", 8) + b"{}     \xc3"
    yield "bad_not_json", framed(b"{")
    yield "bad_root_array", framed(b"[]")
    yield "bad_bom", framed(b"\xef\xbb\xbf{}")
    yield "bad_nul_padding", struct.pack("<Q", 8) + b"{}\0\0\0\0\0\0"
    yield "bad_formfeed", framed(b"\x0c{}")
    yield "bad_trailing", framed(b"{}x")
    yield "bad_comment", framed(b"{}/**/")
    yield "bad_trailing_comma", framed(b'{"__metadata__":{"a":"b",}}')
    yield "bad_metadata_number", framed('{"__metadata__":{"a":1}}')
    yield "bad_metadata_twice", framed('{"__metadata__":null,"__metadata__":null}')
    yield "bad_metadata_array", framed('{"__metadata__":[]}')
    yield "bad_dtype_case", framed("{" + one("t", "f32", [1], (0, 4)) + "}", 4)
    yield "bad_dtype_unknown", framed("{" + one("t", "F8_E4M3FN", [1], (0, 1)) + "}", 1)
    yield "bad_dtype_map_empty_object", framed('{"t":{"dtype":{"F32":{}},"shape":[1],"data_offsets":[0,4]}}', 4)
    yield "bad_dtype_map_two_keys", framed('{"t":{"dtype":{"F32":null,"F16":null},"shape":[1],"data_offsets":[0,4]}}', 4)
    yield "bad_missing_shape", framed('{"t":{"dtype":"F32","data_offsets":[0,4]}}', 4)
    yield "bad_duplicate_field", framed('{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"shape":[1]}}', 4)
    yield "bad_negative_dim", framed("{" + one("t", "F32", [-1], (0, 4)) + "}", 4)
    yield "bad_minus_zero", framed('{"t":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}}')
    yield "bad_fraction_dim", framed('{"t":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}}', 4)
    yield "bad_exponent_offset", framed('{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4e0]}}', 4)
    yield "bad_dim_above_u64", framed('{"t":{"dtype":"F32","shape":[18446744073709551616,0],"data_offsets":[0,0]}}')
    yield "bad_offsets_one", framed('{"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}}', 4)
    yield "bad_offsets_three", framed('{"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4,4]}}', 4)
    yield "bad_array_form_four", framed('{"t":["F32",[1],[0,4],5]}', 4)
    yield "bad_tensor_null", framed('{"t":null}')
    yield "bad_depth_128", framed("{" + one("t", "U8", [], (0, 1), ',"d":' + "[" * 126 + "]" * 126) + "}", 1)
    yield "bad_depth_300", framed('{"t":' + "[" * 300 + "]" * 300 + "}")
    yield "bad_float_overflow", framed("{" + one("t", "U8", [], (0, 1), ',"f":1.7976931348623158e308') + "}", 1)
    yield "bad_lone_surrogate", framed('{"\\ud800":1}')
    yield "bad_control_char", framed(b'{"a\x01":1}')
    # Accepted by the reference, rejected by peft_c on purpose (src/safetensors/header_sax.hpp).
    yield "stricter_array_form", framed('{"t":["F32",[1],[0,4]]}', 4)
    yield "stricter_dtype_object", framed('{"t":{"dtype":{"F32":null},"shape":[1],"data_offsets":[0,4]}}', 4)
    yield "stricter_duplicate_name", framed("{" + one("t", "U8", [1], (0, 1)) + "," + one("t", "U8", [1], (0, 1)) + "}", 1)
    yield "bad_offset_gap", framed("{" + one("t", "F32", [1], (4, 8)) + "}", 8)
    yield "bad_offset_end_before_begin", framed("{" + one("a", "U8", [1], (0, 1)) + "," + one("b", "U8", [0], (1, 0)) + "}", 1)
    yield "bad_json_attack", framed("{" + ",".join(one("t%d" % i, "F32", [2, 2], (0, 16)) for i in range(10)) + "}", 16)
    yield "bad_overflow_elements", framed("{" + one("t", "F32", [2, 18446744073709551614], (0, 16)) + "}", 16)
    yield "bad_overflow_bits", framed("{" + one("t", "F32", [2, 9223372036854775807], (0, 16)) + "}", 16)
    yield "bad_misaligned_f4_scalar", framed("{" + one("t", "F4", [], (0, 1)) + "}", 1)
    yield "bad_misaligned_f6", framed("{" + one("t", "F6_E3M2", [3], (0, 3)) + "}", 3)
    yield "bad_invalid_info", framed("{" + one("t", "I32", [2, 2], (0, 4)) + "}", 4)
    yield "bad_trailing_data", framed("{" + one("t", "U8", [1], (0, 1)) + "}", 2)
    yield "bad_truncated_data", framed("{" + one("t", "U8", [4], (0, 4)) + "}", 3)


def main():
    os.makedirs(CORPUS, exist_ok=True)
    for name, content in list(valid_seeds()) + list(malformed_seeds()):
        with open(os.path.join(CORPUS, name + ".safetensors"), "wb") as f:
            f.write(content)
    return reference_codes(CORPUS, os.path.join(HERE, "corpus_codes.json"))


if __name__ == "__main__":
    sys.exit(main())
