"""LN tuning (peft_type LN_TUNING) and trainable tokens (TRAINABLE_TOKENS): adapters that replace
tensors instead of adding to them, against PEFT 0.21's own merge_and_unload().

The adapters are made at test time by tests/fixtures/generator/method_adapters.py with the real
peft package (seeded random parameters) on the tiny llama (RMSNorms, untied embeddings) and gpt2
(input embedding tied to lm_head) models. For each:

* `peftc merge` (file merge): every tensor equals PEFT's merged model (the replaced ones bit for bit),
  and so do the merged logits; with `--dtype bf16` each tensor is PEFT's f32 merge rounded once;
* into host buffers (peft_merge_buffer_apply through the Python binding): the replaced norm or
  embedding rows equal PEFT's, and removal restores the original bytes (f32 and bf16);
* a merge weight other than 1 is refused (UNSUPPORTED): PEFT defines no scale for replacements.

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

from merge_support import compare_weights, file_tensors, load_model, relative_logit_error, run_merge, saved_tensors

CASES = ["llama_ln_tuning", "llama_trainable_tokens", "gpt2_trainable_tokens"]


def peft_reference(base, adapter):
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PeftModel.from_pretrained(load_model(base), str(adapter)).merge_and_unload().eval()


@pytest.fixture
def replacement_adapter(fixtures_dir, tmp_path):
    sys.path.insert(0, str(fixtures_dir))
    from generator.method_adapters import CASES as RECIPES, make_method_adapter

    def build(case):
        base = fixtures_dir / "models" / RECIPES[case][0]
        return base, make_method_adapter(case, base, tmp_path / case)

    return build


@pytest.mark.parametrize("case", CASES)
def test_file_merge_matches_peft(case, replacement_adapter, peftc_binary, tmp_path):
    base, adapter = replacement_adapter(case)
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "ours")
    ref_model = peft_reference(base, adapter)
    ours, ref = file_tensors(tmp_path / "ours"), saved_tensors(ref_model, tmp_path / "ref")
    base_tensors = file_tensors(base)
    changed = [n for n in ours if n in base_tensors and not torch.equal(ours[n], base_tensors[n])]
    assert changed, "the merge changed nothing"
    for name in changed:
        assert torch.equal(ours[name], ref[name]), name
    assert compare_weights(ours, ref)["f32_rel"] == 0.0
    assert relative_logit_error(load_model(tmp_path / "ours"), ref_model) <= 1e-6


@pytest.mark.parametrize("case", ["llama_ln_tuning", "gpt2_trainable_tokens"])
def test_bf16_merge_rounds_once(case, replacement_adapter, peftc_binary, tmp_path):
    base, adapter = replacement_adapter(case)
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "bf16", "--dtype", "bf16")
    ours = file_tensors(tmp_path / "bf16")
    ref = saved_tensors(peft_reference(base, adapter).to(torch.bfloat16), tmp_path / "ref")
    for name, tensor in ours.items():
        assert torch.equal(tensor.view(torch.int16), ref[name].view(torch.int16)), name


@pytest.mark.parametrize("case", ["llama_ln_tuning", "llama_trainable_tokens"])
def test_weighted_merge_is_refused(case, replacement_adapter, peftc_binary, tmp_path):
    base, adapter = replacement_adapter(case)
    proc = subprocess.run([str(peftc_binary), "merge", "--base", str(base), "--adapter", f"{adapter}:0.5", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "UNSUPPORTED" in proc.stderr and "no merge weight" in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", CASES)
def test_host_buffer_merge_matches_peft_and_comes_out_exactly(case, replacement_adapter, peft_c, tmp_path):
    base, adapter_dir = replacement_adapter(case)
    ref = saved_tensors(peft_reference(base, adapter_dir), tmp_path / "ref")
    tensors = file_tensors(base)
    with peft_c.Adapter.open(str(adapter_dir)) as adapter:
        names = [m.name for m in adapter.modules]
        assert names
        for module in names:
            key = module + ".weight"
            for dtype in (torch.float32, torch.bfloat16):
                weight = tensors[key].to(dtype).contiguous()
                original = weight.clone()
                view = torch.int32 if dtype == torch.float32 else torch.int16
                record = peft_c.merge_into(adapter, module, weight)
                assert torch.equal(weight.view(view), ref[key].to(dtype).view(view)), (key, dtype)
                assert not torch.equal(weight.view(view), original.view(view)), key
                with pytest.raises(peft_c.PeftError, match="no merge weight"):
                    peft_c.merge_into(adapter, module, original.clone(), scale=0.5)
                record.remove(weight)
                assert torch.equal(weight.view(view), original.view(view)), (key, dtype)
