"""Fixtures of the interop tests: where things are, and the peft_c Python binding loaded on the build.

Environment (all optional):
  PEFT_CORPUS   the real corpus (default <repo>/../shared/corpus/real); corpus tests skip without it
  PEFT_TEST_DATA  the fixtures (default <repo>/tests/fixtures)
  PEFTC         the peftc binary (default <repo>/build/peftc)
  PEFT_C_LIB    the shared library (default <repo>/build/libpeft_c.so)

Helpers are handed out as fixtures (not imported from this file), so that these tests can run in one
pytest session together with other folders that also have a conftest.py.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = pathlib.Path(os.environ.get("PEFT_CORPUS") or REPO.parent / "shared" / "corpus" / "real")
FIXTURES = pathlib.Path(os.environ.get("PEFT_TEST_DATA") or REPO / "tests" / "fixtures")
PEFTC = pathlib.Path(os.environ.get("PEFTC") or REPO / "build" / "peftc")
LIBRARY = pathlib.Path(os.environ.get("PEFT_C_LIB") or REPO / "build" / "libpeft_c.so")

NO_CORPUS = f"real corpus not found at {CORPUS} (set PEFT_CORPUS to its folder)"


def _files(folder: pathlib.Path, pattern: str):
    return sorted(folder.rglob(pattern)) if folder.is_dir() else []


def corpus_files():
    return _files(CORPUS, "*.safetensors")


def fixture_files():
    return _files(FIXTURES / "safetensors", "*.safetensors")


def _params(paths, root: pathlib.Path, reason: str):
    if not paths:
        return [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="absent")]
    return [pytest.param(p, id=str(p.relative_to(root))) for p in paths]


def fixture_folders():
    valid = FIXTURES / "safetensors"
    return sorted({p.parent for p in fixture_files() if p.parent != valid})


def malformed_cases():
    """(file, entry of expected.json) of every malformed fixture."""
    expected = FIXTURES / "malformed" / "expected.json"
    if not expected.exists():
        return []
    table = json.loads(expected.read_text())
    return [(FIXTURES / "malformed" / name, entry) for name, entry in sorted(table.items())]


def pytest_generate_tests(metafunc):
    """One test per corpus file, fixture file, checkpoint folder or malformed case; or one skip
    that says why there are none."""
    regenerate = "(run tests/fixtures/generate.py)"
    if "corpus_file" in metafunc.fixturenames:
        metafunc.parametrize("corpus_file", _params(corpus_files(), CORPUS, NO_CORPUS))
    if "fixture_file" in metafunc.fixturenames:
        reason = f"no fixtures in {FIXTURES / 'safetensors'} {regenerate}"
        metafunc.parametrize("fixture_file", _params(fixture_files(), FIXTURES / "safetensors", reason))
    if "fixture_folder" in metafunc.fixturenames:
        reason = f"no checkpoint folders in {FIXTURES / 'safetensors'} {regenerate}"
        metafunc.parametrize("fixture_folder", _params(fixture_folders(), FIXTURES / "safetensors", reason))
    if "malformed_case" in metafunc.fixturenames:
        cases = malformed_cases()
        if cases:
            params = [pytest.param(case, id=case[0].name) for case in cases]
        else:
            reason = f"{FIXTURES / 'malformed' / 'expected.json'} not generated yet {regenerate}"
            params = [pytest.param(None, marks=pytest.mark.skip(reason=reason), id="absent")]
        metafunc.parametrize("malformed_case", params)


@pytest.fixture(scope="session")
def repo_root() -> pathlib.Path:
    return REPO


@pytest.fixture(scope="session")
def fixtures_dir() -> pathlib.Path:
    return FIXTURES


@pytest.fixture(scope="session")
def malformed_table() -> dict:
    """expected.json of the malformed fixtures (skips when it has not been generated)."""
    expected = FIXTURES / "malformed" / "expected.json"
    if not expected.exists():
        pytest.skip(f"{expected} not generated yet (run tests/fixtures/generate.py)")
    return json.loads(expected.read_text())


@pytest.fixture(scope="session")
def corpus_dir() -> pathlib.Path:
    if not CORPUS.is_dir():
        pytest.skip(NO_CORPUS)
    return CORPUS


@pytest.fixture(scope="session")
def peftc_binary() -> pathlib.Path:
    if not PEFTC.exists():
        pytest.skip(f"peftc not built at {PEFTC} (set PEFTC)")
    return PEFTC


@pytest.fixture(scope="session")
def peft_c_lib() -> pathlib.Path:
    if not LIBRARY.exists():
        pytest.fail(f"libpeft_c not found at {LIBRARY}: build it or set PEFT_C_LIB", pytrace=False)
    return LIBRARY


@pytest.fixture(scope="session")
def peft_c(peft_c_lib):
    """The Python binding from bindings/python, loaded on the library under test."""
    os.environ["PEFT_C_LIB"] = str(peft_c_lib)
    package_root = str(REPO / "bindings" / "python")
    if package_root not in sys.path:
        sys.path.insert(0, package_root)
    import peft_c as module

    module.load_library(str(peft_c_lib))
    return module


def _raw_header(path: pathlib.Path) -> dict:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        return json.loads(f.read(n))


@pytest.fixture(scope="session")
def raw_header():
    """The header of a file as plain JSON, read without either implementation."""
    return _raw_header


# The reference reader's messages, mapped to the peft_c codes of its failure kinds.
REFERENCE_KINDS = (
    ("header too small", "HEADER_TOO_SMALL"),
    ("header too large", "HEADER_TOO_LARGE"),
    ("invalid header length", "INVALID_HEADER_LENGTH"),
    ("invalid UTF-8 in header", "INVALID_HEADER_UTF8"),
    ("invalid JSON in header", "INVALID_HEADER"),
    ("invalid offset", "INVALID_OFFSET"),
    ("overflow computing buffer size", "VALIDATION_OVERFLOW"),
    ("slicing for subbytes", "MISALIGNED_SLICE"),
    ("invalid shape, data type, or offset", "TENSOR_INVALID_INFO"),
    ("incomplete metadata", "METADATA_INCOMPLETE_BUFFER"),
)


def _reference_verdict(path: pathlib.Path):
    """None when the reference's safe_open accepts the file, else its failure kind as a code name."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np"):
            pass
    except Exception as exc:  # SafetensorError, or OSError for unreadable files
        message = str(exc)
        for needle, name in REFERENCE_KINDS:
            if needle in message:
                return name
        return "OTHER: " + message
    return None


@pytest.fixture(scope="session")
def reference_verdict():
    return _reference_verdict


def _numpy_can_hold(shape, dtype) -> bool:
    """numpy refuses some zero-element shapes, e.g. [2**63 - 1, 0]; so does safetensors' numpy reader."""
    import numpy as np

    try:
        np.empty(shape, dtype=dtype)
    except ValueError:
        return False
    return True


def _compare_with_reference(peft_c, path: pathlib.Path, *, use_pread: bool = False) -> int:
    """Opens ``path`` with peft_c and with the real safetensors package and checks that they agree on
    everything: names, data order, dtypes, shapes, data_offsets, metadata, raw bytes and values.
    Returns the number of tensors compared."""
    import numpy as np
    import torch
    from safetensors import safe_open

    header = _raw_header(path)
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    data_order = sorted(entries, key=lambda k: tuple(entries[k]["data_offsets"]))
    with peft_c.Checkpoint.open(path, use_pread=use_pread) as ckpt, \
            safe_open(str(path), framework="pt") as ref:
        assert sorted(data_order) == sorted(ref.keys())
        assert list(ckpt) == data_order
        assert ckpt.metadata() == ref.metadata()
        for index, name in enumerate(data_order):
            info = ckpt.tensor(index)
            piece = ref.get_slice(name)
            assert info.dtype == piece.get_dtype() == entries[name]["dtype"], name
            assert list(info.shape) == list(piece.get_shape()) == entries[name]["shape"], name
            assert list(info.data_offsets) == entries[name]["data_offsets"], name

            tensor = ref.get_tensor(name)
            flat = tensor.contiguous().reshape(-1)
            ref_bytes = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
            assert ckpt.view(index, raw=True).tobytes() == ref_bytes, f"{name}: raw bytes differ"
            if info.dtype in ("F4", "F6_E2M3", "F6_E3M2"):
                continue
            np_dtype = peft_c.numpy_dtype(info.dtype)
            if not _numpy_can_hold(info.shape, np_dtype):
                with pytest.raises(ValueError):
                    ckpt.view(index)
                continue
            view = ckpt.view(index)
            assert view.shape == tuple(tensor.shape), name
            assert view.tobytes() == ref_bytes, name
            if not tensor.is_floating_point():
                expected_view = tensor.numpy()
                assert view.dtype == expected_view.dtype, name
                assert view.tobytes() == expected_view.tobytes(), name
            else:
                values = ckpt.read(index, "F32")
                expected = tensor.to(torch.float32).numpy()
                assert np.array_equal(values, expected, equal_nan=True), f"{name}: values differ"
    if all(e["dtype"] not in ("BF16", "F4", "F6_E2M3", "F6_E3M2") and not e["dtype"].startswith("F8")
           for e in entries.values()):
        # numpy framework too, where it can represent every dtype of the file
        with peft_c.Checkpoint.open(path) as ckpt, safe_open(str(path), framework="np") as ref:
            for index, name in enumerate(data_order):
                try:
                    expected = ref.get_tensor(name)
                except ValueError:  # numpy cannot hold the shape: peft_c's view refuses it too
                    with pytest.raises(ValueError):
                        ckpt.view(index)
                    continue
                view = ckpt.view(index)
                assert (view.dtype, view.shape) == (expected.dtype, expected.shape), name
                assert view.tobytes() == expected.tobytes(), name
    return len(entries)


@pytest.fixture(scope="session")
def compare_with_reference(peft_c):
    def compare(path, *, use_pread=False):
        return _compare_with_reference(peft_c, pathlib.Path(path), use_pread=use_pread)

    return compare
