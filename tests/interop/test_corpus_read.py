"""Every .safetensors file of the real corpus read by peft_c (through its Python binding) and by the
real safetensors package: same names, data order, dtypes, shapes, offsets, metadata, bytes and values."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("safetensors")


def test_corpus_file_reads_like_the_reference(corpus_file, compare_with_reference):
    assert compare_with_reference(corpus_file) > 0


def test_corpus_file_reads_the_same_with_pread(corpus_file, compare_with_reference):
    assert compare_with_reference(corpus_file, use_pread=True) > 0


def test_corpus_file_from_memory_equals_file(corpus_file, peft_c):
    with peft_c.Checkpoint.open(corpus_file) as mapped, \
            peft_c.Checkpoint.from_bytes(corpus_file.read_bytes()) as memory:
        assert list(mapped) == list(memory)
        assert mapped.metadata() == memory.metadata()
        for name in mapped:
            info, other = mapped.tensor(name), memory.tensor(name)
            assert (info.dtype, info.shape, info.data_offsets) == (other.dtype, other.shape,
                                                                  other.data_offsets)
            assert mapped.view(name).tobytes() == memory.view(name).tobytes()


def test_corpus_model_folders_open_as_checkpoints(corpus_dir, peft_c):
    folders = sorted({p.parent for p in corpus_dir.rglob("model.safetensors")})
    if not folders:
        pytest.skip("no folder with model.safetensors in the corpus")
    for folder in folders:
        with peft_c.Checkpoint.open(folder) as by_folder, \
                peft_c.Checkpoint.open(folder / "model.safetensors") as by_file:
            assert by_folder.file_count == 1
            assert list(by_folder) == list(by_file)
            for name in by_file:
                assert np.array_equal(by_folder.view(name), by_file.view(name))


def test_corpus_is_complete(corpus_dir):
    # MANIFEST.md lists the files; a missing one would silently shrink the coverage above.
    manifest = (corpus_dir / "MANIFEST.md").read_text()
    listed = [line for line in manifest.splitlines() if line.startswith("| ") and ".safetensors" in line]
    assert len(listed) == len(list(corpus_dir.rglob("*.safetensors")))
