"""Merges of VeRA, RandLoRA and FourierFT adapters against PEFT 0.21's own merge_and_unload(), on tiny
llama and gpt2 (Conv1D, fan_in_fan_out) models, as test_method_merge.py does for LoHa/LoKr/AdaLoRA/IA3.

The adapters are made at test time by the committed recipe tests/fixtures/generator/method_adapters.py
with the real peft package (seeded random lambda/gamma/spectrum parameters; VeRA's and RandLoRA's
shared projections saved as PEFT saves them, save_projection=True). For each:

* `peftc merge` (file merge): every tensor within 1e-6 of PEFT's merged model relative to the
  tensor's largest value (f32), merged logits within 1e-5;
* `--dtype bf16`: PEFT's f32 merge rounded once (at most 1 ulp apart, and exactly our f32 merge rounded);
* host buffers (peft_merge_buffer_apply through the Python binding): f32 as PEFT's, bf16 the f32 merge
  of the same values rounded once, removal with kept rows restoring the original bytes, also after
  swapping among methods (with LoHa and IA3 from test_method_merge.py's cases);
* weighted: `--adapter dir:0.5` against PEFT with the RandLoRA / FourierFT scaling halved, and for
  VeRA (which has no scale) against PEFT with vera_lambda_b halved (1e-6 relative);
* a VeRA adapter saved without projections (save_projection=False) is refused with UNSUPPORTED;
* FourierFT's positions: torch_randperm (merge_math_driver) equals torch.randperm for many sizes
  and seeds, and the f64 inverse transform stays within the bound of docs/peft-semantics.md of torch's
  f32 ifft2 on larger layers.

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA, PEFT_MERGE_MATH_DRIVER.
"""

from __future__ import annotations

import json
import math
import subprocess
import warnings

import numpy as np
import pytest
import torch

from merge_support import (compare_weights, file_tensors, load_model, relative_logit_error, run_merge,
                           saved_tensors)
from test_merge_math import driver  # noqa: F401  (the merge_math_driver fixture)
from test_method_merge import _module_names, method_adapter  # noqa: F401  (fixture)

CASE_NAMES = ["llama_vera", "gpt2_vera", "llama_randlora", "gpt2_randlora", "llama_fourierft", "gpt2_fourierft"]


def peft_reference(base, adapter, weight=1.0):
    from peft import PeftModel

    model = load_model(base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = PeftModel.from_pretrained(model, str(adapter))
        if weight != 1.0:
            for module in peft_model.modules():
                if "default" in getattr(module, "vera_lambda_b", {}):
                    module.vera_lambda_b["default"].data *= weight
                elif "default" in getattr(module, "fourierft_scaling", {}):
                    module.fourierft_scaling["default"] = weight * module.fourierft_scaling["default"]
                elif isinstance(getattr(module, "scaling", None), dict) and "default" in module.scaling:
                    module.scaling["default"] = weight * module.scaling["default"]
        return peft_model.merge_and_unload().eval()


@pytest.mark.parametrize("case", CASE_NAMES)
def test_file_merge_matches_peft(case, method_adapter, peftc_binary, tmp_path):  # noqa: F811
    base, adapter = method_adapter(case)
    ours_dir = tmp_path / "ours"
    run_merge(peftc_binary, base, [(adapter, 1.0)], ours_dir)
    ref = peft_reference(base, adapter)
    ours_tensors = file_tensors(ours_dir)
    stats = compare_weights(ours_tensors, saved_tensors(ref, tmp_path / "ref"))
    assert stats["f32_rel"] <= 1e-6, stats
    base_tensors = file_tensors(base)
    assert [n for n in ours_tensors if not torch.equal(ours_tensors[n], base_tensors[n])], "the merge changed nothing"
    assert relative_logit_error(load_model(ours_dir), ref) <= 1e-5


@pytest.mark.parametrize("case", ["llama_vera", "gpt2_randlora", "llama_fourierft"])
def test_bf16_merge_rounds_once(case, method_adapter, peftc_binary, tmp_path):  # noqa: F811
    base, adapter = method_adapter(case)
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "bf16", "--dtype", "bf16")
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "f32")
    ours, wide = file_tensors(tmp_path / "bf16"), file_tensors(tmp_path / "f32")
    ref = saved_tensors(peft_reference(base, adapter).to(torch.bfloat16), tmp_path / "ref")
    stats = compare_weights(ours, ref)
    assert stats["max_ulp"] <= 1, stats
    for name, tensor in ours.items():
        assert torch.equal(wide[name].to(torch.bfloat16).view(torch.int16), tensor.view(torch.int16)), name


@pytest.mark.parametrize("case", ["llama_vera", "gpt2_vera", "llama_randlora", "gpt2_fourierft"])
def test_weighted_merge_matches_peft(case, method_adapter, peftc_binary, tmp_path):  # noqa: F811
    base, adapter = method_adapter(case)
    run_merge(peftc_binary, base, [(adapter, 0.5)], tmp_path / "ours")
    ref = peft_reference(base, adapter, weight=0.5)
    stats = compare_weights(file_tensors(tmp_path / "ours"), saved_tensors(ref, tmp_path / "ref"))
    assert stats["f32_rel"] <= 1e-6, stats


def test_vera_without_saved_projections_is_refused(method_adapter, peftc_binary, tmp_path):  # noqa: F811
    base, adapter = method_adapter("llama_vera_unsaved")
    proc = subprocess.run([str(peftc_binary), "merge", "--base", str(base), "--adapter", str(adapter), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "UNSUPPORTED" in proc.stderr and "save_projection" in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", CASE_NAMES)
def test_host_buffer_merge_matches_peft_and_comes_out_exactly(case, method_adapter, peft_c, tmp_path):  # noqa: F811
    base, adapter_dir = method_adapter(case)
    ref = saved_tensors(peft_reference(base, adapter_dir), tmp_path / "ref")
    tensors = file_tensors(base)
    with peft_c.Adapter.open(str(adapter_dir)) as adapter:
        names = _module_names(adapter)
        assert names
        for module in names:
            key = module + ".weight"
            weight = tensors[key].clone()
            original = weight.clone()
            record = peft_c.merge_into(adapter, module, weight, keep_original_rows=True)
            want = ref[key].double()
            assert float((weight.double() - want).abs().max()) <= 1e-6 * float(want.abs().max()), key
            record.remove(weight)
            assert torch.equal(weight.view(torch.int32), original.view(torch.int32)), key

            half = original.to(torch.bfloat16)
            half_original = half.clone()
            wide = half.float()
            peft_c.merge_into(adapter, module, wide)
            record = peft_c.merge_into(adapter, module, half, keep_original_rows=True)
            assert torch.equal(half.view(torch.int16), wide.to(torch.bfloat16).view(torch.int16)), key
            record.remove(half)
            assert torch.equal(half.view(torch.int16), half_original.view(torch.int16)), key


def test_host_buffer_swap_among_methods_and_back_to_none(method_adapter, peft_c):  # noqa: F811
    """One llama weight: VeRA, RandLoRA on top, FourierFT, IA3, removed in reverse order, then LoHa
    alone and removed, in f32 and bf16: the buffer ends as it began, bit for bit."""
    cases = ("llama_vera", "llama_randlora", "llama_fourierft", "llama_ia3", "llama_loha")
    adapters = {case: method_adapter(case)[1] for case in cases}
    base = method_adapter("llama_vera")[0]
    module = "model.layers.0.self_attn.v_proj"
    opened = {case: peft_c.Adapter.open(str(path)) for case, path in adapters.items()}
    try:
        for dtype in (torch.float32, torch.bfloat16):
            weight = file_tensors(base)[module + ".weight"].to(dtype).contiguous()
            original = weight.clone()
            view = torch.int32 if dtype == torch.float32 else torch.int16
            records = [peft_c.merge_into(opened[c], module, weight, keep_original_rows=True) for c in cases[:4]]
            assert not torch.equal(weight.view(view), original.view(view))
            for record in reversed(records):
                record.remove(weight)
            assert torch.equal(weight.view(view), original.view(view))
            record = peft_c.merge_into(opened["llama_loha"], module, weight, scale=0.5, keep_original_rows=True)
            record.remove(weight)
            assert torch.equal(weight.view(view), original.view(view))
    finally:
        for a in opened.values():
            a.close()


def _run_driver(driver, tmp_path, case):  # noqa: F811
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"cases": [case]}))
    subprocess.run([str(driver), str(spec)], check=True)


def test_randperm_matches_torch(driver, tmp_path):  # noqa: F811
    """torch.randperm(n, generator=torch.Generator().manual_seed(seed)) on the CPU, whole, for sizes
    1..300 and some larger ones, with seeds beyond 32 bits and negative ones."""
    sizes = list(range(1, 301)) + [1000, 4096, 12345, 65536, 262144, 1048576 + 3]
    seeds = [777, 0, 12345, -1, 2**32 + 5, 2**63 - 1]
    cases = []
    for i, n in enumerate(sizes):
        seed = seeds[i % len(seeds)]
        cases.append({"op": "randperm", "n": n, "seed": seed, "count": n, "out": f"p{i}.bin"})
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"cases": cases}))
    subprocess.run([str(driver), str(spec)], check=True)
    for i, case in enumerate(cases):
        want = torch.randperm(case["n"], generator=torch.Generator().manual_seed(case["seed"]))
        got = np.fromfile(tmp_path / case["out"], dtype=np.int64)
        assert np.array_equal(got, want.numpy()), case


@pytest.mark.parametrize("out,inp,n,seed", [(64, 48, 200, 777), (96, 160, 1000, 3), (257, 129, 500, 42)])
def test_fourierft_delta_within_bound_of_torch(out, inp, n, seed, driver, tmp_path):  # noqa: F811
    """fourierft_delta against PEFT's get_delta_weight arithmetic (torch.fft.ifft2 in f32, pocketfft):
    |ours - torch| <= 2 * log2(out * in) * 2^-24 * scaling * sum|s| / (out * in) + 1 ulp of the result."""
    g = torch.Generator().manual_seed(seed)
    spectrum = torch.randn(n, generator=g)
    scaling = 150.0
    spectrum.numpy().astype(np.float32).tofile(tmp_path / "s.bin")
    _run_driver(driver, tmp_path, {"op": "fourierft", "spectrum": {"file": "s.bin"}, "seed": seed, "scale": scaling,
                                   "out": out, "in": inp, "out_delta": "d.bin"})
    ours = torch.from_numpy(np.fromfile(tmp_path / "d.bin", dtype=np.float32)).reshape(out, inp)
    idx = torch.randperm(out * inp, generator=torch.Generator().manual_seed(seed))[:n]
    dense = torch.zeros(out, inp)
    dense[idx // inp, idx % inp] = spectrum
    want = torch.fft.ifft2(dense).real * scaling
    bound = 2 * math.log2(out * inp) * 2.0**-24 * scaling * float(spectrum.abs().sum()) / (out * inp)
    diff = (ours.double() - want.double()).abs()
    ulp = want.double().abs() * 2.0**-23
    assert bool((diff <= bound + ulp).all()), float((diff - ulp).max()) / bound
    # and the error of each against the exact (f64) transform: ours is the closer one
    exact = torch.fft.ifft2(dense.double()).real * scaling
    assert float((ours.double() - exact).abs().max()) <= float((want.double() - exact).abs().max()) + float(ulp.max())
