"""Control vectors (issue 33, item 5) against their references: gguf-py (how repeng's ``export_gguf``
writes llama.cpp's files), Python safetensors, llama.cpp's own loader and forward, and transformers.

Shown here:
* The GGUF file ``peftc control combine`` writes is byte for byte the one gguf-py writes for the same
  directions the way repeng does (architecture ``controlvector``, ``controlvector.model_hint``,
  ``controlvector.layer_count``, ``direction.N`` F32); the safetensors file is byte for byte
  ``safetensors.numpy.save_file``'s.
* llama.cpp's loader (``common_control_vector_load``, through the test driver ``llama_cvec_driver``,
  as ``llama-cli --control-vector-scaled`` calls it) reads exactly the values peft_c wrote, and when
  given several files at strengths, sums them to exactly what ``peftc control combine`` writes for
  the same files and strengths (llama.cpp's f32 arithmetic).
* The meaning of a layer number is llama.cpp's: llama.cpp's logits with the control vector applied
  equal transformers' forward in which a hook adds the direction to decoder layer N's output through
  ``peft_control_vector_apply`` (the call a host makes), within 1e-5 of the logits' scale (2e-7 seen), while the
  steering itself moves the logits by far more than that.
* Files llama.cpp refuses (``direction.0``, F16, 2-D, mixed lengths, other tensor names) peft_c refuses
  too, with INVALID_CHECKPOINT naming the tensor; ``peftc inspect`` lists each layer's norm.
"""
from __future__ import annotations

import ctypes
import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

from gguf_reference import convert_hf_to_gguf, gguf_module, run_peftc  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
BASE = REPO / "tests" / "fixtures" / "models" / "llama"
DRIVER = pathlib.Path(os.environ.get("PEFT_LLAMA_CVEC_DRIVER")
                      or REPO / "build" / "tests" / "interop" / "llama_cvec_driver")
HIDDEN = 16  # the tiny llama's hidden size
PROMPT = [1, 3, 5, 17, 9, 22, 30, 5]


def directions(seed: int, layers=(1, 2, 10), n_embd: int = HIDDEN) -> dict[int, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {layer: rng.standard_normal(n_embd).astype(np.float32) for layer in layers}


def safetensors_input(path: pathlib.Path, dirs: dict[int, np.ndarray], hint: str | None = "llama") -> pathlib.Path:
    from safetensors.numpy import save_file
    save_file({f"model.layers.{layer}": v for layer, v in dirs.items()}, str(path),
              metadata={"model_hint": hint} if hint else None)
    return path


def gguf_py_file(path: pathlib.Path, dirs: dict[int, np.ndarray], hint: str) -> pathlib.Path:
    """What repeng's ControlVector.export_gguf writes, through gguf-py."""
    gguf = gguf_module()
    writer = gguf.GGUFWriter(str(path), "controlvector")
    writer.add_string("controlvector.model_hint", hint)
    writer.add_uint32("controlvector.layer_count", len(dirs))
    for layer in sorted(dirs):
        writer.add_tensor(f"direction.{layer}", dirs[layer])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def driver(model: pathlib.Path, *files_and_strengths) -> subprocess.CompletedProcess:
    if not DRIVER.exists():
        pytest.skip(f"{DRIVER} not built (configure with the llama.cpp reference build's environment)")
    args = [str(DRIVER), str(model), ",".join(map(str, PROMPT))]
    for path, strength in files_and_strengths:
        args += [str(path), repr(float(strength))]
    return subprocess.run(args, capture_output=True, text=True)


def llama_reads(model, *files_and_strengths) -> dict:
    proc = driver(model, *files_and_strengths)
    assert proc.returncode == 0, f"llama.cpp did not load the control vectors: {proc.stderr}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def base_gguf() -> pathlib.Path:
    pytest.importorskip("torch")
    return convert_hf_to_gguf(BASE, outtype="f32")


def test_files_are_byte_identical_to_gguf_py_and_safetensors(peftc_binary, tmp_path):
    dirs = directions(0)
    src = safetensors_input(tmp_path / "in.safetensors", dirs)
    ours = tmp_path / "ours.gguf"
    run_peftc(peftc_binary, "control", "combine", ours, src)
    reference = gguf_py_file(tmp_path / "reference.gguf", dirs, "llama")
    assert ours.read_bytes() == reference.read_bytes()

    from safetensors.numpy import save_file
    ours_st = tmp_path / "ours.safetensors"
    run_peftc(peftc_binary, "control", "combine", ours_st, ours)
    save_file({f"direction.{layer}": v for layer, v in dirs.items()}, str(tmp_path / "reference.safetensors"),
              metadata={"model_hint": "llama"})
    assert ours_st.read_bytes() == (tmp_path / "reference.safetensors").read_bytes()

    # A gguf-py file reads back to the same values, and peftc inspect reports each layer's norm.
    listing = json.loads(run_peftc(peftc_binary, "inspect", "--json", reference).stdout)["control_vector"]
    assert listing["n_embd"] == HIDDEN and listing["model_hint"] == "llama"
    assert [entry["layer"] for entry in listing["layers"]] == sorted(dirs)
    for entry in listing["layers"]:
        assert entry["norm"] == pytest.approx(float(np.linalg.norm(dirs[entry["layer"]].astype(np.float64))), rel=1e-12)


def test_llama_cpp_reads_exactly_what_peft_c_writes_and_sums_alike(peftc_binary, base_gguf, tmp_path):
    first, second = directions(1, layers=(1,)), directions(2, layers=(1, 3))
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    run_peftc(peftc_binary, "control", "combine", a, safetensors_input(tmp_path / "a.safetensors", first))
    run_peftc(peftc_binary, "control", "combine", b, safetensors_input(tmp_path / "b.safetensors", second))

    read = llama_reads(base_gguf, (a, 1.0))
    assert read["n_embd"] == HIDDEN
    np.testing.assert_array_equal(np.array(read["data"], np.float32), first[1])

    strengths = (0.7, -1.3)
    read = llama_reads(base_gguf, (a, strengths[0]), (b, strengths[1]))
    combined = tmp_path / "combined.gguf"
    run_peftc(peftc_binary, "control", "combine", combined, f"{a}:{strengths[0]}", f"{b}:{strengths[1]}")
    ours = gguf_module().GGUFReader(str(combined))
    by_layer = {int(t.name.split(".")[1]): np.array(t.data, np.float32) for t in ours.tensors}
    # llama.cpp's buffer holds layers 1..max, a missing layer as zeros.
    want = np.concatenate([by_layer.get(layer, np.zeros(HIDDEN, np.float32)) for layer in range(1, 4)])
    np.testing.assert_array_equal(np.array(read["data"], np.float32), want)
    s0, s1 = np.float32(strengths[0]), np.float32(strengths[1])
    np.testing.assert_array_equal(by_layer[1], first[1] * s0 + second[1] * s1)


def hf_logits(steer: dict[int, np.ndarray] | None, peft_c_lib) -> np.ndarray:
    """transformers' forward of the tiny llama; a hook adds each direction to its layer's output through
    peft_control_vector_apply, on the activations as a host holds them."""
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32).eval()
    lib = ctypes.CDLL(str(peft_c_lib))
    P = ctypes.c_void_p
    lib.peft_control_vector_new.argtypes = [ctypes.c_uint64, ctypes.c_char_p, ctypes.POINTER(P)]
    lib.peft_control_vector_new.restype = P
    lib.peft_control_vector_set_direction.argtypes = [P, ctypes.c_int64, ctypes.c_int32, P]
    lib.peft_control_vector_set_direction.restype = P
    lib.peft_control_vector_apply.argtypes = [P, ctypes.c_int64, ctypes.c_double, P, ctypes.c_int32, ctypes.c_uint64, P]
    lib.peft_control_vector_apply.restype = P
    lib.peft_control_vector_free.argtypes = [P]
    vector = P()
    assert not lib.peft_control_vector_new(HIDDEN, None, ctypes.byref(vector))
    handles = []
    for layer, direction in (steer or {}).items():
        assert not lib.peft_control_vector_set_direction(vector, layer, 17, direction.ctypes.data)

        def hook(_module, _inputs, output, layer=layer):
            hidden = output[0] if isinstance(output, tuple) else output
            array = np.ascontiguousarray(hidden.detach().numpy(), dtype=np.float32)
            rows = array.size // HIDDEN
            assert not lib.peft_control_vector_apply(vector, layer, 1.0, array.ctypes.data, 17, rows, None)
            steered = torch.from_numpy(array)
            return (steered, *output[1:]) if isinstance(output, tuple) else steered
        handles.append(model.model.layers[layer].register_forward_hook(hook))
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT])).logits[0].numpy()
    for handle in handles:
        handle.remove()
    lib.peft_control_vector_free(vector)
    return logits


def test_llama_cpp_steers_the_layer_transformers_hooks_steer(peftc_binary, peft_c_lib, base_gguf, tmp_path):
    steer = {1: 3.0 * directions(3, layers=(1,))[1]}  # the tiny llama has 2 layers; llama.cpp steers 1..n-1
    path = tmp_path / "steer.gguf"
    run_peftc(peftc_binary, "control", "combine", path, safetensors_input(tmp_path / "steer.safetensors", steer))
    read = llama_reads(base_gguf, (path, 1.0))
    steered, plain = np.array(read["logits"]), np.array(read["plain_logits"])
    want_steered, want_plain = hf_logits(steer, peft_c_lib), hf_logits(None, peft_c_lib)
    scale = float(np.abs(want_steered).max())
    # Both forwards are f32 (the driver keeps an f32 cache, without flash attention): 2e-7 of the scale
    # was measured; the bound leaves room for other summation orders.
    assert float(np.abs(plain - want_plain).max()) <= 1e-5 * scale
    difference = float(np.abs(steered - want_steered).max())
    effect = float(np.abs(want_steered - want_plain).max())
    assert difference <= 1e-5 * scale, f"llama.cpp and the hooked forward differ by {difference:.3g}"
    assert effect >= 1e3 * difference and effect > 1e-2 * scale, f"the steering moves the logits by {effect:.3g} only"


@pytest.mark.parametrize("case", ["direction.0", "f16", "2-D", "lengths", "name"])
def test_what_llama_cpp_refuses_peft_c_refuses(case, peftc_binary, base_gguf, tmp_path):
    gguf = gguf_module()
    path = tmp_path / f"{case}.gguf"
    writer = gguf.GGUFWriter(str(path), "controlvector")
    one = np.ones(HIDDEN, np.float32)
    tensors = {"direction.0": {"direction.0": one},
               "f16": {"direction.1": one.astype(np.float16)},
               "2-D": {"direction.1": np.ones((2, HIDDEN), np.float32)},
               "lengths": {"direction.1": one, "direction.2": np.ones(HIDDEN + 1, np.float32)},
               "name": {"blk.1.attn_q.weight": one}}[case]
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert driver(base_gguf, (path, 1.0)).returncode == 3, "llama.cpp loaded it"
    proc = run_peftc(peftc_binary, "control", "combine", tmp_path / "out.gguf", path, expect=1)
    assert "INVALID_CHECKPOINT" in proc.stderr and list(tensors)[-1] in proc.stderr, proc.stderr
