"""Merges of the PEFT methods other than LoRA (LoHa, LoKr, AdaLoRA, IA3) against PEFT 0.21's own
merge_and_unload(), on tiny llama and gpt2 (Conv1D, fan_in_fan_out) models.

The adapters are made at test time by the committed recipe tests/fixtures/generator/method_adapters.py
with the real peft package (seeded random parameters). For each:

* `peftc merge` (file merge): every tensor agrees with PEFT's merged model within 1e-6 relative to
  the tensor's largest value (f32), and the merged logits within 1e-5;
* with `--dtype bf16`: each bf16 tensor is PEFT's f32 merge rounded once (at most 1 ulp apart, and
  exactly our own f32 merge rounded);
* into host buffers (peft_merge_buffer_apply through the Python binding): f32 weights as PEFT's,
  bf16 ones the f32 merge of the same values rounded once, and removal with kept rows restoring the
  original bytes, also after swapping among methods;
* weighted: `--adapter dir:0.5` equals PEFT with the method's scale set to half (set_scale for
  LoHa/LoKr/AdaLoRA's scaling, ia3_l * 0.5 for IA3, add_weighted_adapter's sum for one adapter);
* an adapter of a method that cannot be merged (prompt tuning, X-LoRA...) fails with UNSUPPORTED
  naming the method and why.

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch

from merge_support import (compare_weights, file_tensors, load_model, relative_logit_error, run_merge,
                           saved_tensors)


def _generator(fixtures_dir):
    sys.path.insert(0, str(fixtures_dir))
    from generator.method_adapters import CASES, make_method_adapter

    return CASES, make_method_adapter


CASE_NAMES = ["llama_loha", "llama_loha_pattern", "llama_lokr_decomposed", "llama_lokr_full", "llama_adalora",
              "llama_ia3", "gpt2_ia3", "gpt2_adalora"]


def peft_reference(base, adapter, weight=1.0):
    from peft import PeftModel

    model = load_model(base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = PeftModel.from_pretrained(model, str(adapter))
        if weight != 1.0:
            for module in peft_model.modules():
                if hasattr(module, "ia3_l") and "default" in getattr(module, "ia3_l", {}):
                    module.ia3_l["default"].data *= weight
                elif hasattr(module, "scaling") and isinstance(module.scaling, dict) and "default" in module.scaling:
                    module.scaling["default"] = weight * module.scaling["default"]
        return peft_model.merge_and_unload().eval()


@pytest.fixture
def method_adapter(fixtures_dir, tmp_path):
    cases, make = _generator(fixtures_dir)

    def build(case):
        base_name = cases[case][0]
        base = fixtures_dir / "models" / base_name
        return base, make(case, base, tmp_path / case)

    return build


@pytest.mark.parametrize("case", CASE_NAMES)
def test_file_merge_matches_peft(case, method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter(case)
    ours_dir = tmp_path / "ours"
    run_merge(peftc_binary, base, [(adapter, 1.0)], ours_dir)
    ref = peft_reference(base, adapter)
    ours_tensors = file_tensors(ours_dir)
    ref_tensors = saved_tensors(ref, tmp_path / "ref")
    stats = compare_weights(ours_tensors, ref_tensors)
    assert stats["f32_rel"] <= 1e-6, stats
    base_tensors = file_tensors(base)
    changed = [n for n in ours_tensors if not torch.equal(ours_tensors[n], base_tensors[n])]
    assert changed, "the merge changed nothing"
    assert relative_logit_error(load_model(ours_dir), ref) <= 1e-5


@pytest.mark.parametrize("case", ["llama_loha", "llama_lokr_decomposed", "llama_adalora", "gpt2_ia3"])
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


@pytest.mark.parametrize("case", ["llama_loha", "llama_lokr_full", "llama_adalora", "llama_ia3", "gpt2_ia3"])
def test_weighted_merge_matches_peft(case, method_adapter, peftc_binary, tmp_path):
    base, adapter = method_adapter(case)
    run_merge(peftc_binary, base, [(adapter, 0.5)], tmp_path / "ours")
    ref = peft_reference(base, adapter, weight=0.5)
    stats = compare_weights(file_tensors(tmp_path / "ours"), saved_tensors(ref, tmp_path / "ref"))
    assert stats["f32_rel"] <= 1e-6, stats


@pytest.mark.parametrize("peft_type,why", [("PROMPT_TUNING", "virtual tokens"), ("PREFIX_TUNING", "prefixes"),
                                           ("P_TUNING", "virtual tokens"), ("XLORA", "per-token routing"),
                                           ("POLY", "mixture of LoRA skills")])
def test_unmergeable_methods_are_refused(peft_type, why, peftc_binary, fixtures_dir, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"peft_type": peft_type}))
    (adapter / "adapter_model.safetensors").write_bytes((fixtures_dir / "adapters" / "llama_lora" /
                                                         "adapter_model.safetensors").read_bytes())
    proc = subprocess.run([str(peftc_binary), "merge", "--base", str(fixtures_dir / "models" / "llama"), "--adapter",
                           str(adapter), "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "UNSUPPORTED" in proc.stderr and peft_type in proc.stderr and why in proc.stderr, proc.stderr


def _module_names(adapter):
    return [m.name for m in adapter.modules if m.kind.name not in ("FULL", "TRAINABLE_TOKENS")]


@pytest.mark.parametrize("case", ["llama_loha", "llama_lokr_decomposed", "llama_lokr_full", "llama_adalora",
                                  "llama_ia3", "gpt2_adalora", "gpt2_ia3"])
def test_host_buffer_merge_matches_peft_and_comes_out_exactly(case, method_adapter, peft_c, tmp_path):
    """peft_merge_buffer_apply through the Python binding: each weight equals PEFT's merged weight
    (f32, 1e-6 relative), a bf16 buffer is that f32 result rounded once, and removal with
    keep_original_rows restores the original bytes."""
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

            # bf16: the f32 merge of the same (bf16) values, rounded once.
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
    """One llama weight: LoHa, then LoKr on top, then IA3, removed in reverse order, then AdaLoRA
    alone and removed, in f32 and bf16: the buffer ends as it began, bit for bit."""
    adapters = {case: method_adapter(case)[1] for case in ("llama_loha", "llama_lokr_decomposed", "llama_ia3",
                                                           "llama_adalora")}
    base = method_adapter("llama_loha")[0]
    module = "model.layers.0.self_attn.v_proj"
    opened = {case: peft_c.Adapter.open(str(path)) for case, path in adapters.items()}
    try:
        for dtype in (torch.float32, torch.bfloat16):
            weight = file_tensors(base)[module + ".weight"].to(dtype).contiguous()
            original = weight.clone()
            view = torch.int32 if dtype == torch.float32 else torch.int16
            records = [peft_c.merge_into(opened[c], module, weight, keep_original_rows=True)
                       for c in ("llama_loha", "llama_lokr_decomposed", "llama_ia3")]
            assert not torch.equal(weight.view(view), original.view(view))
            for record in reversed(records):
                record.remove(weight)
            assert torch.equal(weight.view(view), original.view(view))
            record = peft_c.merge_into(opened["llama_adalora"], module, weight, scale=0.5, keep_original_rows=True)
            record.remove(weight)
            assert torch.equal(weight.view(view), original.view(view))
    finally:
        for a in opened.values():
            a.close()
