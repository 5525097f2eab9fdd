"""Serving (issue 7) against PEFT itself: peft_c's unmerged LoRA (``lora_apply``) gives the outputs of
PEFT's forward of the unmerged model for a mixed batch, layer by layer, and a hot swap (``HostModel``)
gives PEFT's merged weights.

The adapters are made with PEFT in the test (serve_support.ADAPTERS: three per family, ranks 2/4/8,
different alphas, one with rslora, and on gpt2 one with lora_bias) on the tiny fixture models, llama
(Linear) and gpt2 (transformers Conv1D). PEFT runs ONE forward over a batch of six sequences with
``adapter_names`` (one "__base__"); forward hooks capture, for every LoRA layer, its input, its base
layer's output and its own output. peft_c then adds the LoRA contributions to the base layer's output
with ``lora_apply`` (a registry whose storage dtype is the model's) and is compared with PEFT's output
and with a float64 evaluation of the same formula on PEFT's factors:

* F32: max |ours - PEFT| <= 1e-5 x max |PEFT| in every layer.
* BF16: PEFT and peft_c round differently, so equality is not expected. With adapters kept in bf16
  (``autocast_adapter_dtype=False``) PEFT rounds x A^T, then (x A^T) B^T, then the scaling product,
  then the sum; with its default (adapters autocast to f32) it rounds the delta, then the sum. peft_c
  computes in f32 and rounds once. Required: every element within 2 bf16 ulps of PEFT's, the ulp
  taken at the size of the largest quantity added up for that element (the base output, the delta,
  or scaling x |x A^T| |B^T|, where cancellation in the rank sum shows); peft_c's error against the
  float64 result no larger than PEFT's, in max and in mean; and every element of peft_c's output the
  float64 result rounded once from within the rounding-error bound of f32 products of that length
  (|ours - exact| <= half a bf16 ulp of ours + that bound, serve_support.Reference.f32_bound), so that
  it holds for every BLAS kernel; within one ulp (at the size above) for all.
* Rows whose adapter lacks the layer, and "__base__" rows, are left bit for bit as they were.

Run with ``-rP`` to see the measured errors.
"""

from __future__ import annotations

import pathlib
from dataclasses import dataclass

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
pytest.importorskip("ml_dtypes")

from serve_support import (TORCH_DTYPES, bf16_ulp_of, bf16_ulps, capture_mixed_batch,  # noqa: E402
                           host_layers, load_base, make_adapters, peft_merged_state, peft_unmerged, reference,
                           row_leases, to_numpy)

FAMILIES = ["llama", "gpt2"]
BUDGET = 1 << 30


@dataclass(frozen=True)
class ApplyCase:
    id: str
    dtype: str  # the model's dtype, the activations' and the registry's storage
    autocast: bool  # PEFT's autocast_adapter_dtype


APPLY_CASES = [
    ApplyCase("f32", "F32", True),
    ApplyCase("bf16", "BF16", False),  # PEFT computes the LoRA path in bf16
    ApplyCase("bf16_peft_default", "BF16", True),  # PEFT computes it in f32 and rounds the delta
]


@pytest.fixture(scope="module")
def adapter_folders(tmp_path_factory, fixtures_dir):
    made: dict[str, dict[str, pathlib.Path]] = {}

    def folders(family: str) -> dict[str, pathlib.Path]:
        if family not in made:
            base = base_dir(fixtures_dir, family)
            made[family] = make_adapters(base, family, tmp_path_factory.mktemp(f"serve_{family}"))
        return made[family]

    return folders


def base_dir(fixtures_dir: pathlib.Path, family: str) -> pathlib.Path:
    base = fixtures_dir / "models" / family
    if not (base / "model.safetensors").exists():
        pytest.skip(f"fixture {base} is absent (run tests/fixtures/generate.py)")
    return base


def raw(array: np.ndarray) -> np.ndarray:
    """The bits of an array, for bit-for-bit comparisons."""
    return array.view(np.uint16 if array.dtype.itemsize == 2 else np.uint32)


@pytest.mark.parametrize("case", APPLY_CASES, ids=[c.id for c in APPLY_CASES])
@pytest.mark.parametrize("family", FAMILIES)
def test_lora_apply_matches_peft_mixed_batch(family, case, peft_c, fixtures_dir, adapter_folders):
    base = base_dir(fixtures_dir, family)
    folders = adapter_folders(family)
    names = list(folders)
    model = peft_unmerged(base, TORCH_DTYPES[case.dtype], folders, case.autocast)
    captures = capture_mixed_batch(model)
    rows = row_leases(names)

    stats = {"layers": len(captures), "elements": 0, "adapted_elements": 0}
    worst_rel = ours_max = peft_max = ours_sum = peft_sum = 0.0
    worst_scaled_ulps, worst_ulps, identical, correctly_rounded, worst_vs_exact = 0.0, 0, 0, 0, 0.0
    with peft_c.Registry(case.dtype, BUDGET) as registry:
        for name, folder in folders.items():
            registry.register(name, folder, base_dir=base)
        leases = [registry.acquire(name) for name in names]
        for capture in captures:
            layer = model.get_submodule("base_model.model." + capture.module)
            assert [lease.has_module(capture.module) for lease in leases] == \
                [name in layer.lora_A for name in names], capture.module
            x, y = to_numpy(capture.x), to_numpy(capture.base_out)
            peft_c.lora_apply(capture.module, leases, rows, x, y)

            expected = reference(model, capture, names, rows)
            base_out, peft_out = to_numpy(capture.base_out), to_numpy(capture.out)
            untouched = ~expected.adapted
            assert np.array_equal(raw(y[untouched]), raw(base_out[untouched])), capture.module
            assert np.array_equal(raw(peft_out[untouched]), raw(base_out[untouched])), capture.module
            stats["elements"] += y.size
            stats["adapted_elements"] += int(expected.adapted.sum()) * y.shape[1]

            ours64, peft64 = y.astype(np.float64), peft_out.astype(np.float64)
            ours_error, peft_error = np.abs(ours64 - expected.out), np.abs(peft64 - expected.out)
            ours_max, peft_max = max(ours_max, ours_error.max()), max(peft_max, peft_error.max())
            ours_sum, peft_sum = ours_sum + ours_error.sum(), peft_sum + peft_error.sum()
            if case.dtype == "F32":
                rel = np.abs(ours64 - peft64).max() / np.abs(peft64).max()
                worst_rel = max(worst_rel, rel)
                assert rel <= 1e-5, f"{capture.module}: differs from PEFT by {rel:.3g} of the output's scale"
            else:
                size = np.maximum.reduce([np.abs(expected.base), np.abs(expected.delta), expected.terms])
                scaled = np.abs(ours64 - peft64) / bf16_ulp_of(size)
                worst_scaled_ulps = max(worst_scaled_ulps, float(scaled.max()))
                worst_ulps = max(worst_ulps, int(bf16_ulps(y, peft_out).max()))
                rounded = expected.out.astype(np.float32).astype(y.dtype)
                correctly_rounded += int(np.sum(raw(y) == raw(rounded)))
                half_ulp = bf16_ulp_of(ours64) / 2
                over = ours_error > half_ulp + expected.f32_bound
                assert not over.any(), (
                    f"{capture.module}: {int(over.sum())} elements are not one rounding of an f32 result "
                    f"(worst {float((ours_error - half_ulp - expected.f32_bound).max()):.3g} over the bound)")
                worst_vs_exact = max(worst_vs_exact, float((ours_error / bf16_ulp_of(size)).max()))
                identical += int(np.sum(raw(y) == raw(peft_out)))
                assert scaled.max() <= 2, (
                    f"{capture.module}: {int(np.sum(scaled > 2))} elements differ from PEFT's by more than "
                    f"2 ulps (at most {scaled.max():.3g})")
        for lease in leases:
            lease.release()
        loaded = registry.stats()
    assert stats["adapted_elements"] > 0
    assert loaded.loads == len(names) and loaded.loaded_bytes == sum(l.nbytes for l in leases)

    stats.update(ours_max_abs_error=float(ours_max), peft_max_abs_error=float(peft_max),
                 ours_mean_abs_error=float(ours_sum / stats["elements"]),
                 peft_mean_abs_error=float(peft_sum / stats["elements"]))
    if case.dtype == "F32":
        stats["max_rel_diff_vs_peft"] = float(worst_rel)
    else:
        stats.update(max_scaled_ulps_vs_peft=worst_scaled_ulps, max_raw_ulps_vs_peft=worst_ulps,
                     identical_to_peft=identical, correctly_rounded=correctly_rounded,
                     max_scaled_ulps_vs_exact=worst_vs_exact)
        assert ours_max <= peft_max, stats
        assert ours_sum <= peft_sum, stats
        assert worst_vs_exact <= 1, stats
    print(f"{family} {case.id}: {stats}")  # shown with pytest -rP


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
@pytest.mark.parametrize("family", FAMILIES)
def test_swap_gives_peft_merged_weights(family, dtype, peft_c, fixtures_dir, adapter_folders):
    """Swapping adapter after adapter into the host's own tensors gives, each time, the weights of PEFT's
    merge_and_unload() of that adapter alone; swapping to None gives back the original bits."""
    base = base_dir(fixtures_dir, family)
    folders = adapter_folders(family)
    torch_dtype = TORCH_DTYPES[dtype]
    host_model = load_base(base, torch_dtype)
    layers = host_layers(host_model)
    tensors = {}  # HuggingFace weight name -> the model's own tensor, changed in place by the swaps
    with peft_c.HostModel() as host, peft_c.Registry(dtype, BUDGET) as registry:
        for name, module in layers.items():
            bias = module.bias.data if module.bias is not None else None
            host.add_weight(f"{name}.weight", module.weight.data, bias=bias)
            tensors[f"{name}.weight"] = module.weight.data
            if bias is not None:
                tensors[f"{name}.bias"] = bias
        original = {name: tensor.clone() for name, tensor in tensors.items()}
        for name, folder in folders.items():
            registry.register(name, folder, base_dir=base)

        previous_layers = 0
        report = {}
        for name in folders:
            with registry.acquire(name) as lease:
                swap = host.swap(lease)
            assert host.current == name
            assert (swap.layers_removed, swap.layers_merged) == (previous_layers, count_lora_layers(folders[name]))
            previous_layers = swap.layers_merged
            merged = peft_merged_state(base, torch_dtype, folders[name])
            report[name] = compare_with_merged(tensors, merged, original, dtype)

        swap = host.swap(None)
        assert host.current is None and swap.layers_merged == 0 and swap.layers_removed == previous_layers
        for name, tensor in tensors.items():
            assert torch.equal(tensor.view(torch.int16 if tensor.element_size() == 2 else torch.int32),
                               original[name].view(torch.int16 if tensor.element_size() == 2 else torch.int32)), name
        assert registry.stats().pinned == 0  # the host model let its last adapter go
    print(f"{family} {dtype}: {report}")  # shown with pytest -rP


def count_lora_layers(folder: pathlib.Path) -> int:
    from safetensors import safe_open

    with safe_open(str(folder / "adapter_model.safetensors"), framework="pt") as f:
        return sum(1 for key in f.keys() if key.endswith("lora_A.weight"))


def compare_with_merged(tensors: dict, merged: dict, original: dict, dtype: str) -> dict:
    """Every host tensor against PEFT's merged one: equal bits in BF16, within 1e-6 of the tensor's
    largest value in F32 (the agreement of the merge pipeline). Returns what was measured."""
    changed, worst_rel = 0, 0.0
    for name, tensor in tensors.items():
        theirs = merged[name]
        assert theirs.dtype == tensor.dtype and theirs.shape == tensor.shape, name
        if not torch.equal(tensor, original[name]):
            changed += 1
        if dtype == "BF16":
            differing = int((tensor.view(torch.int16) != theirs.view(torch.int16)).sum())
            assert differing == 0, f"{name}: {differing} of {tensor.numel()} elements differ from PEFT's merge"
        else:
            rel = float((tensor.double() - theirs.double()).abs().max() / theirs.double().abs().max())
            worst_rel = max(worst_rel, rel)
            assert rel <= 1e-6, f"{name}: differs from PEFT's merge by {rel:.3g} of its largest value"
    assert changed > 0
    return {"tensors_changed": changed, "max_rel_diff": worst_rel} if dtype == "F32" else {"tensors_changed": changed}
