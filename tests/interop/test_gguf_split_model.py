"""Split GGUF models (`NAME-00001-of-0000N.gguf`, llama.cpp's `llama-gguf-split`) as merge bases.

A GGUF base (the tiny llama converted by convert_hf_to_gguf.py, F32, and the same quantized to Q8_0 by
llama-quantize) is cut by `llama-gguf-split --split --split-max-tensors 4` into parts. Then:

- `peftc inspect` on any part shows the whole model, one file per part.
- `peftc merge --base PART --adapter A --out OUT.gguf` (PART: the first or a later part) writes the same
  parts, OUT-0000K-of-0000N.gguf, each with its base part's tensors (in order) and metadata.
- `llama-gguf-split --merge` of those parts equals, byte for byte, peft_c's merge into one joined file
  (`--join-split`), and that file's tensors equal, byte for byte, peft_c's merge into the unsplit base.
- A merge that fails (here: cancelled by an output part that cannot be written) leaves no part behind.

Skipped (with the reason) when PEFT_LLAMA_CPP_BIN is not set; scripts/test.sh sets it.
"""

from __future__ import annotations

import os
import pathlib

import pytest

from gguf_reference import _run, convert_hf_to_gguf, llama_cpp, metadata, quantize, read_gguf, run_peftc

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
MODELS = FIXTURES / "models"
ADAPTERS = FIXTURES / "adapters"


def split_base(base: pathlib.Path, folder: pathlib.Path) -> list[pathlib.Path]:
    """llama-gguf-split's parts of `base` in `folder`, four tensors per part."""
    folder.mkdir()
    _run([llama_cpp().tool("llama-gguf-split"), "--split", "--split-max-tensors", "4", base, folder / "base"],
         "llama-gguf-split --split")
    parts = sorted(folder.glob("base-*-of-*.gguf"))
    assert len(parts) > 2, parts
    return parts


def join(first_part: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    _run([llama_cpp().tool("llama-gguf-split"), "--merge", first_part, out], "llama-gguf-split --merge")
    return out


def base_gguf(base_type: str) -> pathlib.Path:
    f32 = convert_hf_to_gguf(MODELS / "llama", outtype="f32")
    return f32 if base_type == "f32" else quantize(f32, type="Q8_0")


def tensor_bytes(path: pathlib.Path) -> dict:
    return {t.name: bytes(t.data.tobytes()) for t in read_gguf(path).tensors}


@pytest.mark.parametrize("base_type", ["f32", "q8_0"])
def test_merge_into_split_base_equals_joined_merge(peftc_binary, tmp_path, base_type):
    base = base_gguf(base_type)
    parts = split_base(base, tmp_path / "split")
    count = len(parts)
    adapter = ADAPTERS / "llama_lora"

    # inspect: any part shows every part.
    shown = run_peftc(peftc_binary, "inspect", parts[1]).stdout
    for part in parts:
        assert f"file {part}" in shown

    # The same parts, named after --out.
    out = tmp_path / "out"
    out.mkdir()
    run_peftc(peftc_binary, "merge", "--base", parts[1], "--adapter", adapter, "--out", out / "merged.gguf")
    merged = [out / f"merged-{k:05d}-of-{count:05d}.gguf" for k in range(1, count + 1)]
    assert sorted(out.iterdir()) == merged
    for base_part, part in zip(parts, merged):
        ours, theirs = read_gguf(part), read_gguf(base_part)
        assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
        assert [(f.name, f.types) for f in ours.fields.values()] == [(f.name, f.types) for f in theirs.fields.values()]
        ours_meta, theirs_meta = metadata(part), metadata(base_part)
        assert ours_meta == theirs_meta
        assert ours_meta["split.count"] == count

    # llama-gguf-split --merge of the parts == peft_c's joined merge, byte for byte.
    joined_by_llama = join(merged[0], tmp_path / "joined-by-llama.gguf")
    joined = tmp_path / "joined.gguf"
    run_peftc(peftc_binary, "merge", "--base", parts[0], "--adapter", adapter, "--out", joined, "--join-split")
    assert joined.read_bytes() == joined_by_llama.read_bytes()

    # ... and its tensors are the merge into the unsplit base.
    whole = tmp_path / "whole.gguf"
    run_peftc(peftc_binary, "merge", "--base", base, "--adapter", adapter, "--out", whole)
    assert tensor_bytes(joined) == tensor_bytes(whole)
    assert list(tensor_bytes(joined)) == list(tensor_bytes(whole))


def test_failed_split_merge_leaves_no_part(peftc_binary, tmp_path):
    parts = split_base(base_gguf("f32"), tmp_path / "split")
    out = tmp_path / "out"
    out.mkdir()
    # The last part's name is taken by a folder: its rename fails after the others were written.
    (out / f"merged-{len(parts):05d}-of-{len(parts):05d}.gguf").mkdir()
    before = sorted(p.name for p in out.iterdir())
    proc = run_peftc(peftc_binary, "merge", "--base", parts[0], "--adapter", ADAPTERS / "llama_lora",
                     "--out", out / "merged.gguf", expect=1)
    assert proc.stderr
    assert sorted(p.name for p in out.iterdir()) == before


def test_broken_split_base_is_refused(peftc_binary, tmp_path):
    parts = split_base(base_gguf("f32"), tmp_path / "split")
    os.remove(parts[1])
    proc = run_peftc(peftc_binary, "inspect", parts[0], expect=1)
    assert str(parts[1]) in proc.stderr and "is missing" in proc.stderr
