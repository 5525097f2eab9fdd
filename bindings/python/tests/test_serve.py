"""Serving: Registry, Lease, lora_apply and HostModel.

Expected values come from the fixture adapters' files read with the safetensors package and the LoRA
formula evaluated in float64 with numpy (lora_apply), and from ``merge_into`` (a swap merges with the
arithmetic of peft_merge_buffer_apply). Comparisons with PEFT's own forward and merge are in
tests/interop/test_serve_apply.py.
"""

from __future__ import annotations

import gc
import json
import math
import os
import pickle
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import peft_c
from peft_c_test_support import FIXTURES

ml_dtypes = pytest.importorskip("ml_dtypes")
from safetensors.numpy import load_file  # noqa: E402

ADAPTERS = FIXTURES / "adapters"
LLAMA = FIXTURES / "models" / "llama"
GPT2 = FIXTURES / "models" / "gpt2"
Q0 = "model.layers.0.self_attn.q_proj"  # tiny llama: q/o_proj 16 -> 16, k/v_proj 16 -> 8, MLP 16 <-> 32
BUDGET = 1 << 30

if not (ADAPTERS / "llama_lora" / "adapter_model.safetensors").exists():
    pytest.skip("fixture adapters not generated (run tests/fixtures/generate.py)", allow_module_level=True)

NP_DTYPES = {"F32": np.float32, "BF16": ml_dtypes.bfloat16, "F16": np.float16}


# ---- expectations -----------------------------------------------------------------------------------

def factors(name: str, module: str):
    """(A, B, bias or None, scaling) of one LoRA layer of a fixture adapter, from its files."""
    folder = ADAPTERS / name
    config = json.loads((folder / "adapter_config.json").read_text())
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    prefix = f"base_model.model.{module}."
    a = tensors[prefix + "lora_A.weight"].astype(np.float64)
    b = tensors[prefix + "lora_B.weight"].astype(np.float64)
    bias = tensors.get(prefix + "lora_B.bias")
    r, alpha = config["r"], config["lora_alpha"]
    scaling = alpha / math.sqrt(r) if config.get("use_rslora") else alpha / r
    return a, b, None if bias is None else bias.astype(np.float64), scaling


def stored(values: np.ndarray, storage: str) -> np.ndarray:
    """Factors as the registry keeps them: rounded to the storage dtype."""
    return values.astype(np.float32).astype(NP_DTYPES[storage]).astype(np.float64)


def expected_apply(names, row_lease, module, x, y, storage="F32"):
    """y + each row's scaling * (x A^T) B^T (+ scaling * bias), in float64 from the files."""
    out = y.astype(np.float64)
    x64 = x.astype(np.float64)
    rows = np.zeros(len(x), np.int32) if row_lease is None else np.asarray(row_lease)
    for index, name in enumerate(names):
        selected = rows == index
        if not selected.any():
            continue
        a, b, bias, scaling = factors(name, module)
        a, b = stored(a, storage), stored(b, storage)
        out[selected] += scaling * (x64[selected] @ a.T) @ b.T
        if bias is not None:
            out[selected] += scaling * stored(bias, storage)
    return out


def lora_bytes(name: str, storage: str) -> int:
    tensors = load_file(str(ADAPTERS / name / "adapter_model.safetensors"))
    item = np.dtype(NP_DTYPES[storage]).itemsize
    return sum(t.size * item for key, t in tensors.items()
               if key.endswith(("lora_A.weight", "lora_B.weight", "lora_B.bias", "lora_magnitude_vector")))


def activations(rows=6, features=16, dtype="F32", seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, features)).astype(np.float32).astype(NP_DTYPES[dtype])


def assert_matches(y, expected, y0):
    """``y`` against the exact result: F32 within 1e-5 of the output's scale; F16/BF16 at most one step
    from the exact value rounded, the step taken at the size of what was added (y0 or the result)."""
    if y.dtype == np.float32:
        assert np.abs(y - expected).max() <= 1e-5 * np.abs(expected).max()
        return
    rounded = expected.astype(np.float32).astype(y.dtype).astype(np.float64)
    size = np.maximum(np.abs(y0.astype(np.float64)), np.abs(expected)).astype(np.float32)
    significand_bits = 7 if y.dtype == ml_dtypes.bfloat16 else 10
    step = np.spacing(size) * 2.0 ** (23 - significand_bits)
    gap = np.abs(y.astype(np.float64) - rounded)
    assert np.all(gap <= step), f"{int(np.sum(gap > step))} elements off by more than one step"


@pytest.fixture
def registry():
    with peft_c.Registry("F32", BUDGET) as reg:
        for name in ("llama_lora", "llama_lora_second", "llama_rslora"):
            reg.register(name, ADAPTERS / name)
        yield reg


# ---- registry -----------------------------------------------------------------------------------------

def test_register_names_and_stats(registry):
    assert registry.names() == ["llama_lora", "llama_lora_second", "llama_rslora"]
    stats = registry.stats()
    assert isinstance(stats, peft_c.RegistryStats)
    assert (stats.budget_bytes, stats.registered, stats.loaded, stats.loaded_bytes, stats.loads) == \
        (BUDGET, 3, 0, 0, 0)  # registering reads no tensor
    with registry.acquire("llama_lora") as lease:
        stats = registry.stats()
        assert (stats.loaded, stats.pinned, stats.loads, stats.hits) == (1, 1, 1, 0)
        assert stats.loaded_bytes == stats.peak_loaded_bytes == lease.nbytes == lora_bytes("llama_lora", "F32")
        with registry.acquire("llama_lora") as again:
            assert registry.stats().hits == 1 and again.version == lease.version
    stats = registry.stats()
    assert (stats.loaded, stats.pinned) == (1, 0)
    assert "3 registered" in repr(registry)


@pytest.mark.parametrize("storage", ["F32", "BF16", "F16"])
def test_lease_facts(storage):
    with peft_c.Registry(storage, BUDGET) as reg:
        assert reg.dtype == peft_c.DType[storage]
        reg.register("a", ADAPTERS / "llama_lora")
        reg.register("b", ADAPTERS / "gpt2_lora")
        with reg.acquire("a") as a, reg.acquire("b") as b:
            assert (a.name, b.name) == ("a", "b")
            assert b.version > a.version >= 1
            assert a.nbytes == lora_bytes("llama_lora", storage)
            assert b.nbytes == lora_bytes("gpt2_lora", storage)
            assert a.has_module(Q0)
            assert a.has_module(Q0 + ".weight")
            assert a.has_module("base_model.model." + Q0)
            assert not a.has_module("model.layers.0.self_attn.q_proj.bias")
            assert not a.has_module("model.layers.7.self_attn.q_proj")
            assert not a.has_module("")
            assert b.has_module("transformer.h.0.attn.c_attn") and not b.has_module(Q0)
            assert "v" in repr(a)


def test_registry_arguments():
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.Registry("F64", BUDGET)  # storage must be F32, BF16 or F16
    with pytest.raises(ValueError):
        peft_c.Registry("nope", BUDGET)
    for budget in (-1, 2**64, 1.5, True):
        with pytest.raises(ValueError):
            peft_c.Registry("F32", budget)
    with peft_c.Registry("F32", 0) as reg:
        reg.register("a", ADAPTERS / "llama_lora")
        with pytest.raises(peft_c.OverBudgetError) as info:
            reg.acquire("a")
        assert info.value.code == peft_c.ErrorCode.OVER_BUDGET == 30
        for bad in ("", "a\0b"):
            with pytest.raises(ValueError):
                reg.register(bad, ADAPTERS / "llama_lora")
        with pytest.raises(ValueError):
            reg.set_budget(-5)


def test_register_errors_leave_the_registry_unchanged(registry, tmp_path):
    with registry.acquire("llama_lora") as before:
        version = before.version
    with pytest.raises(peft_c.PeftError):
        registry.register("llama_lora", tmp_path / "missing")
    with pytest.raises(peft_c.PeftError):  # a llama adapter does not fit gpt2
        registry.register("llama_lora", ADAPTERS / "llama_lora", base_dir=GPT2)
    assert registry.names() == ["llama_lora", "llama_lora_second", "llama_rslora"]
    with registry.acquire("llama_lora") as after:
        assert after.version == version
    registry.register("validated", ADAPTERS / "llama_lora", base_dir=LLAMA)
    with pytest.raises(peft_c.NotFoundError) as info:
        registry.acquire("nope")
    assert isinstance(info.value, KeyError)
    with pytest.raises(peft_c.NotFoundError):
        registry.unregister("nope")


def test_register_memory_equals_the_folder(registry):
    folder = ADAPTERS / "llama_lora"
    config = (folder / "adapter_config.json").read_text()
    weights = (folder / "adapter_model.safetensors").read_bytes()
    registry.register_memory("text", config, weights)
    registry.register_memory("dict", json.loads(config), bytearray(weights))
    registry.register_memory("view", config, memoryview(weights))
    x, y0 = activations(), activations(seed=1)
    results = []
    for name in ("llama_lora", "text", "dict", "view"):
        y = y0.copy()
        with registry.acquire(name) as lease:
            assert lease.nbytes == lora_bytes("llama_lora", "F32")
            peft_c.lora_apply(Q0, [lease], None, x, y)
        results.append(y)
    for y in results[1:]:
        assert np.array_equal(y, results[0])
    with pytest.raises(peft_c.SafetensorsFormatError):
        registry.register_memory("bad", config, weights[:20])
    with pytest.raises(peft_c.InvalidConfigError):
        registry.register_memory("bad", "{not json", weights)
    with pytest.raises(peft_c.PeftError):
        registry.register_memory("bad", config, b"")
    assert "bad" not in registry.names()


@pytest.mark.parametrize("depth", [100_000, 1_000_000])
def test_deep_config_is_refused_not_a_crash(registry, depth):
    # A config nested this deep used to overflow the host's stack (SIGSEGV) while being read.
    weights = (ADAPTERS / "llama_lora" / "adapter_model.safetensors").read_bytes()
    config = '{"peft_type": "LORA", "r": 4, "x": ' + "[" * depth + "]" * depth + "}"
    with pytest.raises(peft_c.InvalidConfigError, match="nested deeper than 256 levels"):
        registry.register_memory("deep", config, weights)
    assert "deep" not in registry.names()


def test_fifo_config_is_refused_not_a_hang(registry, tmp_path):
    # Nothing ever writes to the FIFO: a blocking open of it would never return.
    folder = tmp_path / "fifo"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes((ADAPTERS / "llama_lora" / "adapter_model.safetensors").read_bytes())
    os.mkfifo(folder / "adapter_config.json")
    with pytest.raises(peft_c.IoError, match="not a regular file"):
        registry.register("fifo", folder)
    assert "fifo" not in registry.names()


def test_replacement_keeps_old_leases_working(registry):
    x, y0 = activations(), activations(seed=1)
    old = registry.acquire("llama_lora")
    registry.register("llama_lora", ADAPTERS / "llama_lora_second")  # replaces for new acquisitions
    new = registry.acquire("llama_lora")
    assert new.version > old.version and new.name == old.name == "llama_lora"
    assert registry.stats().loaded == 2  # both versions in memory while the old one is leased
    for lease, files in ((old, "llama_lora"), (new, "llama_lora_second")):
        y = y0.copy()
        peft_c.lora_apply(Q0, lease, None, x, y)
        assert_matches(y, expected_apply([files], None, Q0, x, y0), y0)
    old.release()
    assert registry.stats().loaded == 1  # the old version's memory went with its last lease
    registry.unregister("llama_lora")
    assert "llama_lora" not in registry.names()
    y = y0.copy()
    peft_c.lora_apply(Q0, new, None, x, y)  # unregistering leaves leases working
    assert_matches(y, expected_apply(["llama_lora_second"], None, Q0, x, y0), y0)
    new.release()


def test_budget_lru_trim_and_pins():
    one = lora_bytes("llama_lora", "F32")
    with peft_c.Registry("F32", 2 * one) as reg:
        for name in ("a", "b", "c"):
            reg.register(name, ADAPTERS / "llama_lora")
        reg.acquire("a").release()
        reg.acquire("b").release()
        reg.acquire("a").release()  # b is now the least recently used
        reg.acquire("c").release()  # evicts b
        stats = reg.stats()
        assert (stats.loaded, stats.loads, stats.hits, stats.evictions) == (2, 3, 1, 1)
        reg.acquire("a").release()
        assert reg.stats().hits == 2  # a stayed
        reg.acquire("b").release()
        assert reg.stats().loads == 4  # b had gone
        assert reg.stats().loaded_bytes <= 2 * one and reg.stats().peak_loaded_bytes == 2 * one

        pinned_a, pinned_b = reg.acquire("a"), reg.acquire("b")
        with pytest.raises(peft_c.OverBudgetError):  # nothing unpinned to evict
            reg.acquire("c")
        with pytest.raises(peft_c.OverBudgetError):
            reg.set_budget(one)
        assert reg.stats().budget_bytes == 2 * one  # unchanged
        reg.trim()
        assert reg.stats().loaded == 2  # pinned ones stay
        pinned_b.release()
        reg.set_budget(one)  # evicts b
        assert (reg.stats().loaded, reg.stats().budget_bytes) == (1, one)
        pinned_a.release()
        reg.trim()
        assert (reg.stats().loaded, reg.stats().loaded_bytes) == (0, 0)


# ---- lora_apply -------------------------------------------------------------------------------------

@pytest.mark.parametrize("storage", ["F32", "BF16", "F16"])
@pytest.mark.parametrize("dtype", ["F32", "BF16", "F16"])
def test_lora_apply_mixed_rows(storage, dtype):
    names = ["llama_lora", "llama_lora_second", "llama_rslora"]
    with peft_c.Registry(storage, BUDGET) as reg:
        for name in names:
            reg.register(name, ADAPTERS / name)
        leases = [reg.acquire(name) for name in names]
        rows = np.array([0, 1, -1, 2, 0, 2, 1, -1], dtype=np.int32)
        for module, out_features in ((Q0, 16), ("model.layers.1.self_attn.k_proj", 8),
                                     ("model.layers.0.mlp.down_proj.weight", 16)):
            in_features = 32 if "down_proj" in module else 16
            x = activations(len(rows), in_features, dtype)
            y0 = activations(len(rows), out_features, dtype, seed=2)
            y = y0.copy()
            peft_c.lora_apply(module, leases, rows, x, y)
            # llama_rslora has no MLP layers: its rows stay as they were there, as -1 rows do
            untouched = rows == -1
            if "mlp" in module:
                untouched |= rows == 2
            assert np.array_equal(y[untouched].view(np.uint8), y0[untouched].view(np.uint8))
            ours_rows = rows.copy()
            if "mlp" in module:
                ours_rows[rows == 2] = -1
            expected = expected_apply(names, ours_rows, module.removesuffix(".weight"), x, y0, storage)
            assert_matches(y, expected, y0)


def test_lora_apply_forms_of_the_arguments(registry):
    lease = registry.acquire("llama_lora")
    x, y0 = activations(5), activations(5, seed=1)
    expected = expected_apply(["llama_lora"], None, Q0, x, y0)
    for leases, rows in ((lease, None), ([lease], None), ((lease,), [0, 0, 0, 0, 0]),
                         ([lease], np.zeros(5, np.int64)), ([lease, lease], np.array([1, 0, 1, 0, 1], np.int16))):
        y = y0.copy()
        peft_c.lora_apply(Q0, leases, rows, x, y)
        assert_matches(y, expected, y0)
    read_only = x.copy()
    read_only.flags.writeable = False
    y = y0.copy()
    peft_c.lora_apply(Q0, lease, None, read_only, y)  # x is only read
    assert_matches(y, expected, y0)
    # mixed dtypes: bf16 activations, f32 output
    x16 = x.astype(ml_dtypes.bfloat16)
    y = y0.copy()
    peft_c.lora_apply(Q0, lease, None, x16, y)
    assert_matches(y, expected_apply(["llama_lora"], None, Q0, x16, y0), y0)
    # raw uint16 is not guessed to be bf16
    with pytest.raises(ValueError):
        peft_c.lora_apply(Q0, lease, None, x16.view(np.uint16), y)
    # zero rows do nothing
    for rows in (None, []):
        peft_c.lora_apply(Q0, lease, rows, np.zeros((0, 16), np.float32), np.zeros((0, 16), np.float32))
    # a layer no adapter has leaves every row as it was
    y = y0.copy()
    peft_c.lora_apply("model.layers.5.self_attn.q_proj", lease, None, x, y)
    assert np.array_equal(y, y0)


def test_lora_apply_torch_tensors(registry):
    torch = pytest.importorskip("torch")
    with registry.acquire("llama_lora_second") as lease:
        x, y0 = activations(4), activations(4, seed=1)
        y = torch.from_numpy(y0.copy()).to(torch.bfloat16)
        peft_c.lora_apply(Q0, lease, None, torch.from_numpy(x), y)
        expected = expected_apply(["llama_lora_second"], None, Q0, x, y0.astype(ml_dtypes.bfloat16))
        ours = y.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        assert_matches(ours, expected, y0)


def test_lora_apply_errors_leave_y_unchanged(registry):
    lease = registry.acquire("llama_lora")
    dora = peft_c.Registry("F32", BUDGET)
    dora.register("dora", ADAPTERS / "llama_dora")
    x, y0 = activations(4), activations(4, seed=1)
    y = y0.copy()

    def unchanged():
        assert np.array_equal(y, y0)

    with pytest.raises(peft_c.ShapeMismatchError):  # the layer has 16 input features
        peft_c.lora_apply(Q0, lease, None, activations(4, 12), y)
    unchanged()
    with pytest.raises(peft_c.ShapeMismatchError):
        peft_c.lora_apply(Q0, lease, None, x, np.zeros((4, 9), np.float32))
    with pytest.raises(peft_c.InvalidArgumentError):  # index out of range
        peft_c.lora_apply(Q0, [lease], [0, 1, 0, 0], x, y)
    unchanged()
    with pytest.raises(peft_c.InvalidArgumentError):
        peft_c.lora_apply(Q0, [lease], [0, -2, 0, 0], x, y)
    unchanged()
    with pytest.raises(peft_c.InvalidArgumentError):  # at least one lease
        peft_c.lora_apply(Q0, [], None, x, y)
    # a DoRA layer needs the host's base weight (Registry.set_base_weight) before it applies
    with dora.acquire("dora") as dora_lease, pytest.raises(peft_c.NotFoundError):
        peft_c.lora_apply(Q0, [lease, dora_lease], [0, 1, 0, 1], x, y)
    unchanged()
    # checked by the binding before the call
    with pytest.raises(ValueError):
        peft_c.lora_apply(Q0, lease, None, x, activations(3, seed=1))  # rows differ
    with pytest.raises(ValueError):
        peft_c.lora_apply(Q0, lease, [0, 0], x, y)  # one index per row
    with pytest.raises(ValueError):
        peft_c.lora_apply(Q0, lease, [2**31, 0, 0, 0], x, y)
    with pytest.raises(TypeError):
        peft_c.lora_apply(Q0, lease, [0.0, 0, 0, 0], x, y)
    with pytest.raises(TypeError):
        peft_c.lora_apply(Q0, ["llama_lora"], None, x, y)
    with pytest.raises(ValueError):
        peft_c.lora_apply(Q0, lease, None, x[:, ::2], y)  # not contiguous
    with pytest.raises(ValueError):
        peft_c.lora_apply(Q0, lease, None, x.astype(np.float64), y)
    with pytest.raises(ValueError):
        peft_c.lora_apply(Q0, lease, None, x.reshape(-1), y)  # not 2-D
    with pytest.raises(ValueError):
        peft_c.lora_apply(Q0, lease, None, x.astype(">f4"), y)
    frozen = y.copy()
    frozen.flags.writeable = False
    with pytest.raises(ValueError):
        peft_c.lora_apply(Q0, lease, None, x, frozen)
    with pytest.raises(ValueError):
        peft_c.lora_apply("a\0b", lease, None, x, y)
    unchanged()
    lease.release()
    with pytest.raises(ValueError):
        peft_c.lora_apply(Q0, lease, None, x, y)
    dora.close()


def test_translator_names():
    translator = peft_c.Translator.builtin("llama")
    native = translator.to_native(Q0 + ".weight")
    with peft_c.Registry("F32", BUDGET, translator) as reg:
        translator.close()  # the registry shares the table
        reg.register("a", ADAPTERS / "llama_lora")
        with reg.acquire("a") as lease:
            assert lease.has_module(native)
            x, y0 = activations(), activations(seed=1)
            y = y0.copy()
            peft_c.lora_apply(native, lease, None, x, y)
            assert_matches(y, expected_apply(["llama_lora"], None, Q0, x, y0), y0)
            with pytest.raises(peft_c.UnresolvedKeyError):
                peft_c.lora_apply("nonsense/name", lease, None, x, y)


def test_lora_apply_from_many_threads(registry):
    names = ["llama_lora", "llama_lora_second", "llama_rslora"]
    leases = [registry.acquire(name) for name in names]
    rows = np.arange(12, dtype=np.int32) % 4 - 1
    x, y0 = activations(12), activations(12, seed=1)
    reference = y0.copy()
    peft_c.lora_apply(Q0, leases, rows, x, reference)
    start = threading.Barrier(8)

    def worker(_):
        start.wait()
        for _ in range(200):
            y = y0.copy()
            peft_c.lora_apply(Q0, leases, rows, x, y)
            if not np.array_equal(y, reference):
                return False
        return True

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert all(pool.map(worker, range(8)))


# ---- lifetimes --------------------------------------------------------------------------------------

def test_lease_outlives_the_registry():
    reg = peft_c.Registry("BF16", BUDGET)
    reg.register("a", ADAPTERS / "llama_lora")
    lease = reg.acquire("a")
    handle = weakref.ref(reg._owned)
    reg.close()
    del reg
    gc.collect()
    assert handle() is None  # the registry object is gone, the C registry freed
    junk = [np.full(4096, 7.0) for _ in range(100)]  # reuse freed memory, were anything dangling
    x, y0 = activations(), activations(seed=1)
    y = y0.copy()
    peft_c.lora_apply(Q0, lease, None, x, y)
    assert_matches(y, expected_apply(["llama_lora"], None, Q0, x, y0, "BF16"), y0)
    assert lease.has_module(Q0)
    del junk
    lease.release()


def test_release_is_idempotent_and_blocks_use(registry):
    lease = registry.acquire("llama_lora")
    with lease:
        pass
    assert lease.released
    lease.release()
    with pytest.raises(ValueError):
        lease.has_module(Q0)
    with pytest.raises(ValueError):
        lease.__enter__()
    assert lease.name == "llama_lora" and "released" in repr(lease)
    assert registry.stats().pinned == 0


def test_forgotten_lease_is_released_by_the_collector(registry):
    lease = registry.acquire("llama_lora")
    owner = weakref.ref(lease._owned)
    lease.cycle = lease  # only the cyclic collector frees it
    assert registry.stats().pinned == 1
    del lease
    gc.collect()
    assert owner() is None
    assert registry.stats().pinned == 0


def test_closed_registry_refuses_use():
    reg = peft_c.Registry("F32", BUDGET)
    reg.close()
    reg.close()
    assert reg.closed and "closed" in repr(reg)
    for use in (reg.names, reg.stats, reg.trim, lambda: reg.acquire("a"), lambda: reg.register("a", ADAPTERS),
                lambda: reg.set_budget(1), lambda: reg.unregister("a"), reg.__enter__):
        with pytest.raises(ValueError):
            use()


def test_nothing_pickles(registry):
    with registry.acquire("llama_lora") as lease:
        for obj in (registry, lease, peft_c.HostModel()):
            with pytest.raises(TypeError):
                pickle.dumps(obj)


# ---- host models ----------------------------------------------------------------------------------------

def llama_weights(dtype="BF16"):
    """The tiny llama's projection weights, as writable arrays in ``dtype``."""
    tensors = load_file(str(LLAMA / "model.safetensors"))
    return {name: tensors[name].astype(np.float32).astype(NP_DTYPES[dtype])
            for name in tensors if name.endswith("_proj.weight")}


def merged_by_merge_into(name: str, weights: dict, scale: float = 1.0) -> dict:
    """What merging the adapter layer by layer with merge_into gives (copies)."""
    out = {key: value.copy() for key, value in weights.items()}
    with peft_c.Adapter.open(ADAPTERS / name) as adapter:
        for module in adapter:
            merged = out[module.name + ".weight"]
            peft_c.merge_into(adapter, module.name, merged, scale=scale)
    return out


@pytest.mark.parametrize("dtype", ["F32", "BF16", "F16"])
def test_swap_in_out_and_between(registry, dtype):
    weights = llama_weights(dtype)
    original = {key: value.copy() for key, value in weights.items()}
    with peft_c.HostModel() as host:
        for key, value in weights.items():
            host.add_weight(key, value)
        assert host.current is None
        with registry.acquire("llama_lora") as lease:
            stats = host.swap(lease)
        assert isinstance(stats, peft_c.SwapStats)
        assert (stats.layers_removed, stats.layers_merged) == (0, 14) and stats.saved_bytes > 0
        assert stats.remove_seconds >= 0 and stats.merge_seconds >= 0
        assert host.current == "llama_lora"
        expected = merged_by_merge_into("llama_lora", original)
        for key in weights:
            assert np.array_equal(weights[key].view(np.uint8), expected[key].view(np.uint8)), key
        with registry.acquire("llama_rslora") as lease:
            stats = host.swap(lease, 0.5)
        assert (stats.layers_removed, stats.layers_merged) == (14, 8)
        expected = merged_by_merge_into("llama_rslora", original, 0.5)
        for key in weights:
            assert np.array_equal(weights[key].view(np.uint8), expected[key].view(np.uint8)), key
        stats = host.swap(None)
        assert (stats.layers_removed, stats.layers_merged, host.current) == (8, 0, None)
        for key in weights:
            assert np.array_equal(weights[key].view(np.uint8), original[key].view(np.uint8)), key
        assert "0 weights" not in repr(host)


def test_host_model_pins_its_adapter_and_outlives_the_registry():
    reg = peft_c.Registry("F32", BUDGET)
    reg.register("a", ADAPTERS / "llama_lora")
    weights = llama_weights("F32")
    original = {key: value.copy() for key, value in weights.items()}
    host = peft_c.HostModel()
    for key, value in weights.items():
        host.add_weight(key, value)
    host.swap(reg.acquire("a"))  # the temporary lease goes at once; the host model keeps its own pin
    gc.collect()
    assert reg.stats().pinned == 1
    reg.trim()
    assert reg.stats().loaded == 1
    reg.close()
    del reg
    gc.collect()
    host.swap(None)  # the adapter is still there to take out
    for key in weights:
        assert np.array_equal(weights[key], original[key])
    host.close()


def test_host_model_keeps_its_arrays_alive():
    host = peft_c.HostModel()
    array = llama_weights("F32")["model.layers.0.self_attn.q_proj.weight"]
    alive = weakref.ref(array)
    host.add_weight("model.layers.0.self_attn.q_proj.weight", array)
    del array
    gc.collect()
    assert alive() is not None
    state = weakref.ref(host._owned)
    host.close()
    host.close()
    gc.collect()
    assert state() is None and alive() is None
    with pytest.raises(ValueError):
        host.swap(None)
    assert "closed" in repr(host)


def test_forgotten_host_model_unpins(registry):
    weights = llama_weights("F32")
    host = peft_c.HostModel()
    for key, value in weights.items():
        host.add_weight(key, value)
    with registry.acquire("llama_lora") as lease:
        host.swap(lease)
    assert registry.stats().pinned == 1
    del host
    gc.collect()
    assert registry.stats().pinned == 0


def test_host_model_errors_change_nothing(registry):
    weights = llama_weights("BF16")
    original = {key: value.copy() for key, value in weights.items()}
    partial = peft_c.HostModel()
    partial.add_weight(Q0 + ".weight", weights[Q0 + ".weight"])
    with registry.acquire("llama_lora") as lease:
        with pytest.raises(peft_c.UnresolvedKeyError):  # the adapter's other layers have no weight here
            partial.swap(lease)
    assert partial.current is None
    assert np.array_equal(weights[Q0 + ".weight"].view(np.uint16), original[Q0 + ".weight"].view(np.uint16))

    wrong = peft_c.HostModel()
    for key, value in weights.items():
        # k_proj as [8, 12] instead of [8, 16] ([16, 8] would be taken as a transposed layout)
        wrong.add_weight(key, value[:, :12].copy() if "k_proj" in key else value)
    with registry.acquire("llama_lora") as lease, pytest.raises(peft_c.ShapeMismatchError):
        wrong.swap(lease)
    for key in weights:
        assert np.array_equal(weights[key].view(np.uint16), original[key].view(np.uint16))

    host = peft_c.HostModel()
    for key, value in weights.items():
        host.add_weight(key, value)
    with pytest.raises(peft_c.InvalidArgumentError):  # a layer given twice
        host.add_weight(Q0, weights[Q0 + ".weight"])
    with pytest.raises(peft_c.InvalidArgumentError):  # translators go before the weights
        host.set_translator(peft_c.Translator.builtin("llama"))
    with pytest.raises(ValueError):
        host.add_weight("x", np.zeros((2, 2)))  # float64
    frozen = np.zeros((2, 2), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(ValueError):
        host.add_weight("x", frozen)
    with pytest.raises(peft_c.ShapeMismatchError):
        host.add_weight("model.layers.0.mlp.x.weight", np.zeros((0, 4), np.float32))
    with registry.acquire("llama_lora") as lease:
        with pytest.raises(ValueError):
            host.swap(lease, float("nan"))
        host.swap(lease)
        with pytest.raises(peft_c.InvalidArgumentError):  # no weights while an adapter is merged
            host.add_weight("lm_head.weight", np.zeros((64, 16), np.float32))
        weights[Q0 + ".weight"][0, 0] += 1  # someone else wrote into a merged buffer
        host.swap(None)  # exact mode writes the original bytes back, whatever the buffer holds
        for key in weights:
            assert np.array_equal(weights[key].view(np.uint16), original[key].view(np.uint16)), key


def test_host_model_with_a_translator(registry):
    translator = peft_c.Translator.builtin("llama")
    weights = llama_weights("F32")
    original = {key: value.copy() for key, value in weights.items()}
    with peft_c.HostModel() as host:
        host.set_translator(translator)
        for key, value in weights.items():
            host.add_weight(translator.to_native(key), value)
        with registry.acquire("llama_lora_second") as lease:
            host.swap(lease)
        expected = merged_by_merge_into("llama_lora_second", original)
        for key in weights:
            assert np.array_equal(weights[key], expected[key]), key


def test_inexact_swap_is_peft_unmerge(registry):
    weights = llama_weights("BF16")
    original = {key: value.copy() for key, value in weights.items()}
    with peft_c.HostModel() as host:
        host.set_exact(False)
        for key, value in weights.items():
            host.add_weight(key, value)
        with registry.acquire("llama_lora") as lease:
            assert host.swap(lease).saved_bytes == 0
        merged = {key: value.astype(np.float32) for key, value in weights.items()}
        assert host.swap(None).layers_removed == 14
        for key in weights:
            # round(round(W + dW) - dW): off by at most the rounding of the merge, one bf16 step at the
            # size of the merged value (more than W's own step where the delta is larger than W)
            ours, theirs = weights[key].astype(np.float32), original[key].astype(np.float32)
            size = np.maximum(np.abs(theirs), np.abs(merged[key]))
            assert np.all(np.abs(ours - theirs) <= np.spacing(size) * 2**16), key


def test_lora_bias_needs_the_bias_buffer():
    tensors = load_file(str(FIXTURES / "models" / "qwen2" / "model.safetensors"))
    with peft_c.Registry("F32", BUDGET) as reg:
        reg.register("bias", ADAPTERS / "qwen2_lora_bias")
        names = sorted({key.rsplit(".", 1)[0] for key in tensors if key.endswith("proj.weight")})
        without = peft_c.HostModel()
        with_bias = peft_c.HostModel()
        arrays = {}
        for name in names:
            weight = tensors[name + ".weight"].astype(np.float32)
            bias = tensors.get(name + ".bias")
            without.add_weight(name + ".weight", weight.copy())
            arrays[name] = (weight, None if bias is None else bias.astype(np.float32))
            with_bias.add_weight(name + ".weight", arrays[name][0], bias=arrays[name][1])
        with reg.acquire("bias") as lease:
            with pytest.raises(peft_c.InvalidArgumentError):
                without.swap(lease)
            with_bias.swap(lease)
        with peft_c.Adapter.open(ADAPTERS / "qwen2_lora_bias") as adapter:
            for module in adapter:
                weight, bias = (value.copy() if value is not None else None
                                for value in (tensors[module.name + ".weight"].astype(np.float32),
                                              tensors[module.name + ".bias"].astype(np.float32)))
                peft_c.merge_into(adapter, module.name, weight, bias=bias)
                assert np.array_equal(arrays[module.name][0], weight)
                assert np.array_equal(arrays[module.name][1], bias)


@pytest.mark.parametrize("change", [-1, 1])
def test_lora_bias_of_another_length_is_refused_at_swap(change):
    """A bias one element shorter or longer than v_proj's 8 output features: the swap fails with
    ShapeMismatchError naming the layer, and no array changes (the bias is not written past its end)."""
    tensors = load_file(str(FIXTURES / "models" / "qwen2" / "model.safetensors"))
    wrong = "model.layers.0.self_attn.v_proj"
    with peft_c.Registry("F32", BUDGET) as reg, peft_c.HostModel() as host:
        reg.register("bias", ADAPTERS / "qwen2_lora_bias")
        arrays = {}
        for name in sorted({key.rsplit(".", 1)[0] for key in tensors if key.endswith("proj.weight")}):
            weight = tensors[name + ".weight"].astype(np.float32)
            bias = tensors.get(name + ".bias")
            bias = None if bias is None else bias.astype(np.float32)
            if name == wrong:
                assert bias.shape == (8,)
                bias = np.resize(bias, 8 + change)
            arrays[name] = (weight, bias)
            host.add_weight(name + ".weight", weight, bias=bias)
        before = {name: tuple(None if a is None else a.copy() for a in pair) for name, pair in arrays.items()}
        with reg.acquire("bias") as lease, pytest.raises(peft_c.ShapeMismatchError, match="v_proj"):
            host.swap(lease)
        assert host.current is None
        for name, pair in arrays.items():
            for got, was in zip(pair, before[name]):
                assert (got is None and was is None) or np.array_equal(got.view(np.uint32), was.view(np.uint32)), name


def test_empty_bias_is_refused():
    with peft_c.HostModel() as host, pytest.raises(peft_c.ShapeMismatchError):
        host.add_weight(Q0 + ".weight", np.zeros((16, 16), np.float32), bias=np.zeros(0, np.float32))
