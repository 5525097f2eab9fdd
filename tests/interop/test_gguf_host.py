"""Hot-swap on host buffers named by GGUF names, against llama.cpp itself.

A llama.cpp-family host holds the base as loaded from its GGUF file: here the tiny fixture models
converted by `convert_hf_to_gguf.py`, every F32/F16 weight read into a numpy array with peft_c's own
checkpoint reader (shape outermost first, rows as the file holds them: LLaMA's attn_q and attn_k in
the converter's RoPE order), and given to a host model by its GGUF name through a translator made
from the GGUF file (`peft_translator_from_gguf`, called through ctypes: the Python binding does not
wrap it yet). A registry's adapter swapped in must give

- bit for bit the tensors of `peftc merge --base BASE.gguf` (the same arithmetic, the delta's rows
  permuted instead of the base's), DoRA included;
- within 1e-6 relative the tensors of `llama-export-lora` with the adapter exported by
  `peftc adapter export ... --format gguf` (F32 bases; llama.cpp sums in another order);

and a swap back to none the file's bytes exactly.

Skipped (with the reason) when PEFT_LLAMA_CPP_BIN is not set; scripts/test.sh sets it.
"""

from __future__ import annotations

import ctypes
import pathlib

import numpy as np
import pytest

from gguf_reference import convert_hf_to_gguf, export_lora, run_peftc, tensors

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
MODELS = FIXTURES / "models"
ADAPTERS = FIXTURES / "adapters"

# (base model, adapter, GGUF type of the base, whether llama.cpp can take the adapter).
CASES = [
    ("llama", "llama_lora", "f32", True),
    ("llama", "llama_rslora", "f32", True),
    ("llama", "llama_all_linear", "f32", True),
    ("llama", "llama_dora", "f32", False),
    ("llama", "llama_lora", "f16", False),
    ("qwen2", "qwen2_lora", "f32", True),
]


def gguf_tensors(path: pathlib.Path) -> dict[str, np.ndarray]:
    """name -> values as gguf-py reads them (outermost dimension first)."""
    return {name: values for name, (_, _, values) in tensors(path).items()}


def translator_from_gguf(peft_c, checkpoint):
    """A translator for GGUF names from an opened GGUF checkpoint (peft_translator_from_gguf)."""
    from peft_c._handle import Owned, handle_of
    from peft_c._lib import check, lib

    function = lib()._cdll.peft_translator_from_gguf
    function.restype = ctypes.c_void_p
    function.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
    out = ctypes.c_void_p()
    check(function(handle_of(checkpoint).ptr, ctypes.byref(out)))
    return peft_c.Translator(Owned(out.value, "peft_translator_free"))


def host_buffers(peft_c, checkpoint, translator) -> dict[str, np.ndarray]:
    """Every float weight of the file that the translator names, in its own dtype (F32 or F16)."""
    buffers = {}
    for info in checkpoint.tensors():
        if len(info.shape) != 2 or info.dtype not in ("F32", "F16"):
            continue
        try:
            translator.to_hf(info.name)
        except peft_c.UnresolvedKeyError:
            continue  # norms and other tensors no adapter layer addresses
        buffers[info.name] = checkpoint.read(info.name, dtype=None)
    return buffers


@pytest.mark.parametrize("model,adapter,outtype,llama_cpp_takes_it", CASES,
                         ids=[f"{a}-{t}" for _, a, t, _ in CASES])
def test_swap_into_gguf_buffers(peft_c, peftc_binary, tmp_path, model, adapter, outtype, llama_cpp_takes_it):
    base_gguf = convert_hf_to_gguf(MODELS / model, outtype=outtype)
    merged_by_peftc = tmp_path / "peftc_merged.gguf"
    run_peftc(peftc_binary, "merge", "--base", base_gguf, "--adapter", ADAPTERS / adapter, "--out", merged_by_peftc)
    want = gguf_tensors(merged_by_peftc)
    base = gguf_tensors(base_gguf)

    checkpoint = peft_c.Checkpoint.open(base_gguf)
    translator = translator_from_gguf(peft_c, checkpoint)
    assert translator.to_native("model.layers.0.self_attn.q_proj.weight") == "blk.0.attn_q.weight"
    buffers = host_buffers(peft_c, checkpoint, translator)
    original = {name: array.copy() for name, array in buffers.items()}
    assert "blk.0.attn_q.weight" in buffers

    host = peft_c.HostModel()
    host.set_translator(translator)
    for name, array in buffers.items():
        host.add_weight(name, array)
    with peft_c.Registry("F32", 1 << 26) as registry:
        registry.register("a", ADAPTERS / adapter)
        lease = registry.acquire("a")
        stats = host.swap(lease, 1.0)
        lease.release()
    assert stats.layers_merged > 0

    changed = set()
    for name, array in buffers.items():
        assert array.dtype == want[name].dtype and array.shape == want[name].shape, name
        assert array.tobytes() == want[name].tobytes(), name  # bit for bit
        if array.tobytes() != base[name].tobytes():
            changed.add(name)
    assert "blk.0.attn_q.weight" in changed and "blk.1.attn_v.weight" in changed
    if model == "llama":
        assert "blk.0.attn_k.weight" in changed or adapter == "llama_dora"  # the DoRA adapter leaves k alone

    if llama_cpp_takes_it:
        exported = tmp_path / "adapter.gguf"
        run_peftc(peftc_binary, "adapter", "export", ADAPTERS / adapter, exported, "--format", "gguf",
                  "--base", base_gguf)
        reference = gguf_tensors(export_lora(base_gguf, [(exported, 1.0)], tmp_path / "llama_merged.gguf"))
        for name, array in buffers.items():
            ours, theirs = array.astype(np.float64), reference[name].astype(np.float64)
            scale = max(float(np.max(np.abs(theirs))), 1e-30)
            assert float(np.max(np.abs(ours - theirs))) / scale <= 1e-6, name

    host.swap(None)
    for name, array in buffers.items():
        assert array.tobytes() == original[name].tobytes(), name
        assert array.tobytes() == base[name].tobytes(), name
    host.close()


def test_rope_rows_are_the_deltas(peft_c, tmp_path):
    """Without the row order, attn_q would get PyTorch's rows: the swap's q delta, put back in
    PyTorch's row order, is PEFT's B @ A (scaled) for the module, row for row."""
    base_gguf = convert_hf_to_gguf(MODELS / "llama", outtype="f32")
    checkpoint = peft_c.Checkpoint.open(base_gguf)
    translator = translator_from_gguf(peft_c, checkpoint)
    buffers = host_buffers(peft_c, checkpoint, translator)
    original = {name: array.copy() for name, array in buffers.items()}
    host = peft_c.HostModel()
    host.set_translator(translator)
    for name, array in buffers.items():
        host.add_weight(name, array)
    adapter = peft_c.Adapter.open(ADAPTERS / "llama_lora")
    with peft_c.Registry("F32", 1 << 26) as registry:
        registry.register("a", ADAPTERS / "llama_lora")
        lease = registry.acquire("a")
        host.swap(lease, 1.0)
        lease.release()
    heads = {"blk.0.attn_q.weight": 2, "blk.0.attn_k.weight": 1}  # the fixture's head counts
    modules = {"blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj",
               "blk.0.attn_k.weight": "model.layers.0.self_attn.k_proj"}
    for name, module in modules.items():
        delta = buffers[name].astype(np.float64) - original[name].astype(np.float64)
        rows = delta.shape[0]
        d = rows // heads[name]
        # GGUF row h*d + 2i + j holds PyTorch row h*d + j*d/2 + i.
        pytorch = np.empty_like(delta)
        for r in range(rows):
            h, i, j = r // d, (r % d) // 2, r % 2
            pytorch[h * d + j * (d // 2) + i] = delta[r]
        a = adapter.read(module, "lora_A.weight").astype(np.float64)
        b = adapter.read(module, "lora_B.weight").astype(np.float64)
        scaling = adapter.module(module).scaling
        expected = scaling * (b @ a)
        assert np.allclose(pytorch, expected, rtol=1e-5, atol=1e-6), name
        assert not np.allclose(delta, expected, rtol=1e-5, atol=1e-6), name  # the order matters here
    host.swap(None)
    host.close()
