"""Checkpoint: opening, the header, metadata, zero-copy views and converted reads.

Every expectation comes from the reference packages (safetensors, torch) or from the raw header JSON.
"""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

import peft_c
from peft_c_test_support import METADATA, numpy_tensors, reference_header, safetensors_bytes

torch = pytest.importorskip("torch")
ml_dtypes = pytest.importorskip("ml_dtypes")
from safetensors import safe_open  # noqa: E402


def reference_tensors(path):
    with safe_open(str(path), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}, f.metadata()


def raw_bytes(tensor) -> bytes:
    flat = tensor.contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def data_order(header: dict):
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    return sorted(tensors, key=lambda k: tuple(tensors[k]["data_offsets"]))


@pytest.fixture(params=["mmap", "pread", "memory"])
def opened(request, np_file):
    if request.param == "memory":
        ckpt = peft_c.Checkpoint.from_bytes(np_file.read_bytes())
    else:
        ckpt = peft_c.Checkpoint.open(np_file, use_pread=request.param == "pread")
    with ckpt:
        yield ckpt


# ---- opening -------------------------------------------------------------------------------------

def test_open_accepts_str_pathlib_and_bytes(np_file):
    for path in (str(np_file), np_file, os.fsencode(np_file)):
        with peft_c.Checkpoint.open(path) as ckpt:
            assert ckpt.files == (str(np_file),)


def test_open_missing_file_is_an_io_error(tmp_path):
    with pytest.raises(peft_c.IoError) as info:
        peft_c.Checkpoint.open(tmp_path / "absent.safetensors")
    assert isinstance(info.value, OSError)
    assert "absent.safetensors" in info.value.message


def test_open_folder_without_checkpoint(tmp_path):
    with pytest.raises(peft_c.PeftError) as info:
        peft_c.Checkpoint.open(tmp_path)
    assert info.value.code in (peft_c.ErrorCode.INVALID_CHECKPOINT, peft_c.ErrorCode.IO,
                               peft_c.ErrorCode.NOT_FOUND)


def test_path_with_nul_is_refused(tmp_path):
    with pytest.raises(ValueError):
        peft_c.Checkpoint.open(str(tmp_path / "a\0b"))


def test_max_header_size(np_file):
    header_len = int.from_bytes(np_file.read_bytes()[:8], "little")
    with peft_c.Checkpoint.open(np_file, max_header_size=header_len):
        pass  # exactly the cap is allowed, as in the reference
    with pytest.raises(peft_c.HeaderTooLargeError) as info:
        peft_c.Checkpoint.open(np_file, max_header_size=header_len - 1)
    assert info.value.code == 2 and isinstance(info.value, peft_c.SafetensorsFormatError)
    with pytest.raises(peft_c.HeaderTooLargeError):
        peft_c.Checkpoint.from_bytes(np_file.read_bytes(), max_header_size=header_len - 1)
    with pytest.raises(ValueError):
        peft_c.Checkpoint.open(np_file, max_header_size=-1)
    with pytest.raises(TypeError):
        peft_c.Checkpoint.open(np_file, max_header_size=1.5)


def test_from_bytes_accepts_any_bytes_like(np_file):
    data = np_file.read_bytes()
    for source in (data, bytearray(data), memoryview(data), np.frombuffer(data, dtype=np.uint8),
                   np.repeat(np.frombuffer(data, dtype=np.uint8), 2)[::2]):
        with peft_c.Checkpoint.from_bytes(source) as ckpt:
            assert len(ckpt) == len(numpy_tensors())
            assert ckpt.files == ("<memory>",) or len(ckpt.files) == 1


def test_from_bytes_copies_the_input(np_file):
    data = bytearray(np_file.read_bytes())
    ckpt = peft_c.Checkpoint.from_bytes(data)
    expected = ckpt.read("f32").copy()
    data[:] = b"\0" * len(data)  # the caller's buffer changes; the checkpoint must not
    assert np.array_equal(ckpt.read("f32"), expected)
    ckpt.close()


# ---- the header ----------------------------------------------------------------------------------

def test_names_in_data_order(opened, np_file):
    header = reference_header(np_file)
    assert list(opened) == data_order(header) == list(opened.keys())
    assert len(opened) == len(header) - 1


def test_tensor_info_matches_header_and_reference(opened, np_file):
    header = reference_header(np_file)
    reference, _ = reference_tensors(np_file)
    for index, name in enumerate(opened):
        info = opened.tensor(name)
        entry = header[name]
        assert info == opened.tensor(index) == opened.tensor(index - len(opened))
        assert info.index == index and info.name == name
        assert info.dtype == entry["dtype"]
        assert info.shape == tuple(entry["shape"]) == tuple(reference[name].shape)
        assert info.data_offsets == tuple(entry["data_offsets"])
        assert info.nbytes == len(raw_bytes(reference[name]))
        assert info.numel == math.prod(entry["shape"])
        assert info.file_index == 0 and info.file == opened.files[0]
        assert opened.tensor(info) == info


def test_contains_and_lookup_errors(opened):
    assert "f32" in opened and "nope" not in opened and 3 not in opened
    with pytest.raises(peft_c.NotFoundError) as info:
        opened.tensor("nope")
    assert isinstance(info.value, KeyError) and "nope" in info.value.message
    with pytest.raises(IndexError):
        opened.tensor(len(opened))
    with pytest.raises(IndexError):
        opened.tensor(-len(opened) - 1)
    with pytest.raises(TypeError):
        opened.tensor(1.0)
    with pytest.raises(TypeError):
        opened.tensor(True)
    with pytest.raises(peft_c.NotFoundError):  # looked up with its length: a NUL is just a byte
        opened.tensor("f32\0")


def test_metadata_equals_reference(opened, np_file):
    _, reference_meta = reference_tensors(np_file)
    assert opened.metadata() == reference_meta == METADATA
    assert opened.metadata(-1) == METADATA
    with pytest.raises(IndexError):
        opened.metadata(1)
    assert opened.index_metadata() is None


def test_no_metadata_is_none(torch_file):
    with peft_c.Checkpoint.open(torch_file) as ckpt:
        _, reference_meta = reference_tensors(torch_file)
        assert ckpt.metadata() is None and reference_meta is None


def test_empty_metadata_is_an_empty_dict(tmp_path):
    path = tmp_path / "m.safetensors"
    path.write_bytes(safetensors_bytes({"__metadata__": {}}))
    with safe_open(str(path), framework="np") as f:
        reference_meta = f.metadata()
    with peft_c.Checkpoint.open(path) as ckpt:
        assert len(ckpt) == 0 and list(ckpt) == []
        assert ckpt.metadata() == reference_meta


# ---- views ---------------------------------------------------------------------------------------

def test_views_equal_reference_bytes_and_values(opened, np_file):
    reference, _ = reference_tensors(np_file)
    for name in opened:
        arr = opened.view(name)
        ref = reference[name]
        assert arr.shape == tuple(ref.shape)
        assert arr.tobytes() == raw_bytes(ref)
        assert np.array_equal(arr, ref.numpy(), equal_nan=arr.dtype.kind in "fc")
        assert arr.dtype == peft_c.numpy_dtype(opened.tensor(name).dtype)


def test_views_are_read_only(opened):
    arr = opened.view("f32")
    assert not arr.flags.writeable
    with pytest.raises(ValueError):
        arr[0, 0] = 1.0
    with pytest.raises(ValueError):
        arr.flags.writeable = True


def test_views_of_torch_dtypes(torch_file):
    reference, _ = reference_tensors(torch_file)
    with peft_c.Checkpoint.open(torch_file) as ckpt:
        for name in ckpt:
            info = ckpt.tensor(name)
            arr = ckpt.view(name)
            raw = ckpt.view(name, raw=True)
            assert raw.dtype == np.uint8 and raw.tobytes() == raw_bytes(reference[name])
            if info.dtype == "F4":
                assert arr.dtype == np.uint8 and arr.shape == (info.nbytes,)
                continue
            assert arr.tobytes() == raw_bytes(reference[name])
            assert arr.shape == tuple(reference[name].shape)
            if info.dtype != "F32":
                expected = reference[name].float().numpy()
                assert np.array_equal(arr.astype(np.float32), expected, equal_nan=True), name
            plain = ckpt.view(name, use_ml_dtypes=False)
            assert plain.dtype.kind in "uf" and plain.tobytes() == arr.tobytes()


def test_view_is_zero_copy(np_file):
    with peft_c.Checkpoint.open(np_file) as ckpt:
        a, b = ckpt.view("f32"), ckpt.view("f32")
        assert np.shares_memory(a, b)  # two views, one piece of memory: nothing was copied
        address = a.__array_interface__["data"][0]
        header_len = int.from_bytes(np_file.read_bytes()[:8], "little")
        file_offset = 8 + header_len + ckpt.tensor("f32").data_offsets[0]
        # The array's data pointer lies inside a mapping of the file, at the tensor's file offset.
        assert any(begin <= address < end and address - begin + offset == file_offset
                   for begin, end, offset in mappings_of(np_file))


def mappings_of(path):
    """(begin, end, file offset) of every mapping of ``path`` in this process (Linux /proc)."""
    maps = "/proc/self/maps"
    if not os.path.exists(maps):
        pytest.skip("needs /proc/self/maps to locate the mapping")
    target = os.path.realpath(path)
    found = []
    with open(maps) as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == target:
                begin, end = (int(x, 16) for x in fields[0].split("-"))
                found.append((begin, end, int(fields[2], 16)))
    return found


def test_pread_views_stable_and_equal(np_file):
    with peft_c.Checkpoint.open(np_file, use_pread=True) as ckpt:
        a, b = ckpt.view("f64"), ckpt.view("f64")
        assert np.shares_memory(a, b)  # read once, then kept
        assert np.array_equal(a, numpy_tensors()["f64"])


def test_scalar_and_empty_views(opened):
    scalar = opened.view("scalar")
    assert scalar.shape == () and scalar[()] == np.float32(3.25)
    empty = opened.view("empty")
    assert empty.shape == (0, 4) and empty.size == 0


def test_shapes_numpy_cannot_hold(tmp_path):
    # [2**63 - 1, 0] has no elements; safetensors accepts it but numpy refuses such a shape.
    path = tmp_path / "big.safetensors"
    path.write_bytes(safetensors_bytes({"y": {"dtype": "F64", "shape": [2**63 - 1, 0],
                                              "data_offsets": [0, 0]}}))
    with safe_open(str(path), framework="pt") as f:
        assert tuple(f.get_slice("y").get_shape()) == (2**63 - 1, 0)
    with peft_c.Checkpoint.open(path) as ckpt:
        assert ckpt.tensor("y").shape == (2**63 - 1, 0) and ckpt.tensor("y").numel == 0
        assert ckpt.view("y", raw=True).size == 0
        with pytest.raises(ValueError, match="'y'"):
            ckpt.view("y")
        with pytest.raises(ValueError, match="'y'"):
            ckpt.read("y")


# ---- converted reads ------------------------------------------------------------------------------

def test_read_f32_equals_reference(opened, np_file):
    reference, _ = reference_tensors(np_file)
    for name in opened:
        info = opened.tensor(name)
        if info.dtype == "C64":
            with pytest.raises(peft_c.UnsupportedError):
                opened.read(name)
            continue
        out = opened.read(name)
        assert out.dtype == np.float32 and out.shape == info.shape and out.flags.writeable
        expected = reference[name].to(torch.float32).numpy()
        assert np.array_equal(out, expected, equal_nan=True), name


@pytest.mark.parametrize("target", ["F64", "F16", "BF16"])
def test_read_other_targets_round_like_torch(torch_file, target):
    torch_type = {"F64": torch.float64, "F16": torch.float16, "BF16": torch.bfloat16}[target]
    reference, _ = reference_tensors(torch_file)
    with peft_c.Checkpoint.open(torch_file) as ckpt:
        for name in ("bf16", "f32", "f8_e4m3", "f8_e5m2"):
            out = ckpt.read(name, target)
            expected = reference[name].to(torch_type)
            assert out.tobytes() == raw_bytes(expected), (name, target)


def test_read_own_dtype_is_a_copy(opened, torch_file):
    for name in opened:
        copy = opened.read(name, dtype=None)
        assert copy.tobytes() == opened.view(name).tobytes()
        assert not np.shares_memory(copy, opened.view(name))
    with peft_c.Checkpoint.open(torch_file) as ckpt:
        assert ckpt.read("f4", "F4").tobytes() == ckpt.view("f4").tobytes()


def test_read_unsupported_target(opened):
    with pytest.raises(peft_c.UnsupportedError):
        opened.read("f32", "I32")
    with pytest.raises(ValueError):
        opened.read("f32", "float")


# ---- folders --------------------------------------------------------------------------------------

def test_folder_with_model_safetensors(single_dir):
    with peft_c.Checkpoint.open(single_dir) as ckpt:
        assert ckpt.file_count == 1
        assert os.path.samefile(ckpt.files[0], single_dir / "model.safetensors")
        assert np.array_equal(ckpt.view("w"), np.arange(6, dtype=np.float32).reshape(2, 3))


def test_sharded_checkpoint(sharded_dir):
    index = json.loads((sharded_dir / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1, "the fixture should really be sharded"
    with peft_c.Checkpoint.open(sharded_dir) as ckpt:
        assert ckpt.file_count == len(shards)
        assert sorted(os.path.basename(p) for p in ckpt.files) == shards
        assert set(ckpt) == set(index["weight_map"])
        assert ckpt.index_metadata() == index.get("metadata")
        for name in ckpt:
            info = ckpt.tensor(name)
            assert os.path.basename(info.file) == index["weight_map"][name]
            shard = sharded_dir / index["weight_map"][name]
            with safe_open(str(shard), framework="pt") as f:
                ref = f.get_tensor(name)
                shard_meta = f.metadata()
            assert ckpt.view(name).tobytes() == raw_bytes(ref)
            assert np.array_equal(ckpt.read(name), ref.float().numpy())
            assert ckpt.metadata(info.file_index) == shard_meta


def test_repr(np_file):
    ckpt = peft_c.Checkpoint.open(np_file)
    assert "tensors=" in repr(ckpt)
    ckpt.close()
    assert "closed" in repr(ckpt)
