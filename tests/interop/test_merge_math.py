"""The merge math of peft_c against PEFT and torch themselves.

Small LoRA layers are built with PEFT (`get_peft_model` on a tiny module holding an nn.Linear, a
transformers Conv1D, an nn.Embedding, nn.Conv2d 1x1 and 3x3, or nn.Conv1d), with DoRA on/off,
rslora on/off, lora_bias on/off and f32, bf16 and f16 weights. PEFT's own `merge()` and `unmerge()`
give the expected weights; the C++ merge math runs on the same inputs through the test driver
`merge_math_driver` (built from tests/interop/merge_math_driver.cpp), which reads raw files the test
writes next to a JSON spec. Also `add_weighted_adapter` "cat" and "linear" against combine_cat /
combine_linear.

Agreement required: f32 within 1e-6 relative; bf16/f16 at most 1 ulp apart everywhere and identical
for at least 99.9% of the elements. Where PEFT itself rounds twice (the Embedding merge and the plain
LoRA unmerge cast the delta to the weight dtype before adding) peft_c rounds once; there the 99.9%
is checked against torch computing the single rounding from PEFT's own f32 delta, and the 1-ulp bound
against PEFT's result.

Environment: PEFT_MERGE_MATH_DRIVER, the driver binary
(default <repo>/build/tests/interop/merge_math_driver).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import warnings
import zlib

import numpy as np
import pytest
import torch
from torch import nn

REPO = pathlib.Path(__file__).resolve().parents[2]
DRIVER = pathlib.Path(os.environ.get("PEFT_MERGE_MATH_DRIVER")
                      or REPO / "build" / "tests" / "interop" / "merge_math_driver")

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


@pytest.fixture(scope="session")
def driver() -> pathlib.Path:
    if not DRIVER.exists():
        pytest.fail(f"merge_math_driver not built at {DRIVER}: build target merge_math_driver "
                    "or set PEFT_MERGE_MATH_DRIVER", pytrace=False)
    return DRIVER


class Tiny(nn.Module):
    def __init__(self, layer: nn.Module):
        super().__init__()
        self.target = layer

    def forward(self, x):
        return self.target(x)


def make_layer(name: str) -> tuple[nn.Module, str]:
    """A base layer and the driver's module kind for it; sizes big enough for rounding statistics."""
    from transformers.pytorch_utils import Conv1D

    if name == "linear":
        return nn.Linear(384, 256, bias=True), "linear"
    if name == "conv1d_gpt2":
        return Conv1D(nf=256, nx=384), "conv1d_gpt2"  # weight [in, out]
    if name == "embedding":
        return nn.Embedding(640, 96), "embedding"
    if name == "conv2d_1x1":
        return nn.Conv2d(96, 80, 1), "conv"
    if name == "conv2d_3x3":
        return nn.Conv2d(24, 64, 3), "conv"
    if name == "conv1d_k3":
        return nn.Conv1d(32, 48, 3), "conv"
    raise ValueError(name)


def lora_parts(layer, adapter: str):
    """(A, B, lora_B.bias or None, magnitude or None) of one adapter of a PEFT LoRA layer."""
    if adapter in getattr(layer, "lora_embedding_A", {}):
        a, b, bias = layer.lora_embedding_A[adapter], layer.lora_embedding_B[adapter], None
    else:
        a, b = layer.lora_A[adapter].weight, layer.lora_B[adapter].weight
        bias = layer.lora_B[adapter].bias
    mag = layer.lora_magnitude_vector[adapter].weight if adapter in layer.lora_magnitude_vector else None
    return a, b, bias, mag


def build(name: str, dtype: torch.dtype, *, dora=False, rslora=False, lora_bias=False, r=16, alpha=24, seed=0):
    torch.manual_seed(seed)
    base, kind = make_layer(name)
    with torch.no_grad():
        base.weight.normal_(0, 0.05)
        if getattr(base, "bias", None) is not None:
            base.bias.normal_(0, 0.05)
    model = Tiny(base).to(dtype)
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=r, lora_alpha=alpha, target_modules=["target"], use_dora=dora, use_rslora=rslora,
                        lora_bias=lora_bias, init_lora_weights=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(model, config)
    layer = peft_model.base_model.model.target
    randomize_adapter(layer, "default", seed + 1)
    return peft_model, layer, kind


def randomize_adapter(layer, adapter: str, seed: int):
    """Random factors with a delta about as large as the weight, so that rounding is exercised."""
    g = torch.Generator().manual_seed(seed)
    a, b, bias, mag = lora_parts(layer, adapter)
    with torch.no_grad():
        for p in (a, b):
            p.copy_(torch.randn(p.shape, generator=g) * 0.1)
        if bias is not None:
            bias.copy_(torch.randn(bias.shape, generator=g) * 0.05)
        if mag is not None:
            mag.copy_(mag * (0.5 + torch.rand(mag.shape, generator=g)))


def raw(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()


class Spec:
    """Collects cases and raw files for one driver run."""

    def __init__(self, folder: pathlib.Path):
        self.folder = folder
        self.cases = []
        self.count = 0

    def file(self, t: torch.Tensor | None = None, prefix="t") -> str:
        self.count += 1
        name = f"{prefix}{self.count}.bin"
        if t is not None:
            (self.folder / name).write_bytes(raw(t))
        return name

    def tensor(self, t: torch.Tensor, dtype_name: str | None = None) -> dict:
        entry = {"file": self.file(t), "shape": list(t.shape)}
        if dtype_name:
            entry["dtype"] = dtype_name
        return entry

    def run(self, driver):
        spec = self.folder / "spec.json"
        spec.write_text(json.dumps({"cases": self.cases}))
        proc = subprocess.run([str(driver), str(spec)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr

    def read(self, name: str, dtype: torch.dtype, shape) -> torch.Tensor:
        data = bytearray((self.folder / name).read_bytes())
        if dtype == torch.float32:
            return torch.frombuffer(data, dtype=torch.float32).reshape(shape).clone()
        return torch.frombuffer(data, dtype=torch.int16).view(dtype).reshape(shape).clone()


def ordered(bits: np.ndarray) -> np.ndarray:
    """16-bit float patterns as integers whose difference counts ulps (+0 and -0 coincide)."""
    b = bits.astype(np.int32) & 0xFFFF
    mag = b & 0x7FFF
    return np.where(b & 0x8000, -mag, mag)


def agreement(ours: torch.Tensor, ref: torch.Tensor) -> dict:
    """Statistics of ours vs ref: max ulp distance and identical fraction (16-bit), or max relative
    error (f32, relative to max(|ref|, rms(ref)) per element)."""
    assert ours.shape == ref.shape and ours.dtype == ref.dtype
    if ours.dtype == torch.float32:
        a, b = ours.double().numpy(), ref.double().numpy()
        scale = np.maximum(np.abs(b), np.sqrt(np.mean(b * b)))
        return {"max_rel": float(np.max(np.abs(a - b) / scale)), "identical": float(np.mean(a == b))}
    a = ordered(ours.view(torch.int16).numpy())
    b = ordered(ref.view(torch.int16).numpy())
    return {"max_ulp": int(np.max(np.abs(a - b))), "identical": float(np.mean(a == b))}


def check(stats: dict, what: str, *, exact_fraction=0.999):
    print(f"{what}: {stats}")
    if "max_rel" in stats:
        assert stats["max_rel"] <= 1e-6, what
    else:
        assert stats["max_ulp"] <= 1, what
        assert stats["identical"] >= exact_fraction, what


def check_double_rounding_bound(ours: torch.Tensor, peft_result: torch.Tensor, delta: torch.Tensor, what: str):
    """Where PEFT rounds the delta to the weight dtype before adding it, its result may differ from the
    single rounding by half an ulp of the delta plus an ulp of the result (near zero that is many ulps
    of the result). Checks that bound element-wise and prints the statistics."""
    eps = 2.0 ** -8 if ours.dtype == torch.bfloat16 else 2.0 ** -11  # half an ulp, relative
    a, b, d = ours.double(), peft_result.double(), delta.double()
    bound = eps * d.abs() + 2 * eps * b.abs() + 1e-30
    print(f"{what}: {agreement(ours, peft_result)}, worst fraction of the bound "
          f"{float(((a - b).abs() / bound).max()):.3f}")
    assert bool(((a - b).abs() <= bound).all()), what


LAYERS = ["linear", "conv1d_gpt2", "embedding", "conv2d_1x1", "conv2d_3x3", "conv1d_k3"]
VARIANTS = [  # (dora, rslora, lora_bias)
    (False, False, False),
    (False, True, False),
    (True, False, False),
    (True, True, False),
    (False, False, True),
]


def variant_id(v):
    dora, rslora, bias = v
    return "-".join(n for n, on in (("dora", dora), ("rslora", rslora), ("lora_bias", bias)) if on) or "plain"


@pytest.mark.parametrize("dtype_name", list(DTYPES))
@pytest.mark.parametrize("variant", VARIANTS, ids=variant_id)
@pytest.mark.parametrize("layer_name", LAYERS)
def test_merge_matches_peft(driver, tmp_path, layer_name, variant, dtype_name):
    dora, rslora, lora_bias = variant
    if lora_bias and layer_name == "embedding":
        pytest.skip("PEFT has no lora_bias for embeddings")
    dtype = DTYPES[dtype_name]
    _, layer, kind = build(layer_name, dtype, dora=dora, rslora=rslora, lora_bias=lora_bias,
                           seed=zlib.crc32(f"{layer_name}{variant}{dtype_name}".encode()) % 1000)
    base = layer.get_base_layer()
    a, b, bias_b, mag = lora_parts(layer, "default")
    assert a.dtype == torch.float32 and b.dtype == torch.float32  # PEFT autocasts adapters to f32
    w0 = base.weight.detach().clone()
    bias0 = base.bias.detach().clone() if getattr(base, "bias", None) is not None else None
    scaling = layer.scaling["default"]
    delta = layer.get_delta_weight("default").detach().clone()  # PEFT's f32 delta, storage layout

    with torch.no_grad():
        layer.merge()
    merged = base.weight.detach().clone()
    peft_norm = layer._caches["default-weight_norm"].detach().clone().reshape(-1) if dora else None
    merged_bias = base.bias.detach().clone() if lora_bias else None
    with torch.no_grad():
        layer.unmerge()
    unmerged = base.weight.detach().clone()

    spec = Spec(tmp_path)
    case = {"op": "merge", "kind": kind, "name": layer_name,
            "weight": spec.tensor(w0, dtype_name),
            "terms": [{"a": spec.tensor(a.float()), "b": spec.tensor(b.float()), "coefficient": scaling}],
            "out_weight": spec.file(prefix="out"),
            "unmerge_input": spec.tensor(merged, dtype_name), "out_unmerged": spec.file(prefix="out")}
    if dora:
        case["magnitude"] = spec.tensor(mag.float().reshape(-1))
        case["out_norm"] = spec.file(prefix="out")
        # Unmerging divides by m / norm and subtracts dW again: where dW is larger than W that
        # cancellation magnifies a last-bit difference of the norm, so unmerge with PEFT's cached
        # norm (our own norm is compared separately).
        case["unmerge_norm"] = spec.tensor(peft_norm.float())
    if lora_bias:
        case["bias"] = spec.tensor(bias0, dtype_name)
        case["lora_bias"] = spec.tensor(bias_b.float())
        case["out_bias"] = spec.file(prefix="out")
    spec.cases.append(case)
    spec.run(driver)

    ours = spec.read(case["out_weight"], dtype, w0.shape)
    ours_unmerged = spec.read(case["out_unmerged"], dtype, w0.shape)
    label = f"{layer_name} {variant_id(variant)} {dtype_name}"

    peft_rounds_twice_merge = layer_name == "embedding" and not dora and dtype != torch.float32
    if peft_rounds_twice_merge:
        single = (w0.float() + delta).to(dtype)
        check(agreement(ours, single), label + " merge vs single rounding of PEFT's delta")
        check_double_rounding_bound(ours, merged, delta, label + " merge vs PEFT (which rounds the delta first)")
    else:
        check(agreement(ours, merged), label + " merge")

    # Unmerge of PEFT's merged weight. Plain LoRA: PEFT subtracts delta.to(dtype) (two roundings).
    if not dora and dtype != torch.float32:
        single = (merged.float() - delta).to(dtype)
        check(agreement(ours_unmerged, single), label + " unmerge vs single rounding of PEFT's delta")
        check_double_rounding_bound(ours_unmerged, unmerged, delta,
                                    label + " unmerge vs PEFT (which rounds the delta first)")
    else:
        check(agreement(ours_unmerged, unmerged), label + " unmerge")

    if dora:
        ours_norm = spec.read(case["out_norm"], torch.float32, peft_norm.shape)
        check(agreement(ours_norm, peft_norm.float()), label + " DoRA weight norm")

    if lora_bias:
        ours_bias = spec.read(case["out_bias"], dtype, bias0.shape)
        check(agreement(ours_bias, merged_bias), label + " lora_bias")


@pytest.mark.parametrize("layer_name", ["linear", "conv1d_gpt2", "conv2d_3x3"])
def test_two_adapters_at_once_match_peft_f32(driver, tmp_path, layer_name):
    """Sum of several adapters in one rounding vs PEFT merging them one after the other (f32)."""
    peft_model, layer, kind = build(layer_name, torch.float32, seed=7)
    from peft import LoraConfig

    peft_model.add_adapter("second", LoraConfig(r=4, lora_alpha=12, target_modules=["target"],
                                                init_lora_weights=False))
    randomize_adapter(layer, "second", 8)
    base = layer.get_base_layer()
    w0 = base.weight.detach().clone()
    spec = Spec(tmp_path)
    terms = []
    for name in ("default", "second"):
        a, b, _, _ = lora_parts(layer, name)
        terms.append({"a": spec.tensor(a.float()), "b": spec.tensor(b.float()),
                      "coefficient": layer.scaling[name]})
    with torch.no_grad():
        layer.merge(adapter_names=["default", "second"])
    case = {"op": "merge", "kind": kind, "weight": spec.tensor(w0, "F32"), "terms": terms,
            "out_weight": spec.file(prefix="out")}
    spec.cases.append(case)
    spec.run(driver)
    check(agreement(spec.read(case["out_weight"], torch.float32, w0.shape), base.weight.detach()),
          f"{layer_name} two adapters f32")


@pytest.mark.parametrize("method", ["cat", "linear"])
@pytest.mark.parametrize("layer_name", ["linear", "embedding", "conv1d_gpt2"])
def test_add_weighted_adapter_matches_peft(driver, tmp_path, layer_name, method):
    peft_model, layer, kind = build(layer_name, torch.float32, r=8, alpha=16, seed=11)
    from peft import LoraConfig

    # Same rank for "linear"; other alphas (and rslora) so the scalings differ.
    peft_model.add_adapter("b", LoraConfig(r=8 if method == "linear" else 4, lora_alpha=5, use_rslora=True,
                                           target_modules=["target"], init_lora_weights=False))
    peft_model.add_adapter("c", LoraConfig(r=8, lora_alpha=32, target_modules=["target"], init_lora_weights=False))
    randomize_adapter(layer, "b", 12)
    randomize_adapter(layer, "c", 13)
    names, weights = ["default", "b", "c"], [0.7, -1.3, 0.4]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model.add_weighted_adapter(names, weights, "combo", combination_type=method)
    new_a, new_b, _, _ = lora_parts(layer, "combo")

    spec = Spec(tmp_path)
    adapters = []
    for name, w in zip(names, weights):
        a, b, _, _ = lora_parts(layer, name)
        adapters.append({"a": spec.tensor(a.float()), "b": spec.tensor(b.float()), "rank": a.shape[0],
                         "scaling": layer.scaling[name], "weight": w})
    a0, b0, _, _ = lora_parts(layer, "default")
    case = {"op": "combine", "method": method, "out": b0.shape[0], "in": a0.shape[1], "adapters": adapters,
            "out_a": spec.file(prefix="out"), "out_b": spec.file(prefix="out")}
    spec.cases.append(case)
    spec.run(driver)
    ours_a = spec.read(case["out_a"], torch.float32, new_a.shape)
    ours_b = spec.read(case["out_b"], torch.float32, new_b.shape)
    label = f"{layer_name} add_weighted_adapter {method}"
    check(agreement(ours_a, new_a.detach().float()), label + " A")
    check(agreement(ours_b, new_b.detach().float()), label + " B")
    # These are element-wise f32 operations in torch's order: expect the very same bits.
    assert torch.equal(ours_a, new_a.detach().float()) and torch.equal(ours_b, new_b.detach().float())


def test_conv_shapes_peft_cannot_merge_are_refused(driver, tmp_path):
    """Conv3d with kernel (1, 1, k): PEFT's 1x1 shortcut fails; the library says UNSUPPORTED."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(Tiny(nn.Conv3d(4, 6, (1, 1, 3))),
                                LoraConfig(r=2, target_modules=["target"], init_lora_weights=False))
    layer = peft_model.base_model.model.target
    with pytest.raises(RuntimeError):
        layer.merge()
    a, b, _, _ = lora_parts(layer, "default")
    spec = Spec(tmp_path)
    spec.cases.append({"op": "merge", "kind": "conv", "weight": spec.tensor(layer.get_base_layer().weight, "F32"),
                       "terms": [{"a": spec.tensor(a.float()), "b": spec.tensor(b.float()), "coefficient": 1.0}],
                       "out_weight": spec.file(prefix="out")})
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps({"cases": spec.cases}))
    proc = subprocess.run([str(driver), str(spec_path)], capture_output=True, text=True)
    assert proc.returncode == 1 and "UNSUPPORTED" in proc.stderr
