"""`peftc model combine`: whole-model task arithmetic over fine-tuned checkpoints of one base, against a numpy
reference of the same formula (written here from PEFT's merge_utils definitions, independently of peft_c):

    out = W + combine_i(w_i, M_i - W)      per floating-point tensor, differences in f32

with linear, ties (total and frequency), magnitude_prune, dare_linear and dare_ties (DARE's masks from the formula
in include/peft_c.h, factor 2, the tensor's name as the stream). The outputs load in transformers, whose logits
equal those of the reference weights; a bf16 base is rounded once; sharding and the other files follow the base;
bad inputs are refused with their codes and nothing is written.

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA (see conftest.py).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.numpy import load_file as load_numpy  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

from merge_support import dare_keep  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = pathlib.Path(os.environ.get("PEFT_TEST_DATA") or REPO / "tests" / "fixtures")
LLAMA = FIXTURES / "models" / "llama"
IDS = torch.tensor([[1, 5, 7, 9, 11, 3, 2, 4]])


def run(peftc, *args, ok=True):
    result = subprocess.run([str(peftc), *map(str, args)], capture_output=True, text=True)
    if ok:
        assert result.returncode == 0, result.stderr
    return result


def fine_tune(base: pathlib.Path, out: pathlib.Path, seed: int, scale=0.02) -> pathlib.Path:
    """The base with every float tensor moved by seeded noise, saved as transformers saves it."""
    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype="auto")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_((scale * torch.randn(p.shape, generator=gen)).to(p.dtype))
    model.save_pretrained(out)
    return out



def reference(method, base, models, weights, density=1.0, sign="total", seed=0):
    """numpy, f32: the formula of merge_utils.task_arithmetic / ties / dare_* / magnitude_prune on M_i - W."""
    out = {}
    w32 = np.array(weights, dtype=np.float32)
    for name, w in base.items():
        w = w.astype(np.float32)
        diffs = [m[name].astype(np.float32) - w for m in models]
        flat = [d.reshape(-1) for d in diffs]
        if method in ("ties", "magnitude_prune"):
            k = int(density * flat[0].size)
            pruned = []
            for d in flat:
                keep = np.zeros(d.size, dtype=bool)
                order = np.argsort(-np.abs(d), kind="stable")  # equal magnitudes: the lower index first
                keep[order[:k]] = True
                pruned.append(np.where(keep, d, np.float32(0)))
            flat = pruned
        elif method.startswith("dare"):
            flat = [np.where(np.array(dare_keep(seed, name, i, 2, d.size, density)), d, np.float32(0)) / np.float32(density)
                    for i, d in enumerate(flat)]
        stacked = np.stack(flat)
        if method in ("ties", "dare_ties"):
            votes = stacked if sign == "total" else np.sign(stacked)
            majority = np.where(votes.sum(axis=0) >= 0, np.float32(1), np.float32(-1))
            agree = np.sign(stacked) == majority
            mixed = (stacked * w32[:, None] * agree).sum(axis=0)
            combined = mixed / np.maximum(agree.sum(axis=0), 1).astype(np.float32)
        else:
            combined = (stacked * w32[:, None]).sum(axis=0)
        out[name] = w + combined.reshape(w.shape)
    return out


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    root = tmp_path_factory.mktemp("tuned")
    return [fine_tune(LLAMA, root / f"m{i}", seed=100 + i) for i in range(3)]


CASES = [
    ("linear", {}),
    ("ties", {"density": 0.4, "sign": "total"}),
    ("ties", {"density": 0.7, "sign": "frequency"}),
    ("magnitude_prune", {"density": 0.5}),
    ("dare_linear", {"density": 0.6, "seed": 11}),
    ("dare_ties", {"density": 0.5, "sign": "frequency", "seed": 12}),
]


@pytest.mark.parametrize("method,settings", CASES, ids=[f"{m}-{'-'.join(map(str, s.values()))}" for m, s in CASES])
def test_combination_equals_the_numpy_formula(method, settings, tuned, peftc_binary, tmp_path):
    weights = [0.6, -0.3, 0.9]
    out = tmp_path / "out"
    args = ["model", "combine", "--base", LLAMA, "--method", method, "--out", out]
    if "density" in settings:
        args += ["--density", repr(settings["density"])]
    if "sign" in settings:
        args += ["--majority-sign", settings["sign"]]
    if "seed" in settings:
        args += ["--seed", str(settings["seed"])]
    for m, w in zip(tuned, weights):
        args += ["--model", f"{m}:{w!r}"]
    run(peftc_binary, *args)
    base = load_numpy(str(LLAMA / "model.safetensors"))
    models = [load_numpy(str(m / "model.safetensors")) for m in tuned]
    expected = reference(method, base, models, weights, **settings)
    ours = load_numpy(str(out / "model.safetensors"))
    assert ours.keys() == expected.keys()
    for name, value in expected.items():
        assert ours[name].dtype == np.float32
        np.testing.assert_allclose(ours[name], value, rtol=1e-6, atol=1e-7, err_msg=name)
    # The other files are the base's, and transformers loads the result: logits of the reference weights.
    assert (out / "config.json").read_bytes() == (LLAMA / "config.json").read_bytes()
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    reference_model = transformers.AutoModelForCausalLM.from_pretrained(LLAMA).eval()
    reference_model.load_state_dict({k: torch.from_numpy(v) for k, v in expected.items()}, strict=False)
    with torch.no_grad():
        assert torch.allclose(model(input_ids=IDS).logits, reference_model(input_ids=IDS).logits, rtol=1e-5, atol=1e-6)
    if method.startswith("dare") or method in ("ties", "magnitude_prune"):
        # The pruning did something: the result differs from the plain weighted sum.
        plain = reference("linear", base, models, weights)
        assert any(not np.allclose(ours[n], plain[n]) for n in plain)


def test_bf16_base_is_rounded_once_and_sharding_follows_the_options(peftc_binary, tmp_path):
    base_dir = FIXTURES / "models" / "llama_bf16"
    tuned = [fine_tune(base_dir, tmp_path / f"b{i}", seed=200 + i) for i in range(2)]
    weights = [1.0, 0.5]
    out = tmp_path / "out"
    run(peftc_binary, "model", "combine", "--base", base_dir, "--method", "linear", "--out", out,
        "--model", f"{tuned[0]}:1.0", "--model", f"{tuned[1]}:0.5", "--max-shard-size", "6KB")
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    ours = {}
    for f in set(index["weight_map"].values()):
        ours.update(load_file(str(out / f)))
    base = {k: v.float().numpy() for k, v in load_file(str(base_dir / "model.safetensors")).items()}
    models = [{k: v.float().numpy() for k, v in load_file(str(m / "model.safetensors")).items()} for m in tuned]
    expected = reference("linear", base, models, weights)
    for name, value in expected.items():
        assert ours[name].dtype == torch.bfloat16, name
        rounded = torch.from_numpy(value).to(torch.bfloat16)
        # One rounding of the f32 result; f32 sums that differ in the last bit may round one bf16 step apart.
        different = (ours[name].float() != rounded.float())
        assert int(different.sum()) <= max(1, different.numel() // 1000), name
    transformers.AutoModelForCausalLM.from_pretrained(out)


def test_bad_inputs_are_refused_and_nothing_is_written(tuned, peftc_binary, tmp_path):
    out = tmp_path / "bad"
    # A model without one of the base's tensors.
    missing = tmp_path / "missing"
    missing.mkdir()
    tensors = load_file(str(tuned[0] / "model.safetensors"))
    dropped = sorted(tensors)[0]
    del tensors[dropped]
    save_file(tensors, str(missing / "model.safetensors"), metadata={"format": "pt"})
    (missing / "config.json").write_bytes((tuned[0] / "config.json").read_bytes())
    result = run(peftc_binary, "model", "combine", "--base", LLAMA, "--method", "linear", "--out", out,
                 "--model", f"{missing}:1", ok=False)
    assert result.returncode == 1 and "NOT_FOUND" in result.stderr and dropped in result.stderr, result.stderr
    # Another shape.
    reshaped = tmp_path / "reshaped"
    reshaped.mkdir()
    tensors = load_file(str(tuned[0] / "model.safetensors"))
    name = next(k for k, v in tensors.items() if v.dim() == 2)
    tensors[name] = tensors[name][:-1].contiguous()
    save_file(tensors, str(reshaped / "model.safetensors"), metadata={"format": "pt"})
    (reshaped / "config.json").write_bytes((tuned[0] / "config.json").read_bytes())
    result = run(peftc_binary, "model", "combine", "--base", LLAMA, "--method", "linear", "--out", out,
                 "--model", f"{reshaped}:1", ok=False)
    assert result.returncode == 1 and "SHAPE_MISMATCH" in result.stderr and name in result.stderr, result.stderr
    # Pruning without a density; an output over an input; a method of the adapter combinations only.
    result = run(peftc_binary, "model", "combine", "--base", LLAMA, "--method", "ties", "--out", out,
                 "--model", f"{tuned[0]}:1", ok=False)
    assert result.returncode == 1 and "density" in result.stderr
    result = run(peftc_binary, "model", "combine", "--base", LLAMA, "--method", "linear", "--out", tuned[1],
                 "--model", f"{tuned[1]}:1", ok=False)
    assert result.returncode == 1 and "INVALID_ARGUMENT" in result.stderr
    result = run(peftc_binary, "model", "combine", "--base", LLAMA, "--method", "cat", "--out", out,
                 "--model", f"{tuned[0]}:1", ok=False)
    assert result.returncode == 2
    assert not out.exists()


# --- GGUF files -------------------------------------------------------------------------------------------

def gguf_values(path) -> dict:
    """name -> (ggml type name, f32 values as gguf-py dequantizes them, raw bytes)."""
    from gguf_reference import gguf_module, read_gguf
    gguf = gguf_module()
    out = {}
    for t in read_gguf(path).tensors:
        raw = np.array(t.data)
        values = gguf.quants.dequantize(raw, t.tensor_type).astype(np.float32)
        out[t.name] = (t.tensor_type.name, values, raw)
    return out


@pytest.mark.parametrize("outtype", ["f32", "q8_0"])
@pytest.mark.parametrize("method,settings", [("ties", {"density": 0.4, "sign": "total"}),
                                             ("dare_linear", {"density": 0.6, "seed": 11})])
def test_gguf_models_combine_into_the_base_types(outtype, method, settings, tuned, peftc_binary, tmp_path):
    """GGUF base and models (convert_hf_to_gguf of the same checkpoints): the output keeps the base's metadata and
    tensor types; its values are the numpy formula on the values ggml reads (DARE's stream: the GGUF name), exact
    up to f32 rounding for F32 tensors, within half an f16 ulp for F16 ones and within half a quantization step of
    each Q8_0 block (the step d = max|block|/127 of the reference's block, plus the f16 rounding of d: at most
    127 d 2^-11); ggml's own reader loads it."""
    from gguf_reference import convert_hf_to_gguf, ggml_reads, metadata
    weights = [0.6, -0.3, 0.9]
    base = convert_hf_to_gguf(LLAMA, tmp_path / "base.gguf", outtype=outtype)
    models = [convert_hf_to_gguf(m, tmp_path / f"m{i}.gguf", outtype=outtype) for i, m in enumerate(tuned)]
    out = tmp_path / "out.gguf"
    args = ["model", "combine", "--base", base, "--method", method, "--out", out, "--density", repr(settings["density"])]
    if "sign" in settings:
        args += ["--majority-sign", settings["sign"]]
    if "seed" in settings:
        args += ["--seed", str(settings["seed"])]
    for m, w in zip(models, weights):
        args += ["--model", f"{m}:{w!r}"]
    run(peftc_binary, *args)

    ok, log = ggml_reads(out)
    assert ok, log
    assert metadata(out).keys() == metadata(base).keys()
    assert all(np.array_equal(np.asarray(metadata(out)[k]), np.asarray(metadata(base)[k])) for k in metadata(base))
    base_values = gguf_values(base)
    model_values = [gguf_values(m) for m in models]
    ours = gguf_values(out)
    assert ours.keys() == base_values.keys()
    expected = reference(method, {n: v[1] for n, v in base_values.items()}, [{n: v[1] for n, v in m.items()}
                                                                              for m in model_values], weights, **settings)
    quantized = 0
    for name, (type_name, values, _raw) in ours.items():
        assert type_name == base_values[name][0], name
        want = expected[name]
        if type_name == "F32":
            np.testing.assert_allclose(values, want, rtol=1e-6, atol=1e-7, err_msg=name)
        elif type_name == "F16":  # rounded once to f16: half an f16 ulp (2^-11 relative; 2^-25 below the normals)
            np.testing.assert_allclose(values, want, rtol=2.0 ** -11 * (1 + 1e-3), atol=2.0 ** -25, err_msg=name)
        else:
            assert type_name == "Q8_0"
            quantized += 1
            blocks = want.reshape(-1, 32)
            step = np.abs(blocks).max(axis=1, keepdims=True) / 127
            error = np.abs(values.reshape(-1, 32) - blocks)
            # ggml rounds x / d to q (half a step), then stores d in f16: q * fp16(d) moves by up to
            # 127 * d * 2^-11 more.
            bound = step * (0.5 + 127 * 2.0 ** -11) * (1 + 1e-3) + 1e-12
            assert (error <= bound).all(), (name, float((error / step).max()))
    assert quantized > 0 or outtype == "f32"


def test_gguf_combine_refusals(tuned, peftc_binary, tmp_path):
    from gguf_reference import convert_hf_to_gguf
    base = convert_hf_to_gguf(LLAMA, tmp_path / "base.gguf", outtype="f32")
    model = convert_hf_to_gguf(tuned[0], tmp_path / "m.gguf", outtype="f32")
    out = tmp_path / "out.gguf"
    cases = [(["--model", f"{tuned[0]}:1"], "UNSUPPORTED", "not a GGUF file"),
             (["--model", f"{model}:1", "--dtype", "bf16"], "INVALID_ARGUMENT", "one file"),
             (["--model", f"{model}:1", "--out", base], "INVALID_ARGUMENT", "")]
    for options, code, text in cases:
        args = ["model", "combine", "--base", base, "--method", "linear", *options]
        if "--out" not in options:
            args += ["--out", out]
        result = run(peftc_binary, *args, ok=False)
        assert result.returncode == 1 and code in result.stderr and text in result.stderr, (options, result.stderr)
        assert not out.exists()
