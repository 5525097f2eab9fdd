"""The malformed GGUF fixtures against gguf-py's reader (llama.cpp's gguf-py/gguf/gguf_reader.py).

tests/fixtures/malformed/gguf/expected.json records, for each file, peft_c's code (checked by
tests/unit/test_gguf_malformed.cpp) and what gguf-py's GGUFReader does ("error" or "ok"). This test
opens every file with GGUFReader and checks that record: gguf-py refuses every file peft_c refuses,
except the files marked "stricter", which gguf-py reads and peft_c refuses on purpose (docs/gguf.md,
"Validation"); and it reads every file peft_c reads.

gguf-py is found through PEFT_GGUF_PY (the gguf-py folder of a llama.cpp tree, which holds the `gguf`
package; it needs numpy), else as an installed `gguf` package; without either the test skips.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

import pytest

FIXTURES = pathlib.Path(os.environ.get("PEFT_TEST_DATA") or pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures")
FOLDER = FIXTURES / "malformed" / "gguf"


def _gguf_reader():
    folder = os.environ.get("PEFT_GGUF_PY")
    if folder:
        if not (pathlib.Path(folder) / "gguf" / "gguf_reader.py").is_file():
            pytest.fail(f"PEFT_GGUF_PY={folder} is not a gguf-py folder (no gguf/gguf_reader.py in it)")
        sys.path.insert(0, folder)
    try:
        from gguf.gguf_reader import GGUFReader
    except ImportError as error:
        pytest.skip(f"gguf-py is not importable ({error}); set PEFT_GGUF_PY to llama.cpp's gguf-py folder")
    return GGUFReader


def _cases():
    expected = json.loads((FOLDER / "expected.json").read_text(encoding="utf-8"))
    return sorted(expected.items())


@pytest.mark.parametrize("name,entry", _cases(), ids=[name for name, _ in _cases()])
def test_gguf_py_agrees(name, entry):
    reader = _gguf_reader()
    try:
        reader(FOLDER / name)
        result, why = "ok", ""
    except Exception as error:  # any exception is a refusal
        result, why = "error", f"{type(error).__name__}: {error}"
    assert result == entry["gguf_py"], f"{name} ({entry['description']}): gguf-py gives {result} {why}"
    if entry["code"] == "OK":
        assert result == "ok", f"{name}: peft_c reads it, gguf-py refuses it: {why}"
    elif result == "ok":
        assert entry.get("stricter") is True, f"{name}: gguf-py reads it, peft_c refuses it, not marked stricter"
