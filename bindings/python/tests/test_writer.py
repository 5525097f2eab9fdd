"""Writer, save_file, save_checkpoint, rewrite: byte-identical to the reference writers, atomic, and
every error path of the streaming protocol."""

from __future__ import annotations

import gc
import json
import os

import numpy as np
import pytest

import peft_c
from peft_c_test_support import FIXTURES, numpy_tensors

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")
import safetensors.numpy as st_numpy  # noqa: E402
import safetensors.torch as st_torch  # noqa: E402
from safetensors import safe_open  # noqa: E402


def leftovers(folder):
    """Temporaries the writer may have left in a folder."""
    return [p.name for p in folder.iterdir() if ".peft-tmp-" in p.name]


def torch_tensors():
    gen = torch.Generator().manual_seed(11)
    base = torch.randn(4, 3, generator=gen) * 3
    return {
        "bf16": base.to(torch.bfloat16),
        "f8_e4m3": base.to(torch.float8_e4m3fn),
        "f8_e5m2": base.to(torch.float8_e5m2),
        "f8_e8m0": base.abs().add(0.25).to(torch.float8_e8m0fnu),
        "f16": base.to(torch.float16),
        "f32": base,
    }


def as_numpy(tensor) -> np.ndarray:
    """A torch tensor as the numpy array of the same bits (ml_dtypes for bf16/f8)."""
    dtype_name = {torch.bfloat16: "BF16", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
                  torch.float8_e8m0fnu: "F8_E8M0", torch.float16: "F16", torch.float32: "F32"}
    np_type = peft_c.numpy_dtype(dtype_name[tensor.dtype])
    raw = tensor.contiguous().view(torch.uint8).numpy() if tensor.element_size() == 1 else \
        tensor.contiguous().view(torch.int16 if tensor.element_size() == 2 else torch.int32).numpy()
    return raw.view(np_type).reshape(tuple(tensor.shape))


# ---- byte identity with the reference -------------------------------------------------------------

@pytest.mark.parametrize("metadata", [None, {}, {"format": "np"}], ids=["absent", "empty", "one"])
def test_save_file_is_byte_identical_to_safetensors_numpy(tmp_path, metadata):
    tensors = numpy_tensors()
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    peft_c.save_file(tensors, ours, metadata)
    st_numpy.save_file(tensors, str(theirs), metadata=metadata)
    assert ours.read_bytes() == theirs.read_bytes()
    assert leftovers(tmp_path) == []


def test_torch_dtypes_are_byte_identical_to_safetensors_torch(tmp_path):
    tensors = torch_tensors()
    theirs = tmp_path / "theirs.safetensors"
    st_torch.save_file(tensors, str(theirs), metadata={"format": "pt"})
    ours = tmp_path / "ours.safetensors"
    peft_c.save_file({k: as_numpy(v) for k, v in tensors.items()}, ours, {"format": "pt"})
    assert ours.read_bytes() == theirs.read_bytes()


def test_packed_f4_from_raw_bytes(tmp_path):
    packed = torch.tensor([0x21, 0x7F, 0x80, 0x0F], dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    theirs = tmp_path / "theirs.safetensors"
    st_torch.save_file({"f4": packed}, str(theirs))
    ours = tmp_path / "ours.safetensors"
    with peft_c.Writer.create(ours) as w:
        w.add_tensor("f4", "F4", (8,))  # 8 elements in 4 bytes
        w.write_tensor("f4", bytes([0x21, 0x7F, 0x80, 0x0F]), "F4")
    assert ours.read_bytes() == theirs.read_bytes()


@pytest.mark.parametrize("target", ["BF16", "F16", "F64"])
def test_conversion_while_writing_matches_torch(tmp_path, target):
    torch_type = {"BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}[target]
    source = torch.randn(64, 17, generator=torch.Generator().manual_seed(5)) * 100
    theirs = tmp_path / "theirs.safetensors"
    st_torch.save_file({"w": source.to(torch_type)}, str(theirs))
    ours = tmp_path / "ours.safetensors"
    peft_c.save_file({"w": source.numpy()}, ours, dtypes={"w": target})
    assert ours.read_bytes() == theirs.read_bytes()


def test_several_metadata_keys_are_sorted(tmp_path):
    metadata = {"z": "1", "a": "2", "m": "ü"}
    path = tmp_path / "m.safetensors"
    peft_c.save_file({"x": np.zeros(2, np.float32)}, path, metadata)
    with safe_open(str(path), framework="np") as f:
        assert f.metadata() == metadata
    n = int.from_bytes(path.read_bytes()[:8], "little")
    header = json.loads(path.read_bytes()[8:8 + n])
    assert list(header["__metadata__"]) == sorted(metadata)


def test_rewrite_equals_the_reference_writer_on_every_fixture(tmp_path):
    # Streaming each fixture through peft_c gives the bytes safetensors.torch.save writes for the
    # same tensors and metadata (which is the fixture itself when the reference wrote it).
    files = sorted((FIXTURES / "safetensors").glob("*.safetensors"))
    if not files:
        pytest.skip("fixtures not generated")
    for source in files:
        with safe_open(str(source), framework="pt") as f:
            names = list(f.keys())
            if any("\0" in name for name in names):
                continue  # names with NUL cannot pass the C API
            metadata = f.metadata()
            expected = st_torch.save({n: f.get_tensor(n) for n in names}, metadata=metadata)
        with peft_c.Checkpoint.open(source) as ckpt:
            out = tmp_path / source.name
            peft_c.rewrite(ckpt, out)
        ours = out.read_bytes()
        if metadata and len(metadata) > 1:
            # The reference writes metadata keys in HashMap order, which changes from run to run;
            # peft_c sorts them. Same header as JSON, same length, same data.
            assert split(ours)[0] == split(expected)[0] and len(ours) == len(expected), source.name
            assert split(ours)[1] == split(expected)[1], source.name
            assert list(split(ours)[0]["__metadata__"]) == sorted(metadata)
        else:
            assert ours == expected, source.name


def split(data: bytes):
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def test_rewrite_with_conversion(tmp_path, np_file):
    out = tmp_path / "bf16.safetensors"
    with peft_c.Checkpoint.open(np_file) as ckpt:
        peft_c.rewrite(ckpt, out, dtypes={"f32": "BF16", "f64": "BF16"}, names=["f32", "f64", "i8"],
                       metadata={"k": "v"})
    expected = {name: torch.from_numpy(numpy_tensors()[name]) for name in ("f32", "f64", "i8")}
    expected["f32"] = expected["f32"].to(torch.bfloat16)
    expected["f64"] = expected["f64"].to(torch.bfloat16)
    theirs = tmp_path / "theirs.safetensors"
    st_torch.save_file(expected, str(theirs), metadata={"k": "v"})
    assert out.read_bytes() == theirs.read_bytes()


# ---- checkpoints -----------------------------------------------------------------------------------

def test_checkpoint_reproduces_transformers_layout(tmp_path):
    source = FIXTURES / "safetensors" / "sharded"
    if not source.is_dir():
        pytest.skip(f"{source} not generated")
    index = json.loads((source / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    out = tmp_path / "copy"
    with peft_c.Checkpoint.open(source) as ckpt:
        with peft_c.Writer.checkpoint(out) as w:
            extra = {k: v for k, v in index["metadata"].items() if k != "total_size"}
            w.set_index_metadata(extra)
            for number, shard in enumerate(shards):
                if number:
                    w.break_shard()
                for name in ckpt:
                    if index["weight_map"][name] == shard:
                        info = ckpt.tensor(name)
                        w.add_tensor(name, info.dtype, info.shape)
            assert [os.path.basename(f) for f in w.files] == shards
            for name in w.order:
                w.write_from_checkpoint(name, ckpt)
    for name in shards + ["model.safetensors.index.json"]:
        assert (out / name).read_bytes() == (source / name).read_bytes(), name
    assert leftovers(out) == []


def test_save_checkpoint_shards_like_huggingface_hub(tmp_path):
    from huggingface_hub import split_torch_state_dict_into_shards

    rng = np.random.default_rng(9)
    tensors = {f"t{i:02d}": rng.standard_normal(int(rng.integers(1, 300))).astype(np.float32)
               for i in range(25)}
    tensors["big"] = np.zeros(2000, dtype=np.float32)  # larger than a shard: a shard of its own
    limit = 2400
    plan = split_torch_state_dict_into_shards({k: torch.from_numpy(v) for k, v in tensors.items()},
                                              max_shard_size=limit)
    out = tmp_path / "ckpt"
    files = peft_c.save_checkpoint(tensors, out, max_shard_size=limit)
    assert sorted(os.path.basename(f) for f in files) == sorted(plan.filename_to_tensors)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == plan.tensor_to_filename
    assert index["metadata"]["total_size"] == plan.metadata["total_size"]
    for filename, names in plan.filename_to_tensors.items():
        theirs = tmp_path / ("ref-" + filename)
        st_torch.save_file({n: torch.from_numpy(tensors[n]) for n in names}, str(theirs),
                           metadata={"format": "pt"})
        assert (out / filename).read_bytes() == theirs.read_bytes(), filename
    with peft_c.Checkpoint.open(out) as ckpt:
        for name, value in tensors.items():
            assert np.array_equal(ckpt.view(name), value)


def test_single_shard_checkpoint_is_model_safetensors(tmp_path):
    tensors = {"a": np.ones(3, np.float32)}
    files = peft_c.save_checkpoint(tensors, tmp_path / "one")
    assert [os.path.basename(f) for f in files] == ["model.safetensors"]
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == ["model.safetensors"]
    theirs = tmp_path / "ref.safetensors"
    st_numpy.save_file(tensors, str(theirs), metadata={"format": "pt"})
    assert (tmp_path / "one" / "model.safetensors").read_bytes() == theirs.read_bytes()


# ---- streaming ---------------------------------------------------------------------------------------

def test_chunked_and_callback_writes_equal_whole_writes(tmp_path):
    tensors = numpy_tensors()
    whole = tmp_path / "whole.safetensors"
    peft_c.save_file(tensors, whole)
    rng = np.random.default_rng(4)
    for mode in ("chunks", "callback"):
        out = tmp_path / f"{mode}.safetensors"
        with peft_c.Writer.create(out) as w:
            for name, value in tensors.items():
                w.add_tensor(name, value.dtype, value.shape)
            for position, name in enumerate(w.order):
                data = np.ascontiguousarray(tensors[name]).view(np.uint8).reshape(-1) \
                    if tensors[name].size else np.zeros(0, np.uint8)
                if mode == "chunks":
                    w.begin_tensor(name, tensors[name].dtype)
                    start = 0
                    while start < data.size:
                        step = int(rng.integers(1, 6))
                        w.write(data[start:start + step].tobytes())
                        start += step
                else:
                    def fill(offset, chunk, data=data):
                        chunk[:] = data[offset:offset + len(chunk)].tobytes()
                    w.write_from_callback(name, tensors[name].dtype, fill)
        assert out.read_bytes() == whole.read_bytes(), mode


def test_order_and_completeness_errors_leave_the_writer_usable(tmp_path):
    path = tmp_path / "o.safetensors"
    with peft_c.Writer.create(path) as w:
        w.add_tensor("a", "F32", (2,))
        w.add_tensor("b", "F32", (1,))
        assert w.order == ["a", "b"] and w.declarations == [0, 1] and len(w) == 2
        with pytest.raises(peft_c.InvalidArgumentError) as info:
            w.write_tensor("b", np.ones(1, np.float32))  # not the next one
        assert "b" in info.value.message
        with pytest.raises(peft_c.TensorInvalidInfoError):
            w.write_tensor("a", np.ones(3, np.float32))  # wrong size
        w.write_tensor("a", np.ones(2, np.float32))
        with pytest.raises(peft_c.InvalidArgumentError):
            w.finish()  # "b" is missing: nothing changes
        assert not path.exists()
        w.begin_tensor("b", "F32")
        with pytest.raises(peft_c.InvalidArgumentError):
            w.write(np.zeros(2, np.float32))  # more than it has left
        w.write(np.zeros(1, np.float32))
    with peft_c.Checkpoint.open(path) as ckpt:
        assert np.array_equal(ckpt.view("a"), [1, 1]) and np.array_equal(ckpt.view("b"), [0])


def test_declaration_errors(tmp_path):
    with peft_c.Writer.create(tmp_path / "d.safetensors") as w:
        w.add_tensor("a", "F32", (1,))
        with pytest.raises(peft_c.InvalidArgumentError):
            w.add_tensor("a", "F32", (1,))  # duplicate
        with pytest.raises(peft_c.InvalidArgumentError):
            w.add_tensor("__metadata__", "F32", (1,))
        with pytest.raises(peft_c.MisalignedSliceError):
            w.add_tensor("f4", "F4", (3,))
        with pytest.raises(peft_c.ValidationOverflowError):
            w.add_tensor("huge", "F64", (2**62, 4))
        with pytest.raises(ValueError):
            w.add_tensor("neg", "F32", (-1,))
        with pytest.raises(ValueError):
            w.add_tensor("a\0b", "F32", (1,))
        with pytest.raises(peft_c.InvalidArgumentError):
            w.break_shard()  # one-file writer
        with pytest.raises(peft_c.InvalidArgumentError):
            w.set_index_metadata({"x": 1})
        w.write_tensor("a", np.ones(1, np.float32))
        with pytest.raises(peft_c.InvalidArgumentError):
            w.add_tensor("late", "F32", (1,))  # started


def test_unsupported_conversion(tmp_path):
    with peft_c.Writer.create(tmp_path / "u.safetensors") as w:
        w.add_tensor("a", "I32", (2,))
        with pytest.raises(peft_c.UnsupportedError):
            w.write_tensor("a", np.ones(2, np.float32))
        w.write_tensor("a", np.ones(2, np.int32))


# ---- atomicity -----------------------------------------------------------------------------------------

def test_failed_write_keeps_the_old_target(tmp_path):
    path = tmp_path / "keep.safetensors"
    path.write_bytes(b"old content")
    with pytest.raises(RuntimeError):
        with peft_c.Writer.create(path) as w:
            w.add_tensor("a", "F32", (2,))
            w.write_tensor("a", np.ones(2, np.float32))
            raise RuntimeError("the host gives up")
    assert path.read_bytes() == b"old content"
    assert leftovers(tmp_path) == []


def test_callback_exception_is_re_raised_and_discards_output(tmp_path):
    path = tmp_path / "cb.safetensors"
    path.write_bytes(b"old")

    def failing(offset, chunk):
        raise KeyError("source went away")

    w = peft_c.Writer.create(path)
    w.add_tensor("a", "F32", (1024,))
    with pytest.raises(KeyError) as info:
        w.write_from_callback("a", "F32", failing)
    assert isinstance(info.value.__cause__, peft_c.CancelledError)
    with pytest.raises(peft_c.InvalidArgumentError):  # a discarded writer only frees
        w.finish()
    w.close()
    w.close()
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == []


def test_callback_returning_true_cancels(tmp_path):
    path = tmp_path / "cancel.safetensors"
    calls = []

    def stop(offset, chunk):
        calls.append(offset)
        return True

    with peft_c.Writer.create(path) as w:
        w.add_tensor("a", "F32", (4,))
        with pytest.raises(peft_c.CancelledError):
            w.write_from_callback("a", "F32", stop)
        w.close()
    assert calls == [0] and not path.exists() and leftovers(tmp_path) == []


def test_unfinished_writer_collected_leaves_nothing(tmp_path):
    path = tmp_path / "gc.safetensors"
    w = peft_c.Writer.create(path)
    w.add_tensor("a", "F32", (2,))
    w.begin_tensor("a", "F32")
    w.write(np.ones(1, np.float32))
    assert leftovers(tmp_path)  # the temporary exists while writing
    del w
    gc.collect()
    assert not path.exists() and leftovers(tmp_path) == []


def test_closed_writer_refuses_use(tmp_path):
    w = peft_c.Writer.create(tmp_path / "c.safetensors")
    w.close()
    assert w.closed
    with pytest.raises(ValueError):
        w.add_tensor("a", "F32", (1,))
    with pytest.raises(ValueError):
        w.finish()
