"""Lifetimes: close() is idempotent, views outlive the Checkpoint, the finalizer frees the handle.

The handle's release is observed two ways: a weak reference to the internal ``_Handle`` dies, and the
file's mapping disappears from /proc/self/maps (where available).
"""

from __future__ import annotations

import gc
import os
import weakref

import numpy as np
import pytest

import peft_c
from peft_c_test_support import numpy_tensors


def is_mapped(path) -> bool:
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("needs /proc/self/maps")
    target = os.path.realpath(path)
    with open("/proc/self/maps") as f:
        return any(line.rstrip("\n").endswith(" " + target) for line in f)


@pytest.fixture
def fresh_file(tmp_path, np_file):
    """A private copy, so no other test's mapping of the same file confuses the checks."""
    path = tmp_path / "own.safetensors"
    path.write_bytes(np_file.read_bytes())
    return path


def test_close_is_idempotent_and_blocks_further_use(fresh_file):
    ckpt = peft_c.Checkpoint.open(fresh_file)
    assert not ckpt.closed
    ckpt.close()
    ckpt.close()
    assert ckpt.closed
    for use in (lambda: len(ckpt), lambda: ckpt.tensor(0), lambda: ckpt.view("f32"),
                lambda: ckpt.read("f32"), lambda: ckpt.metadata(), lambda: list(ckpt),
                lambda: ckpt.files, lambda: ckpt.__enter__()):
        with pytest.raises(ValueError):
            use()


def test_context_manager_closes_and_unmaps(fresh_file):
    with peft_c.Checkpoint.open(fresh_file) as ckpt:
        handle = weakref.ref(ckpt._owned)
        assert not is_mapped(fresh_file)  # reads use pread; the file is mapped at the first view
        ckpt.view("f64")  # the array goes at once
        gc.collect()
        assert is_mapped(fresh_file)
    assert ckpt.closed
    assert handle() is None
    assert not is_mapped(fresh_file)


def test_context_manager_closes_on_exception(fresh_file):
    with pytest.raises(RuntimeError):
        with peft_c.Checkpoint.open(fresh_file) as ckpt:
            raise RuntimeError("boom")
    assert ckpt.closed and not is_mapped(fresh_file)


def test_view_outlives_close(fresh_file):
    expected = numpy_tensors()["f64"]
    ckpt = peft_c.Checkpoint.open(fresh_file)
    handle = weakref.ref(ckpt._owned)
    view = ckpt.view("f64")
    ckpt.close()
    gc.collect()
    assert handle() is not None and is_mapped(fresh_file)  # kept alive by the view
    assert np.array_equal(view, expected)
    derived = view[1:, :, ::-1]  # a numpy view of the view keeps it alive too
    del view
    gc.collect()
    assert np.array_equal(derived, expected[1:, :, ::-1])
    del derived
    gc.collect()
    assert handle() is None
    assert not is_mapped(fresh_file)


def test_view_outlives_the_checkpoint_object(fresh_file):
    expected = numpy_tensors()["i32"]
    ckpt = peft_c.Checkpoint.open(fresh_file)
    handle = weakref.ref(ckpt._owned)
    views = [ckpt.view("i32") for _ in range(3)]
    del ckpt  # never closed: the finalizer is the backstop
    gc.collect()
    # Churn the allocator so that freed memory would be reused (and a dangling view would show it).
    junk = [np.full(4096, 7, dtype=np.int64) for _ in range(200)]
    for view in views:
        assert np.array_equal(view, expected)
    del views, view, junk
    gc.collect()
    assert handle() is None and not is_mapped(fresh_file)


def test_unclosed_checkpoint_is_freed_by_the_finalizer(fresh_file):
    ckpt = peft_c.Checkpoint.open(fresh_file)
    handle = weakref.ref(ckpt._owned)
    finalizer = ckpt._owned._finalizer
    assert finalizer.alive
    del ckpt
    gc.collect()
    assert handle() is None and not finalizer.alive
    assert not is_mapped(fresh_file)


def test_reference_cycle_is_collected(fresh_file):
    ckpt = peft_c.Checkpoint.open(fresh_file)
    handle = weakref.ref(ckpt._owned)
    ckpt.self_ref = ckpt  # a cycle: only the cyclic collector can free it
    del ckpt
    gc.collect()
    assert handle() is None


def test_many_opens_do_not_leak_mappings(fresh_file):
    for _ in range(300):
        with peft_c.Checkpoint.open(fresh_file) as ckpt:
            ckpt.view("f32")
        ckpt = peft_c.Checkpoint.from_bytes(fresh_file.read_bytes())
        ckpt.read("f64")
    del ckpt
    gc.collect()
    assert not is_mapped(fresh_file)
    fd_dir = "/proc/self/fd"
    if os.path.isdir(fd_dir):
        target = os.path.realpath(fresh_file)
        open_fds = [fd for fd in os.listdir(fd_dir)
                    if os.path.realpath(os.path.join(fd_dir, fd)) == target]
        assert open_fds == []


def test_pread_view_outlives_close(fresh_file):
    ckpt = peft_c.Checkpoint.open(fresh_file, use_pread=True)
    view = ckpt.view("u64")
    ckpt.close()
    del ckpt
    gc.collect()
    assert np.array_equal(view, numpy_tensors()["u64"])


def test_checkpoint_cannot_be_pickled(fresh_file):
    import pickle

    with peft_c.Checkpoint.open(fresh_file) as ckpt:
        with pytest.raises(TypeError):
            pickle.dumps(ckpt)
