"""A Checkpoint used from several threads at once (the C API declares it thread-safe).

ctypes releases the GIL during each C call, so the library really runs concurrently here.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import peft_c
from peft_c_test_support import numpy_tensors

THREADS = 8


def run_all(worker, count=THREADS):
    with ThreadPoolExecutor(max_workers=count) as pool:
        return [f.result() for f in [pool.submit(worker, i) for i in range(count)]]


@pytest.mark.parametrize("use_pread", [False, True])
def test_shared_checkpoint_from_many_threads(np_file, use_pread):
    expected = numpy_tensors()
    start = threading.Barrier(THREADS)
    with peft_c.Checkpoint.open(np_file, use_pread=use_pread) as ckpt:
        def worker(seed):
            start.wait()
            rng = np.random.default_rng(seed)
            names = list(expected)
            for _ in range(200):
                name = names[rng.integers(len(names))]
                view = ckpt.view(name)
                if not np.array_equal(view, expected[name]):
                    return f"view of {name} differs"
                if expected[name].dtype.kind in "fiub" and not np.array_equal(
                        ckpt.read(name, "F64"), expected[name].astype(np.float64)):
                    return f"read of {name} differs"
                if ckpt.tensor(name).name != name or ckpt.metadata() is None:
                    return "header differs"
            return "ok"

        assert run_all(worker) == ["ok"] * THREADS


def test_open_and_close_from_many_threads(np_file):
    data = np_file.read_bytes()

    def worker(i):
        for j in range(50):
            if (i + j) % 2:
                ckpt = peft_c.Checkpoint.open(np_file)
            else:
                ckpt = peft_c.Checkpoint.from_bytes(data)
            with ckpt:
                if not np.array_equal(ckpt.view("f32"), numpy_tensors()["f32"]):
                    return "differs"
        return "ok"

    assert run_all(worker) == ["ok"] * THREADS


def test_errors_from_many_threads_stay_separate(np_file):
    # Error objects are returned, not thread-local: each thread sees its own message.
    with peft_c.Checkpoint.open(np_file) as ckpt:
        def worker(i):
            for _ in range(100):
                try:
                    ckpt.tensor(f"missing-{i}")
                except peft_c.NotFoundError as err:
                    if f"missing-{i}" not in err.message:
                        return err.message
            return "ok"

        assert run_all(worker) == ["ok"] * THREADS


def test_close_while_other_threads_read(np_file):
    # A close() racing with calls from other threads may make them raise ValueError (closed), but
    # never crash: each call keeps the handle alive until it returns.
    ckpt = peft_c.Checkpoint.open(np_file)
    expected = numpy_tensors()["f64"]
    started = threading.Barrier(THREADS + 1)

    def worker(_):
        started.wait()
        views = []
        try:
            while True:
                views.append(ckpt.view("f64"))
                ckpt.read("f32")
        except ValueError:
            pass
        return all(np.array_equal(v, expected) for v in views)

    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        futures = [pool.submit(worker, i) for i in range(THREADS)]
        started.wait()
        ckpt.close()
        assert all(f.result() for f in futures)
