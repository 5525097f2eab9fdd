"""peft_c's writer against the real safetensors package, byte for byte.

Random tensor sets (every dtype torch or numpy can make, scalars, zero-size tensors, names needing
JSON escapes or holding non-ASCII, metadata absent, empty, with one key or several) are saved with
`safetensors.torch.save` / `safetensors.numpy.save` and written again by peft_c, both through the C API
(ctypes, streaming every tensor in whole buffers, in chunks or from a callback) and through
`peftc convert` of the Python-written file. With at most one metadata key the files must be identical;
with several, the reference orders keys randomly, so the files must be identical up to that order, and
peft_c's keys must come sorted by bytes.

Environment: PEFT_LIB (or PEFT_C_LIB) = libpeft_c.so, PEFTC = peftc. PEFT_WRITER_SEED varies the cases
(default fixed); PEFT_WRITER_CASES sets how many (default 1200).
"""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import random
import subprocess
import tempfile

import numpy as np
import pytest
import torch
import safetensors.numpy as st_numpy
import safetensors.torch as st_torch

REPO = pathlib.Path(__file__).resolve().parents[2]
SEED = int(os.environ.get("PEFT_WRITER_SEED", "20240607"))
CASES = int(os.environ.get("PEFT_WRITER_CASES", "1200"))


def _library_path() -> pathlib.Path:
    for variable in ("PEFT_LIB", "PEFT_C_LIB"):
        if os.environ.get(variable):
            return pathlib.Path(os.environ[variable])
    return REPO / "build" / "libpeft_c.so"


def _peftc_path() -> pathlib.Path:
    return pathlib.Path(os.environ.get("PEFTC") or REPO / "build" / "peftc")


# ---- the C API through ctypes ---------------------------------------------------------------------

SOURCE_FN = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_uint64)


class PeftError(Exception):
    def __init__(self, code_name: str, message: str):
        super().__init__(f"{code_name}: {message}")
        self.code_name = code_name


class CApi:
    """The writer functions of peft_c.h, declared for ctypes."""

    def __init__(self, path: pathlib.Path):
        lib = ctypes.CDLL(str(path))
        P, E = ctypes.c_void_p, ctypes.c_void_p
        sig = {
            "peft_error_code": (ctypes.c_int32, [E]),
            "peft_error_message": (ctypes.c_char_p, [E]),
            "peft_error_code_name": (ctypes.c_char_p, [ctypes.c_int32]),
            "peft_error_free": (None, [E]),
            "peft_dtype_from_name": (ctypes.c_int32, [ctypes.c_char_p]),
            "peft_writer_new": (E, [ctypes.c_char_p, ctypes.POINTER(P)]),
            "peft_writer_free": (None, [P]),
            "peft_writer_add_tensor": (E, [P, ctypes.c_char_p, ctypes.c_int32, ctypes.POINTER(ctypes.c_uint64),
                                           ctypes.c_size_t]),
            "peft_writer_set_metadata_present": (E, [P, ctypes.c_int32]),
            "peft_writer_set_metadata": (E, [P, ctypes.c_char_p, ctypes.c_char_p]),
            "peft_writer_start": (E, [P]),
            "peft_writer_tensor_count": (ctypes.c_size_t, [P]),
            "peft_writer_tensor_name": (ctypes.c_char_p, [P, ctypes.c_size_t]),
            "peft_writer_tensor_declaration": (ctypes.c_size_t, [P, ctypes.c_size_t]),
            "peft_writer_begin_tensor": (E, [P, ctypes.c_char_p, ctypes.c_int32]),
            "peft_writer_write": (E, [P, ctypes.c_void_p, ctypes.c_uint64]),
            "peft_writer_write_tensor": (E, [P, ctypes.c_char_p, ctypes.c_int32, ctypes.c_void_p, ctypes.c_uint64]),
            "peft_writer_write_from_callback": (E, [P, ctypes.c_char_p, ctypes.c_int32, SOURCE_FN, ctypes.c_void_p]),
            "peft_writer_finish": (E, [P]),
        }
        for name, (restype, argtypes) in sig.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        self.lib = lib

    def check(self, err):
        if err:
            code = self.lib.peft_error_code(err)
            message = self.lib.peft_error_message(err).decode("utf-8", "replace")
            name = self.lib.peft_error_code_name(code).decode()
            self.lib.peft_error_free(err)
            raise PeftError(name, message)

    def dtype(self, name: str) -> int:
        value = self.lib.peft_dtype_from_name(name.encode())
        assert value >= 0, name
        return value


def write_with_c_api(api: CApi, path: str, tensors: list, metadata, rng: random.Random, convert_from=None):
    """Writes `tensors` = [(name, dtype_name, header_shape, raw_bytes)] declared in a random order.

    convert_from maps a tensor name to (source dtype name, source bytes) to stream instead, which the
    writer converts to the declared dtype."""
    lib = api.lib
    writer = ctypes.c_void_p()
    api.check(lib.peft_writer_new(path.encode(), ctypes.byref(writer)))
    try:
        order = list(range(len(tensors)))
        rng.shuffle(order)
        for i in order:
            name, dtype, shape, _ = tensors[i]
            dims = (ctypes.c_uint64 * max(1, len(shape)))(*shape)
            api.check(lib.peft_writer_add_tensor(writer, name.encode(), api.dtype(dtype), dims, len(shape)))
        if metadata is not None:
            api.check(lib.peft_writer_set_metadata_present(writer, 1))
            for key, value in metadata.items():
                api.check(lib.peft_writer_set_metadata(writer, key.encode(), value.encode()))
        api.check(lib.peft_writer_start(writer))
        assert lib.peft_writer_tensor_count(writer) == len(tensors)
        by_name = {t[0]: t for t in tensors}
        for position in range(len(tensors)):
            name = lib.peft_writer_tensor_name(writer, position).decode()
            declared = order[lib.peft_writer_tensor_declaration(writer, position)]
            assert tensors[declared][0] == name
            _, dtype, _, data = by_name[name]
            src_dtype = dtype
            if convert_from and name in convert_from:
                src_dtype, data = convert_from[name]
            unit = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}.get(src_dtype, 1) if src_dtype != dtype else 1
            mode = rng.choice(("whole", "chunks", "callback"))
            buffer = ctypes.create_string_buffer(data, len(data)) if data else None
            if mode == "whole":
                api.check(lib.peft_writer_write_tensor(writer, name.encode(), api.dtype(src_dtype), buffer, len(data)))
            elif mode == "chunks":
                api.check(lib.peft_writer_begin_tensor(writer, name.encode(), api.dtype(src_dtype)))
                done = 0
                while done < len(data):
                    step = min(len(data) - done, rng.randint(1, 9) * unit)
                    api.check(lib.peft_writer_write(writer, ctypes.byref(buffer, done), step))
                    done += step
            else:
                def fill(_user, offset, dst, nbytes, data=data):
                    ctypes.memmove(dst, data[offset:offset + nbytes], nbytes)
                    return 0

                api.check(lib.peft_writer_write_from_callback(writer, name.encode(), api.dtype(src_dtype),
                                                              SOURCE_FN(fill), None))
        api.check(lib.peft_writer_finish(writer))
    finally:
        lib.peft_writer_free(writer)


# ---- random tensor sets ---------------------------------------------------------------------------

TORCH_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64, "BOOL": torch.bool, "C64": torch.complex64,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz, "F8_E5M2FNUZ": torch.float8_e5m2fnuz, "F4": torch.float4_e2m1fn_x2,
}
NUMPY_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
    "I8": np.int8, "U8": np.uint8, "U16": np.uint16, "U32": np.uint32, "U64": np.uint64, "BOOL": np.bool_,
    "C64": np.complex64,
}
ITEM_BYTES = {"F64": 8, "I64": 8, "U64": 8, "C64": 8, "F32": 4, "I32": 4, "U32": 4,
              "F16": 2, "BF16": 2, "I16": 2, "U16": 2}

# Pieces of names and metadata: plain words, JSON escapes (quote, backslash, the short escapes, other
# control characters as \u00xx), 0x7F and '/' (written raw), and non-ASCII of 2, 3 and 4 bytes.
PIECES = ["model", "layers", "0", "17", "weight", "bias", "lora_A", ".", "_", "-", " ", "\"", "\\", "/",
          "\b", "\t", "\n", "\f", "\r", "\x01", "\x1b", "\x1f", "\x7f", "é", "ß", "中文", "😀", "\U0010FFFF",
          "\u2028", "\ufeff", "A", "Z", "a", "z", "~", "{", "}", ":", ","]


def random_text(rng: random.Random, max_pieces: int = 5) -> str:
    return "".join(rng.choice(PIECES) for _ in range(rng.randint(1, max_pieces)))


def random_shape(rng: random.Random, dtype: str):
    rank = rng.choice((0, 1, 1, 2, 2, 3))
    if dtype == "F4":
        rank = max(rank, 1)  # torch's float4 pairs need a last dimension
    dims = [rng.choice((0, 1, 1, 2, 3, 5, 8)) if rng.random() < 0.1 else rng.randint(1, 6) for _ in range(rank)]
    return dims


def random_tensor(rng: random.Random, dtype: str, shape):
    torch_dtype = TORCH_DTYPES[dtype]
    count = int(np.prod(shape)) if shape else 1
    if count == 0:
        return torch.empty(shape, dtype=torch_dtype)
    if dtype == "BOOL":
        return torch.tensor([rng.random() < 0.5 for _ in range(count)], dtype=torch.bool).reshape(shape)
    nbytes = count * ITEM_BYTES.get(dtype, 1)
    raw = torch.tensor(list(rng.randbytes(nbytes)), dtype=torch.uint8)
    return raw.view(torch_dtype).reshape(shape)


def tensor_bytes(t: torch.Tensor) -> bytes:
    if t.numel() == 0:
        return b""
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def random_case(rng: random.Random):
    count = rng.choice((0, 1, 1, 2, 2, 3, 3, 4, 5, 6, 8))
    names = set()
    while len(names) < count:
        name = "" if rng.random() < 0.01 else random_text(rng)
        if name != "__metadata__":
            names.add(name)
    tensors = {}
    for name in sorted(names):
        dtype = rng.choice(list(TORCH_DTYPES))
        tensors[name] = (dtype, random_tensor(rng, dtype, random_shape(rng, dtype)))
    roll = rng.random()
    if roll < 0.25:
        metadata = None
    elif roll < 0.35:
        metadata = {}
    elif roll < 0.75:
        metadata = {random_text(rng): random_text(rng, 8)}
    else:
        metadata = {random_text(rng): random_text(rng, 8) for _ in range(rng.randint(2, 6))}
    return tensors, metadata


def header_of(data: bytes):
    n = int.from_bytes(data[:8], "little")
    return n, data[8:8 + n]


# The reference's one known wrong output: no tensors and empty metadata give the invalid JSON
# `{},"__metadata__":{}}` (serde's map state, see safetensors#466). peft_c writes the valid file.
REFERENCE_EMPTY_BUG = b'{},"__metadata__":{}}'


def assert_same_file(ours: bytes, reference: bytes, metadata, label: str):
    if header_of(reference)[1].rstrip(b" ") == REFERENCE_EMPTY_BUG:
        assert metadata == {}, label
        assert ours == (24).to_bytes(8, "little") + b'{"__metadata__":{}}' + b" " * 5, label
        return
    if metadata is None or len(metadata) <= 1:
        assert ours == reference, f"{label}: bytes differ\nours: {ours[:300]!r}\nref:  {reference[:300]!r}"
        return
    # Several keys: the reference's order is random. Same length, same data, same JSON; ours sorted.
    n_ours, h_ours = header_of(ours)
    n_ref, h_ref = header_of(reference)
    assert n_ours == n_ref and len(ours) == len(reference), label
    assert ours[8 + n_ours:] == reference[8 + n_ref:], f"{label}: data differ"
    parsed_ours, parsed_ref = json.loads(h_ours), json.loads(h_ref)
    assert parsed_ours == parsed_ref, label
    assert list(parsed_ours) == list(parsed_ref), f"{label}: tensor order differs"
    keys = list(parsed_ours["__metadata__"])
    assert keys == sorted(keys, key=lambda k: k.encode("utf-8")), f"{label}: metadata keys not sorted"


def framework_save(rng: random.Random, tensors: dict, metadata):
    """Saves with safetensors.numpy when every dtype has a numpy twin (at random), else with torch."""
    if all(dtype in NUMPY_DTYPES for dtype, _ in tensors.values()) and rng.random() < 0.3:
        arrays = {name: t.numpy() if t.numel() else np.empty(tuple(t.shape), NUMPY_DTYPES[dtype])
                  for name, (dtype, t) in tensors.items()}
        return st_numpy.save(arrays, metadata=metadata), "numpy"
    return st_torch.save({name: t for name, (_, t) in tensors.items()}, metadata=metadata), "torch"


def header_shape(dtype: str, t: torch.Tensor):
    shape = list(t.shape)
    if dtype == "F4":  # the header counts float4 elements, two per torch element
        shape[-1] *= 2
    return shape


# ---- the tests ------------------------------------------------------------------------------------

@pytest.fixture()
def scratch(tmp_path):
    """A scratch folder in RAM when the machine has /dev/shm: every finish() fsyncs the file and its
    folder, which costs milliseconds on a disk and would dominate a thousand cases."""
    shm = pathlib.Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        folder = pathlib.Path(tempfile.mkdtemp(prefix="peft_writer_", dir=shm))
        yield folder
        for entry in folder.iterdir():
            entry.unlink()
        folder.rmdir()
    else:
        yield tmp_path


@pytest.fixture(scope="module")
def api():
    path = _library_path()
    if not path.exists():
        pytest.fail(f"libpeft_c not found at {path}: build it or set PEFT_LIB", pytrace=False)
    return CApi(path)


@pytest.fixture(scope="module")
def peftc():
    path = _peftc_path()
    if not path.exists():
        pytest.fail(f"peftc not found at {path}: build it or set PEFTC", pytrace=False)
    return path


def test_random_tensor_sets_are_byte_identical(api, peftc, scratch):
    tmp_path = scratch
    rng = random.Random(SEED)
    counts = {"cases": 0, "identical": 0, "multi_key": 0, "numpy": 0, "tensors": 0, "reference_bug": 0}
    seen_dtypes = set()
    batch = []  # Python-written files, converted by peftc in one pass at the end of each batch

    def flush_batch():
        if not batch:
            return
        # One peftc process per file; a shell loop keeps the process start cost low.
        script = "\n".join(f'"$0" convert "{src}" "{dst}" >/dev/null || echo "FAILED {src}"'
                           for src, dst, _, _ in batch)
        result = subprocess.run(["bash", "-c", script, str(peftc)], capture_output=True, text=True, timeout=300)
        assert "FAILED" not in result.stdout, result.stdout + result.stderr
        for src, dst, metadata, label in batch:
            reference = pathlib.Path(src).read_bytes()
            assert_same_file(pathlib.Path(dst).read_bytes(), reference, metadata, label + " (peftc convert)")
        batch.clear()

    for case in range(CASES):
        tensors, metadata = random_case(rng)
        label = f"case {case} (seed {SEED})"
        reference, framework = framework_save(rng, tensors, metadata)
        ours_path = tmp_path / f"ours_{case % 50}.safetensors"
        entries = [(name, dtype, header_shape(dtype, t), tensor_bytes(t)) for name, (dtype, t) in tensors.items()]
        write_with_c_api(api, str(ours_path), entries, metadata, rng)
        assert_same_file(ours_path.read_bytes(), reference, metadata, label)
        if header_of(reference)[1].rstrip(b" ") != REFERENCE_EMPTY_BUG:  # unreadable, so not converted
            src = tmp_path / f"py_{case % 50}.safetensors"
            src.write_bytes(reference)
            batch.append((str(src), str(tmp_path / f"cv_{case % 50}.safetensors"), metadata, label))
        if len(batch) == 50 or case % 50 == 49:
            flush_batch()
        counts["cases"] += 1
        counts["tensors"] += len(tensors)
        counts["multi_key"] += metadata is not None and len(metadata) > 1
        counts["identical"] += metadata is None or len(metadata) <= 1
        counts["numpy"] += framework == "numpy"
        counts["reference_bug"] += header_of(reference)[1].rstrip(b" ") == REFERENCE_EMPTY_BUG
        seen_dtypes.update(dtype for dtype, _ in tensors.values())
    flush_batch()
    print(f"\nwriter interop: {counts}, dtypes: {sorted(seen_dtypes)}")
    assert counts["cases"] >= 1000 or CASES < 1000
    assert seen_dtypes == set(TORCH_DTYPES)


def test_conversion_while_writing_matches_torch(api, scratch):
    tmp_path = scratch
    """Streaming f64/f32/f16/bf16 bytes into a tensor declared in another float dtype gives what
    torch's .to(dtype) then save_file gives."""
    rng = random.Random(SEED + 1)
    floats = ["F64", "F32", "F16", "BF16"]
    nan_differences = [0]
    specials = [0.0, -0.0, float("inf"), float("-inf"), float("nan"), 65504.0, 65520.0, 1e-8, 3.4e38, 1e-45,
                1.0 + 2 ** -8, 1.0 + 2 ** -9, 1.0 + 3 * 2 ** -9]
    for case in range(200):
        tensors, sources = {}, {}
        for k in range(rng.randint(1, 4)):
            src_dtype, dst_dtype = rng.choice(floats), rng.choice(floats)
            shape = [rng.randint(1, 40)] if rng.random() < 0.8 else []
            values = torch.tensor([rng.choice(specials) if rng.random() < 0.2 else rng.gauss(0, 10 ** rng.randint(-6, 6))
                                   for _ in range(int(np.prod(shape)) if shape else 1)], dtype=torch.float64)
            src = values.to(TORCH_DTYPES[src_dtype]).reshape(shape)
            name = f"t{k}"
            tensors[name] = (dst_dtype, src.to(TORCH_DTYPES[dst_dtype]))
            sources[name] = (src_dtype, tensor_bytes(src))
        reference = st_torch.save({n: t for n, (_, t) in tensors.items()}, metadata={"format": "pt"})
        path = tmp_path / "converted.safetensors"
        entries = [(n, d, list(t.shape), tensor_bytes(t)) for n, (d, t) in tensors.items()]
        write_with_c_api(api, str(path), entries, {"format": "pt"}, rng, convert_from=sources)
        ours = path.read_bytes()
        label = f"conversion case {case}: {[(n, sources[n][0], d) for n, (d, _) in tensors.items()]}"
        assert header_of(ours) == header_of(reference), label
        if ours != reference:
            # Only NaN encodings may differ (sign and payload of a converted NaN are not part of the
            # contract); every other value must be bit-identical.
            mine, theirs = st_torch.load(ours), st_torch.load(reference)
            for name in theirs:
                a, b = mine[name].to(torch.float64), theirs[name].to(torch.float64)
                assert torch.equal(a.isnan(), b.isnan()), label
                keep = ~b.isnan()
                assert torch.equal(a[keep], b[keep]), label
                raw_a = mine[name].reshape(-1)[keep.reshape(-1)].contiguous().view(torch.uint8)
                raw_b = theirs[name].reshape(-1)[keep.reshape(-1)].contiguous().view(torch.uint8)
                assert torch.equal(raw_a, raw_b), label
            nan_differences[0] += 1


    if nan_differences[0]:
        print(f"\n{nan_differences[0]} conversion case(s) differ from torch only in NaN encodings")


def test_refusals_match_the_reference(api, tmp_path):
    """Sizes that do not match: the reference's serialize fails with TensorInvalidInfo, and peft_c with
    TENSOR_INVALID_INFO. Where the reference writes an unreadable file (a tensor named __metadata__,
    safetensors#849), peft_c refuses; an odd F4 count, which torch cannot even express, is
    MISALIGNED_SLICE as in the reference's validate()."""
    from safetensors import TensorSpec, serialize

    buffer = ctypes.create_string_buffer(8)
    with pytest.raises(Exception, match="invalid shape, data type, or offset"):
        serialize({"x": TensorSpec(dtype="float32", shape=[2], data_ptr=ctypes.addressof(buffer), data_len=4)}, None)
    reserved = st_torch.save({"__metadata__": torch.zeros(1)})
    with pytest.raises(Exception):
        st_torch.load(reserved)

    lib = api.lib
    writer = ctypes.c_void_p()
    api.check(lib.peft_writer_new(str(tmp_path / "x.safetensors").encode(), ctypes.byref(writer)))
    try:
        two = (ctypes.c_uint64 * 1)(2)
        three = (ctypes.c_uint64 * 1)(3)
        cases = [
            (lambda: lib.peft_writer_add_tensor(writer, b"odd", api.dtype("F4"), three, 1), "MISALIGNED_SLICE"),
            (lambda: lib.peft_writer_add_tensor(writer, b"__metadata__", api.dtype("F32"), two, 1), "INVALID_ARGUMENT"),
            (lambda: lib.peft_writer_add_tensor(writer, b"\xff", api.dtype("F32"), two, 1), "INVALID_ARGUMENT"),
        ]
        for call, code in cases:
            with pytest.raises(PeftError) as info:
                api.check(call())
            assert info.value.code_name == code
        api.check(lib.peft_writer_add_tensor(writer, b"x", api.dtype("F32"), two, 1))
        with pytest.raises(PeftError) as info:
            api.check(lib.peft_writer_write_tensor(writer, b"x", api.dtype("F32"), buffer, 4))
        assert info.value.code_name == "TENSOR_INVALID_INFO"
        assert '"x"' in str(info.value)
    finally:
        lib.peft_writer_free(writer)
    assert list(tmp_path.iterdir()) == []


def _fixture_and_corpus_files():
    fixtures = pathlib.Path(os.environ.get("PEFT_TEST_DATA") or REPO / "tests" / "fixtures") / "safetensors"
    corpus = pathlib.Path(os.environ.get("PEFT_CORPUS") or REPO.parent / "shared" / "corpus" / "real")
    files = sorted(fixtures.glob("*.safetensors")) + (sorted(corpus.rglob("*.safetensors")) if corpus.is_dir() else [])
    return [pytest.param(f, id=f.name if f.parent == fixtures else str(f.relative_to(corpus))) for f in files] or \
        [pytest.param(None, marks=pytest.mark.skip(reason="no fixtures or corpus files"), id="absent")]


@pytest.mark.parametrize("path", _fixture_and_corpus_files())
def test_peftc_convert_equals_python_resave(peftc, scratch, path):
    """Every valid fixture and corpus file, loaded and saved again by the reference, and rewritten by
    `peftc convert`: the same bytes (names holding NUL bytes included)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata()
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except Exception as exc:  # e.g. shapes numpy/torch cannot hold
        pytest.skip(f"the reference cannot load it: {exc}")
    reference = st_torch.save(tensors, metadata=metadata)
    out = scratch / "converted.safetensors"
    result = subprocess.run([str(peftc), "convert", str(path), str(out)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert_same_file(out.read_bytes(), reference, metadata, str(path))
