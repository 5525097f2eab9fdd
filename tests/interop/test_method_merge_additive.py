"""Merges of MiSS (standard, "bat" and "mini" forms) and SHiRA against PEFT 0.21's own
merge_and_unload() on the tiny llama model. PEFT implements both for torch.nn.Linear layers only
(miss/model.py and shira/model.py raise for GPT-2's Conv1D), so there is no gpt2 case.

The adapters are made at test time by tests/fixtures/generator/method_adapters.py with the real peft
package (seeded random parameters; SHiRA's indices come from its seeded random mask and are saved in
the adapter). For each:

* `peftc merge`: every tensor within 1e-6 relative to the tensor's largest value of PEFT's merged
  model (f32), the logits within 1e-5; SHiRA's untouched elements keep their bits;
* `--dtype bf16`: our f32 merge rounded once, at most 1 ulp from PEFT's f32 merge rounded;
* host buffers (Python binding): f32 as PEFT's, bf16 the f32 merge of the same values rounded once,
  removal restoring the original bytes, also after swapping among methods;
* weighted: SHiRA at 0.5 equals PEFT with set_scale 0.5; MiSS, which has no scale, refuses a weight
  other than 1 (UNSUPPORTED).

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA.
"""

from __future__ import annotations

import subprocess

import pytest
import torch

from merge_support import compare_weights, file_tensors, load_model, relative_logit_error, run_merge, saved_tensors
from test_method_merge import _module_names, method_adapter, peft_reference  # noqa: F401 (fixture)

CASE_NAMES = ["llama_miss", "llama_miss_bat", "llama_miss_mini", "llama_shira"]


@pytest.mark.parametrize("case", CASE_NAMES)
def test_file_merge_matches_peft(case, method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter(case)
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "ours")
    ref = peft_reference(base, adapter)
    ours = file_tensors(tmp_path / "ours")
    stats = compare_weights(ours, saved_tensors(ref, tmp_path / "ref"))
    assert stats["f32_rel"] <= 1e-6, stats
    base_tensors = file_tensors(base)
    changed = [n for n in ours if not torch.equal(ours[n], base_tensors[n])]
    assert len(changed) == 12, changed  # 6 targets x 2 layers
    assert relative_logit_error(load_model(tmp_path / "ours"), ref) <= 1e-5
    if case == "llama_shira":  # a sparse delta: only the saved indices change
        for name in changed:
            differs = int((ours[name].view(torch.int32) != base_tensors[name].view(torch.int32)).sum())
            rows, cols = base_tensors[name].shape
            assert 0 < differs <= rows + cols, (name, differs)


@pytest.mark.parametrize("case", CASE_NAMES)
def test_bf16_merge_rounds_once(case, method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter(case)
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "bf16", "--dtype", "bf16")
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "f32")
    ours, wide = file_tensors(tmp_path / "bf16"), file_tensors(tmp_path / "f32")
    ref = saved_tensors(peft_reference(base, adapter).to(torch.bfloat16), tmp_path / "ref")
    stats = compare_weights(ours, ref)
    assert stats["max_ulp"] <= 1, stats
    for name, tensor in ours.items():
        assert torch.equal(wide[name].to(torch.bfloat16).view(torch.int16), tensor.view(torch.int16)), name


def test_shira_weighted_merge_matches_peft(method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter("llama_shira")
    run_merge(peftc_binary, base, [(adapter, 0.5)], tmp_path / "ours")
    ref = peft_reference(base, adapter, weight=0.5)
    stats = compare_weights(file_tensors(tmp_path / "ours"), saved_tensors(ref, tmp_path / "ref"))
    assert stats["f32_rel"] <= 1e-6, stats


def test_miss_weighted_merge_is_refused(method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter("llama_miss")
    proc = subprocess.run([str(peftc_binary), "merge", "--base", str(base), "--adapter", f"{adapter}:0.5", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "UNSUPPORTED" in proc.stderr and "MiSS has no scale" in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", CASE_NAMES)
def test_host_buffer_merge_matches_peft_and_comes_out_exactly(case, method_adapter, peft_c, tmp_path):
    base, adapter_dir = method_adapter(case)
    ref = saved_tensors(peft_reference(base, adapter_dir), tmp_path / "ref")
    tensors = file_tensors(base)
    with peft_c.Adapter.open(str(adapter_dir)) as adapter:
        names = _module_names(adapter)
        assert len(names) == 12
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
            assert not torch.equal(half.view(torch.int16), half_original.view(torch.int16)), key
            record.remove(half)
            assert torch.equal(half.view(torch.int16), half_original.view(torch.int16)), key


def test_host_buffer_swap_among_methods_and_back_to_none(method_adapter, peft_c):
    """One llama weight: LoHa, MiSS "bat" (which reads the weight LoHa left), SHiRA and MiSS mini
    stacked, removed in reverse order, in f32 and bf16: the buffer ends as it began, bit for bit."""
    order = ("llama_loha", "llama_miss_bat", "llama_shira", "llama_miss_mini")
    adapters = {case: method_adapter(case)[1] for case in order + ("llama_miss",)}
    base = method_adapter("llama_loha")[0]
    module = "model.layers.0.self_attn.v_proj"
    opened = {case: peft_c.Adapter.open(str(path)) for case, path in adapters.items()}
    try:
        for dtype in (torch.float32, torch.bfloat16):
            weight = file_tensors(base)[module + ".weight"].to(dtype).contiguous()
            original = weight.clone()
            view = torch.int32 if dtype == torch.float32 else torch.int16
            records = [peft_c.merge_into(opened[c], module, weight, keep_original_rows=True) for c in order]
            assert not torch.equal(weight.view(view), original.view(view))
            for record in reversed(records):
                record.remove(weight)
            assert torch.equal(weight.view(view), original.view(view))
            record = peft_c.merge_into(opened["llama_miss"], module, weight, keep_original_rows=True)
            record.remove(weight)
            assert torch.equal(weight.view(view), original.view(view))
    finally:
        for a in opened.values():
            a.close()
