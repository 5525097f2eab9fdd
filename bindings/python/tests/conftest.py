"""Shared fixtures of the binding's tests.

Test files are written by the real reference packages (safetensors.numpy, safetensors.torch and
huggingface_hub's sharding writer) into a temporary folder, so every expectation comes from them.
The package under test is the source tree next to this folder; the library is the one ``PEFT_C_LIB``
names, or else ``<repo>/build/libpeft_c.so`` when it exists, or else the binding's normal lookup.
"""

from __future__ import annotations

import os
import pathlib
import sys

import numpy as np
import pytest

PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[1]
REPO = PACKAGE_ROOT.parents[1]
sys.path.insert(0, str(PACKAGE_ROOT))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

if not os.environ.get("PEFT_C_LIB"):
    _default = REPO / "build" / "libpeft_c.so"
    if _default.exists():
        os.environ["PEFT_C_LIB"] = str(_default)

import peft_c  # noqa: E402,F401
from peft_c_test_support import METADATA, numpy_tensors  # noqa: E402


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("peft_c_py")


@pytest.fixture(scope="session")
def np_file(data_dir) -> pathlib.Path:
    """Every numpy-representable dtype, a scalar, an empty tensor, and metadata."""
    from safetensors.numpy import save_file

    path = data_dir / "numpy.safetensors"
    save_file(numpy_tensors(), str(path), metadata=METADATA)
    return path


@pytest.fixture(scope="session")
def torch_file(data_dir) -> pathlib.Path:
    """bfloat16, the float8 types and F4, written by safetensors.torch; no metadata."""
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(7)
    base = torch.randn(3, 5, generator=gen) * 4
    tensors = {
        "bf16": base.to(torch.bfloat16),
        "f8_e4m3": base.to(torch.float8_e4m3fn),
        "f8_e5m2": base.to(torch.float8_e5m2),
        "f8_e4m3fnuz": base.to(torch.float8_e4m3fnuz),
        "f8_e5m2fnuz": base.to(torch.float8_e5m2fnuz),
        "f8_e8m0": base.abs().add(0.5).to(torch.float8_e8m0fnu),
        "f4": torch.tensor([0x21, 0x7F, 0x80, 0x0F], dtype=torch.uint8).view(torch.float4_e2m1fn_x2),
        "f32": base,
    }
    path = data_dir / "torch.safetensors"
    save_file(tensors, str(path))
    return path


@pytest.fixture(scope="session")
def sharded_dir(data_dir) -> pathlib.Path:
    """A sharded checkpoint folder written by huggingface_hub (model.safetensors.index.json)."""
    torch = pytest.importorskip("torch")
    hub = pytest.importorskip("huggingface_hub")
    folder = data_dir / "sharded"
    folder.mkdir()
    gen = torch.Generator().manual_seed(3)
    state = {f"layer.{i}.weight": torch.randn(16, 16, generator=gen) for i in range(5)}
    state["embed"] = torch.randn(8, 16, generator=gen).to(torch.bfloat16)
    hub.save_torch_state_dict(state, folder, max_shard_size=2500, metadata={"creator": "tests"})
    assert (folder / "model.safetensors.index.json").exists()
    return folder


@pytest.fixture(scope="session")
def single_dir(data_dir) -> pathlib.Path:
    """A folder holding just model.safetensors."""
    from safetensors.numpy import save_file

    folder = data_dir / "single"
    folder.mkdir()
    save_file({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, str(folder / "model.safetensors"))
    return folder
