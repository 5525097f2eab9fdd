"""The GGUF writer of peft_c against gguf-py, llama.cpp's own Python writer: byte-identical files.

Each case is written twice from one description: by gguf-py's GGUFWriter (the calls a converter
makes: add_key_value with a value type and sub type, add_custom_alignment, add_tensor with numpy
arrays or raw quantized bytes) and by GgufWriter through the test driver `gguf_write_driver` (built
from tests/interop/gguf_write_driver.cpp), which reads a JSON description derived from the same
calls with gguf-py's own rules (the array element type from sub_type, else from the first item; the
items of a nested array typed the same way). The files must be equal byte for byte: every metadata
value type, arrays of strings, nested and byte arrays, custom alignments, F32/F16/BF16/F64/integer
and Q8_0 tensors, scalars, zero-element tensors, no tensors, no metadata; tensors converted by the
writer from f32 on the way. The driver's layout (alignment, data start, tensor offsets) must be what
gguf-py's GGUFReader reads back.

Files in the wild are written by gguf-py: a file made by gguf-py (and the vocabulary files that
llama.cpp ships in models/, made by its converters) is read with GGUFReader, described, written
again by GgufWriter and compared byte for byte with the original.

Environment: PEFT_GGUF_PY, llama.cpp's gguf-py folder (the tests skip without it);
PEFT_GGUF_WRITE_DRIVER, the driver (default <repo>/build/tests/interop/gguf_write_driver).
"""

from __future__ import annotations

import json
import os
import pathlib
import struct
import subprocess
import sys

import numpy as np
import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
DRIVER = pathlib.Path(os.environ.get("PEFT_GGUF_WRITE_DRIVER")
                      or REPO / "build" / "tests" / "interop" / "gguf_write_driver")
GGUF_PY = os.environ.get("PEFT_GGUF_PY")

# gguf-py's GGUFValueType names -> the driver's (gguf_header.hpp's GgufValueType).
TYPE_NAMES = {"UINT8": "U8", "INT8": "I8", "UINT16": "U16", "INT16": "I16", "UINT32": "U32", "INT32": "I32",
              "FLOAT32": "F32", "BOOL": "BOOL", "STRING": "STRING", "ARRAY": "ARRAY", "UINT64": "U64",
              "INT64": "I64", "FLOAT64": "F64"}


@pytest.fixture(scope="session")
def gguf():
    if not GGUF_PY:
        pytest.skip("PEFT_GGUF_PY is not set: point it at llama.cpp's gguf-py folder "
                    "(vendor/llama.cpp/gguf-py of the llama-cpp-python source distribution)")
    if GGUF_PY not in sys.path:
        sys.path.insert(0, GGUF_PY)
    try:
        import gguf as module
    except ImportError as exc:
        pytest.skip(f"gguf-py at {GGUF_PY} cannot be imported: {exc}")
    folder = pathlib.Path(GGUF_PY).resolve()
    if folder not in pathlib.Path(module.__file__).resolve().parents:
        pytest.skip(f"the gguf module imported is {module.__file__}, not the one in PEFT_GGUF_PY={GGUF_PY}")
    return module


@pytest.fixture(scope="session")
def driver() -> pathlib.Path:
    if not DRIVER.exists():
        pytest.fail(f"gguf_write_driver not built at {DRIVER}: build target gguf_write_driver "
                    "or set PEFT_GGUF_WRITE_DRIVER", pytrace=False)
    return DRIVER


# ---- descriptions --------------------------------------------------------------------------------

def double_bits(value) -> int:
    return struct.unpack("<Q", struct.pack("<d", float(value)))[0]


def driver_value(gguf, vtype, value, sub_type=None):
    """The driver's JSON for a value that gguf-py packs with _pack_val(value, vtype, sub_type)."""
    T = gguf.GGUFValueType
    if vtype == T.STRING:
        return (value.encode("utf-8") if isinstance(value, str) else bytes(value)).hex()
    if vtype in (T.FLOAT32, T.FLOAT64):
        return double_bits(value)
    if vtype == T.BOOL:
        return bool(value)
    if vtype == T.ARRAY:
        if sub_type is not None:
            element = sub_type
        elif isinstance(value, bytes):
            element = T.UINT8
        else:
            element = T.get_type(value[0])
        return {"element_type": TYPE_NAMES[element.name],
                "items": [driver_value(gguf, element, item) for item in value]}
    return int(value)


class Case:
    """One file's content as gguf-py calls: metadata (key, vtype, value, sub_type) and tensors
    (name, array, raw_dtype); `source` maps a tensor name to the f32 array the driver converts."""

    def __init__(self):
        self.metadata = []
        self.tensors = []
        self.source = {}
        self.chunk = {}

    def kv(self, key, vtype, value, sub_type=None):
        self.metadata.append((key, vtype, value, sub_type))
        return self

    def tensor(self, name, array, raw_dtype=None, source=None, chunk=None):
        self.tensors.append((name, array, raw_dtype))
        if source is not None:
            self.source[name] = source
        if chunk is not None:
            self.chunk[name] = chunk
        return self


def write_with_gguf_py(gguf, case: Case, path: pathlib.Path):
    writer = gguf.GGUFWriter(str(path), arch="")  # an empty arch adds no general.architecture
    for key, vtype, value, sub_type in case.metadata:
        if key == "general.alignment":
            writer.add_custom_alignment(value)
        else:
            writer.add_key_value(key, value, vtype, sub_type=sub_type)
    for name, array, raw_dtype in case.tensors:
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def ggml_type_of(gguf, array, raw_dtype):
    if raw_dtype is not None:
        return int(raw_dtype)
    Q = gguf.GGMLQuantizationType
    return int({np.float32: Q.F32, np.float16: Q.F16, np.float64: Q.F64, np.int8: Q.I8, np.int16: Q.I16,
                np.int32: Q.I32, np.int64: Q.I64}[array.dtype.type])


def write_with_driver(gguf, driver, case: Case, folder: pathlib.Path, name: str) -> dict:
    """Writes the case with GgufWriter; returns the driver's layout."""
    spec = {"output": f"{name}.gguf", "layout": f"{name}.layout.json", "metadata": [], "tensors": []}
    for key, vtype, value, sub_type in case.metadata:
        spec["metadata"].append({"key": key, "type": TYPE_NAMES[vtype.name],
                                 "value": driver_value(gguf, vtype, value, sub_type)})
    for index, (tname, array, raw_dtype) in enumerate(case.tensors):
        shape = list(array.shape)
        if raw_dtype is not None and array.dtype == np.uint8:
            shape = list(gguf.quants.quant_shape_from_byte_shape(shape, raw_dtype))
        data = folder / f"{name}.{index}.bin"
        entry = {"name": tname, "type": ggml_type_of(gguf, array, raw_dtype), "shape": shape, "data": data.name}
        if tname in case.source:
            data.write_bytes(np.ascontiguousarray(case.source[tname], dtype=np.float32).tobytes())
            entry["source_dtype"] = "F32"
        else:
            data.write_bytes(np.ascontiguousarray(array).tobytes())
        if tname in case.chunk:
            entry["chunk"] = case.chunk[tname]
        spec["tensors"].append(entry)
    return run_driver(driver, folder, name, spec)


def run_driver(driver, folder: pathlib.Path, name: str, spec: dict) -> dict:
    spec_path = folder / f"{name}.json"
    spec_path.write_text(json.dumps(spec))
    result = subprocess.run([str(driver), str(spec_path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return json.loads((folder / spec["layout"]).read_text())


def first_difference(a: bytes, b: bytes) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first difference at byte {i}: {x:#04x} != {y:#04x}"
    return f"sizes differ: {len(a)} != {len(b)}"


def assert_same_files(expected: pathlib.Path, actual: pathlib.Path):
    a, b = expected.read_bytes(), actual.read_bytes()
    assert a == b, first_difference(a, b)


def check_layout_with_reader(reader, layout: dict, written: pathlib.Path):
    """The driver's layout of `written` against what GGUFReader read."""
    assert layout["alignment"] == reader.alignment
    assert layout["data_start"] == reader.data_offset
    assert layout["data_start"] + layout["data_size"] == written.stat().st_size
    assert [t["name"] for t in layout["tensors"]] == [t.name for t in reader.tensors]
    for mine, theirs in zip(layout["tensors"], reader.tensors):
        assert layout["data_start"] + mine["begin"] == theirs.data_offset, mine["name"]
        assert mine["end"] - mine["begin"] == theirs.n_bytes, mine["name"]


def compare(gguf, driver, tmp_path, case: Case):
    expected = tmp_path / "gguf_py.gguf"
    write_with_gguf_py(gguf, case, expected)
    layout = write_with_driver(gguf, driver, case, tmp_path, "peft_c")
    assert_same_files(expected, tmp_path / "peft_c.gguf")
    check_layout_with_reader(gguf.GGUFReader(str(expected)), layout, tmp_path / "peft_c.gguf")


# ---- cases ---------------------------------------------------------------------------------------

def every_value_type(gguf) -> Case:
    T = gguf.GGUFValueType
    return (Case()
            .kv("general.architecture", T.STRING, "llama")
            .kv("u8", T.UINT8, 255).kv("i8", T.INT8, -128)
            .kv("u16", T.UINT16, 65535).kv("i16", T.INT16, -32768)
            .kv("u32", T.UINT32, 4294967295).kv("i32", T.INT32, -2147483648)
            .kv("u64", T.UINT64, 2**64 - 1).kv("i64", T.INT64, -2**63)
            .kv("f32", T.FLOAT32, 0.1).kv("f32.inf", T.FLOAT32, float("-inf")).kv("f32.nan", T.FLOAT32, float("nan"))
            .kv("f64", T.FLOAT64, 1 / 3).kv("f64.tiny", T.FLOAT64, 5e-324)
            .kv("bool.true", T.BOOL, True).kv("bool.false", T.BOOL, False)
            .kv("string", T.STRING, "héllo wörld ✓ 😀").kv("string.empty", T.STRING, "")
            .kv("string.bytes", T.STRING, b"\xff\x00raw")
            .kv("tokens", T.ARRAY, ["<s>", "</s>", "", "▁the", "\n"], T.STRING)
            .kv("scores", T.ARRAY, [0.0, -1.5, 3.25e-8], T.FLOAT32)
            .kv("types", T.ARRAY, [1, 2, 3, -4], T.INT32)
            .kv("u8s", T.ARRAY, [0, 1, 255], T.UINT8).kv("i8s", T.ARRAY, [-1, 1], T.INT8)
            .kv("u16s", T.ARRAY, [7, 65535], T.UINT16).kv("i16s", T.ARRAY, [-7], T.INT16)
            .kv("u32s", T.ARRAY, [2**32 - 1], T.UINT32).kv("u64s", T.ARRAY, [2**64 - 1, 0], T.UINT64)
            .kv("i64s", T.ARRAY, [-2**63, 2**63 - 1], T.INT64).kv("f64s", T.ARRAY, [1e300, -0.0], T.FLOAT64)
            .kv("bools", T.ARRAY, [True, False, True], T.BOOL)
            .kv("inferred.ints", T.ARRAY, [5, 6])              # INT32, as gguf-py infers
            .kv("inferred.floats", T.ARRAY, [0.5, 2.0])        # FLOAT32
            .kv("inferred.strings", T.ARRAY, ["a", "b"])
            .kv("bytes", T.ARRAY, b"\x00\x01\xfe")             # an array of UINT8
            .kv("nested", T.ARRAY, [[1, 2], [3]])              # arrays of INT32 arrays
            .kv("nested.strings", T.ARRAY, [["x", "yz"], ["✓"]], T.ARRAY)
            .kv("nested.mixed", T.ARRAY, [[True], [1.5, 2.5], b"\x07", ["s"]], T.ARRAY)
            .kv("nested.deep", T.ARRAY, [[[1], [2, 3]], [[4]]]))


def test_every_value_type(gguf, driver, tmp_path):
    compare(gguf, driver, tmp_path, every_value_type(gguf))


def test_nothing(gguf, driver, tmp_path):
    compare(gguf, driver, tmp_path, Case())


def test_metadata_only(gguf, driver, tmp_path):
    T = gguf.GGUFValueType
    compare(gguf, driver, tmp_path, Case().kv("general.name", T.STRING, "x"))


def tensors_case(gguf, rng) -> Case:
    Q = gguf.GGMLQuantizationType
    f32 = rng.standard_normal((3, 5)).astype(np.float32)
    q_source = rng.standard_normal((4, 64)).astype(np.float32)
    bf16_source = rng.standard_normal((2, 7)).astype(np.float32)
    return (Case()
            .tensor("blk.0.attn_q.weight", f32)
            .tensor("f16", rng.standard_normal((4, 3)).astype(np.float16))
            .tensor("bf16", gguf.quants.quantize(bf16_source, Q.BF16), raw_dtype=Q.BF16)
            .tensor("q8_0", gguf.quants.quantize(q_source, Q.Q8_0), raw_dtype=Q.Q8_0)
            .tensor("f64", rng.standard_normal(3))
            .tensor("i8", np.arange(-5, 6, dtype=np.int8))
            .tensor("i16", np.arange(6, dtype=np.int16).reshape(2, 3))
            .tensor("i32", np.arange(7, dtype=np.int32))
            .tensor("i64", np.arange(2, dtype=np.int64))
            .tensor("scalar", np.array(2.5, dtype=np.float32))
            .tensor("empty", np.zeros((0, 4), dtype=np.float32))
            .tensor("ones", np.ones((1, 1, 5), dtype=np.float32))
            .tensor("four.dims", rng.standard_normal((2, 1, 3, 2)).astype(np.float32))
            .tensor("after.empty", np.zeros((1,), dtype=np.int8)))


@pytest.mark.parametrize("alignment", [None, 1, 8, 64, 256])
def test_tensors_and_alignment(gguf, driver, tmp_path, alignment):
    T = gguf.GGUFValueType
    case = tensors_case(gguf, np.random.default_rng(1))
    case.kv("general.architecture", T.STRING, "llama")
    if alignment is not None:
        case.kv("general.alignment", T.UINT32, alignment)
    case.kv("general.name", T.STRING, "tiny")
    compare(gguf, driver, tmp_path, case)


def test_tensors_without_metadata(gguf, driver, tmp_path):
    compare(gguf, driver, tmp_path, tensors_case(gguf, np.random.default_rng(2)))


def test_converted_on_the_way(gguf, driver, tmp_path):
    """F32 data that the writer converts (in odd chunks) against gguf-py given converted arrays."""
    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(3)
    source = (rng.standard_normal((3, 1000)) * np.logspace(-8, 3, 1000)).astype(np.float32)
    source[0, :4] = [0.0, -0.0, 65504.0, 1e-7]
    case = (Case()
            .tensor("to_f16", source.astype(np.float16), source=source, chunk=4 * 37)
            .tensor("to_bf16", gguf.quants.quantize(source, Q.BF16), raw_dtype=Q.BF16, source=source)
            .tensor("to_f64", source.astype(np.float64), source=source, chunk=4 * 1001)
            .tensor("same_f32", source, source=source)
            .tensor("raw_in_odd_chunks", rng.integers(-128, 127, 1001).astype(np.int8), chunk=7))
    compare(gguf, driver, tmp_path, case)


# ---- copies of gguf-py files ---------------------------------------------------------------------

def describe_parts(gguf, parts, index, vtype):
    """The driver's JSON of a value from GGUFReader's parts, starting at parts[index]; and the index
    after it. (The reader flattens nested arrays in `data`; its `parts` keep the structure.)"""
    T = gguf.GGUFValueType
    if vtype == T.STRING:
        return bytes(parts[index + 1]).hex(), index + 2
    if vtype == T.ARRAY:
        element = T(int(parts[index][0]))
        count = int(parts[index + 1][0])
        index += 2
        items = []
        for _ in range(count):
            item, index = describe_parts(gguf, parts, index, element)
            items.append(item)
        return {"element_type": TYPE_NAMES[element.name], "items": items}, index
    scalar = parts[index][0]
    if vtype in (T.FLOAT32, T.FLOAT64):
        return double_bits(scalar), index + 1
    if vtype == T.BOOL:
        return bool(scalar), index + 1
    return int(scalar), index + 1


def copy_with_driver(gguf, driver, reader, folder: pathlib.Path) -> pathlib.Path:
    """Writes what GGUFReader read from a file again with GgufWriter; returns the copy."""
    spec = {"output": "copy.gguf", "layout": "copy.layout.json", "metadata": [], "tensors": []}
    for field in reader.fields.values():
        if field.offset < 24 and field.name.startswith("GGUF."):  # the reader's own preamble fields
            continue
        vtype = field.types[0]
        value, end = describe_parts(gguf, field.parts, 3, vtype)  # after key length, key, value type
        assert end == len(field.parts), field.name
        spec["metadata"].append({"key": field.name, "type": TYPE_NAMES[vtype.name], "value": value})
    for index, tensor in enumerate(reader.tensors):
        data = folder / f"copy.{index}.bin"
        data.write_bytes(reader.data[tensor.data_offset:tensor.data_offset + tensor.n_bytes].tobytes())
        spec["tensors"].append({"name": tensor.name, "type": int(tensor.tensor_type),
                                "shape": [int(d) for d in reversed(tensor.shape.tolist())], "data": data.name})
    layout = run_driver(driver, folder, "copy", spec)
    check_layout_with_reader(reader, layout, folder / "copy.gguf")
    return folder / "copy.gguf"


def test_copy_of_a_gguf_py_model(gguf, driver, tmp_path):
    """A small model as a converter writes one (gguf-py's add_* helpers), copied byte for byte."""
    Q = gguf.GGMLQuantizationType
    rng = np.random.default_rng(4)
    path = tmp_path / "model.gguf"
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_name("tiny")
    writer.add_context_length(128)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_head_count(4)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_Q8_0))
    writer.add_tokenizer_model("llama")
    writer.add_token_list([f"tok{i}" for i in range(40)] + ["▁", "✓"])
    writer.add_token_scores([float(-i) for i in range(42)])
    writer.add_token_types([1] * 42)
    writer.add_bos_token_id(1)
    writer.add_add_bos_token(True)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_tensor("token_embd.weight", gguf.quants.quantize(rng.standard_normal((42, 64)).astype(np.float32),
                                                                 Q.Q8_0), raw_dtype=Q.Q8_0)
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", rng.standard_normal((64, 64)).astype(np.float16))
    writer.add_tensor("output.weight", gguf.quants.quantize(rng.standard_normal((42, 64)).astype(np.float32),
                                                             Q.BF16), raw_dtype=Q.BF16)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_same_files(path, copy_with_driver(gguf, driver, gguf.GGUFReader(str(path)), tmp_path))


def gguf_version(path: pathlib.Path) -> int:
    with open(path, "rb") as f:
        return struct.unpack("<4sI", f.read(8))[1]


def vocab_files():
    """llama.cpp's vocabulary files up to 2 MB, and every version-2 file: GGUFReader takes seconds per
    megabyte of strings, and the larger files hold nothing the smaller ones do not."""
    models = pathlib.Path(GGUF_PY).parent / "models" if GGUF_PY else None
    files = sorted(models.glob("ggml-vocab-*.gguf")) if models and models.is_dir() else []
    files = [p for p in files if p.stat().st_size <= 2_000_000 or gguf_version(p) == 2]
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(
            reason="no ggml-vocab-*.gguf next to PEFT_GGUF_PY (llama.cpp's models/ folder)"), id="absent")]
    return [pytest.param(p, id=p.name) for p in files]


def as_the_writer_writes(original: bytes, alignment: int) -> bytes:
    """A vocabulary-only file as GgufWriter writes it. The converters write those with
    write_header_to_file + write_kv_data_to_file alone (conversion/base.py, write_vocab): no
    tensor-info block and no padding after the metadata, so the file may end unaligned; GgufWriter,
    like gguf.cpp and gguf-py's full write, always pads the header to the alignment. Version 2 files
    (the same layout) are written as version 3."""
    version, tensor_count = struct.unpack_from("<IQ", original, 4)
    assert version in (2, 3) and tensor_count == 0
    expected = original[:4] + struct.pack("<I", 3) + original[8:]
    return expected + bytes(-len(expected) % alignment)


@pytest.mark.parametrize("vocab_file", vocab_files())
def test_copy_of_llama_cpp_vocab_files(gguf, driver, tmp_path, vocab_file):
    """The vocabulary files llama.cpp ships (written by its converters through gguf-py): large string
    arrays, scores, merges, token types, copied byte for byte (but for the padding at the end and
    the version, see as_the_writer_writes)."""
    reader = gguf.GGUFReader(str(vocab_file))
    copy = copy_with_driver(gguf, driver, reader, tmp_path)
    expected = as_the_writer_writes(vocab_file.read_bytes(), reader.alignment)
    actual = copy.read_bytes()
    assert actual == expected, first_difference(expected, actual)
