"""The committed fixtures read by peft_c (through its Python binding) and by the real safetensors package.

- every tests/fixtures/safetensors/**/*.safetensors: same names, order, dtypes, shapes, offsets,
  metadata, bytes and values as the reference;
- every checkpoint folder there: the files, the index and the tensor -> shard map;
- every tests/fixtures/malformed file: peft_c's error code is the one expected.json records, the same
  through every way of opening, and the real package rejects the file with the same failure kind,
  except for the cases expected.json marks as deliberately stricter than the reference.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402


def test_fixture_file_reads_like_the_reference(fixture_file, compare_with_reference):
    compare_with_reference(fixture_file)


def test_fixture_file_reads_the_same_with_pread(fixture_file, compare_with_reference):
    compare_with_reference(fixture_file, use_pread=True)


def test_fixture_folder_opens_as_a_checkpoint(fixture_folder, peft_c):
    folder = fixture_folder
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    with peft_c.Checkpoint.open(folder) as ckpt:
        assert sorted(pathlib.Path(p).name for p in ckpt.files) == (
            sorted(set(index["weight_map"].values())) if index else ["model.safetensors"])
        if index is None:
            assert shards == ["model.safetensors"]
            assert ckpt.index_metadata() is None
        else:
            assert set(ckpt) == set(index["weight_map"])
            assert ckpt.index_metadata() == index.get("metadata")
        for name in ckpt:
            info = ckpt.tensor(name)
            shard = pathlib.Path(info.file).name
            if index is not None:
                assert shard == index["weight_map"][name]
            with safe_open(str(folder / shard), framework="pt") as ref:
                tensor = ref.get_tensor(name)
                assert ckpt.metadata(info.file_index) == ref.metadata()
            flat = tensor.contiguous().reshape(-1)
            expected = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
            assert ckpt.view(name).tobytes() == expected, name
            if tensor.is_floating_point():
                assert np.array_equal(ckpt.read(name), tensor.float().numpy(), equal_nan=True), name


def _peft_code(peft_c, path: pathlib.Path):
    """peft_c's verdict (a code name, or None when it opens the file) through every way of opening."""
    verdicts = set()
    openers = (lambda: peft_c.Checkpoint.open(path),
               lambda: peft_c.Checkpoint.open(path, use_pread=True),
               lambda: peft_c.Checkpoint.from_bytes(path.read_bytes()))
    for opener in openers:
        try:
            opener().close()
            verdicts.add(None)
        except peft_c.PeftError as err:
            assert err.message
            assert type(err) is peft_c.ERROR_CLASSES.get(err.code, peft_c.PeftError)
            verdicts.add(err.code_name)
    assert len(verdicts) == 1, f"the ways of opening disagree: {verdicts}"
    return verdicts.pop()


def test_malformed_file(malformed_case, peft_c, reference_verdict):
    path, entry = malformed_case
    ours = _peft_code(peft_c, path)
    assert ours == entry["code"], entry["description"]
    theirs = reference_verdict(path)  # the installed reference, run now
    if entry.get("stricter_than_reference"):
        # Documented strictness: the reference accepts the file or reports another kind.
        assert theirs != ours, "no longer stricter than the reference: update expected.json"
    else:
        assert theirs is not None, "the reference accepts a file that peft_c rejects"
        assert theirs == ours, f"the reference reports {theirs}"


def test_malformed_corpus_covers_every_format_error(malformed_table, peft_c):
    recorded = {entry["code"] for entry in malformed_table.values()}
    format_errors = {peft_c.ErrorCode(code).name for code in range(1, 11)}
    assert format_errors <= recorded
