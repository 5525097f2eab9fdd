"""Merges of PEFT's multiplicative methods OFT, BOFT and HRA against PEFT 0.21's own
merge_and_unload(), on the tiny llama model (PEFT implements these methods for Linear and Conv2d
layers only: GPT-2's Conv1D is refused by PEFT and by peftc).

The adapters come from the committed recipe tests/fixtures/generator/method_adapters.py (the real
peft package, seeded random parameters). The rotation is built in f64 here and in f32 by PEFT
(torch.linalg.solve for the exact Cayley transform), so bits are not expected to agree:

* `peftc merge`: every tensor within 1e-6 of the tensor's largest value of PEFT's, logits within 1e-5;
  `--dtype bf16`: each bf16 tensor is our f32 merge rounded once, at most 1 ulp from PEFT's f32
  merge rounded;
* host buffers (peft_merge_buffer_apply through the Python binding): f32 and bf16 as above;
  removal with kept rows restores the original bytes, PEFT's arithmetic unmerge (inverse rotation)
  comes back within 1e-5; swapping among methods (OFT, BOFT, HRA, LoHa, IA3) and back to none
  restores the original bits;
* BOFT with several butterfly factors (boft_R [N > 1, ...], which PEFT trains only with its CUDA
  extension) against PEFT's own permutations and Cayley transform;
* a merge weight other than 1 is refused (PEFT has no scale for rotations).

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
from safetensors.torch import load_file, save_file

from merge_support import compare_weights, file_tensors, load_model, relative_logit_error, run_merge, saved_tensors

CASES = ["llama_oft", "llama_oft_cayley_coft", "llama_oft_share", "llama_boft", "llama_boft_blocknum", "llama_hra",
         "llama_hra_gs"]


def _make(fixtures_dir, case, out):
    sys.path.insert(0, str(fixtures_dir))
    from generator.method_adapters import make_method_adapter

    base = fixtures_dir / "models" / "llama"
    return base, make_method_adapter(case, base, out)


def peft_reference(base, adapter):
    from peft import PeftModel

    model = load_model(base)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PeftModel.from_pretrained(model, str(adapter)).merge_and_unload().eval()


@pytest.fixture
def rotation_adapter(fixtures_dir, tmp_path):
    return lambda case: _make(fixtures_dir, case, tmp_path / case)


@pytest.mark.parametrize("case", CASES)
def test_file_merge_matches_peft(case, rotation_adapter, peftc_binary, tmp_path):
    base, adapter = rotation_adapter(case)
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "ours")
    ref = peft_reference(base, adapter)
    ours = file_tensors(tmp_path / "ours")
    stats = compare_weights(ours, saved_tensors(ref, tmp_path / "ref"))
    assert stats["f32_rel"] <= 1e-6, stats
    base_tensors = file_tensors(base)
    assert any(not torch.equal(ours[n], base_tensors[n]) for n in ours), "the merge changed nothing"
    assert relative_logit_error(load_model(tmp_path / "ours"), ref) <= 1e-5


@pytest.mark.parametrize("case", ["llama_oft", "llama_boft", "llama_hra"])
def test_bf16_merge_rounds_once(case, rotation_adapter, peftc_binary, tmp_path):
    base, adapter = rotation_adapter(case)
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "bf16", "--dtype", "bf16")
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "f32")
    ours, wide = file_tensors(tmp_path / "bf16"), file_tensors(tmp_path / "f32")
    ref = saved_tensors(peft_reference(base, adapter).to(torch.bfloat16), tmp_path / "ref")
    assert compare_weights(ours, ref)["max_ulp"] <= 1
    for name, tensor in ours.items():
        assert torch.equal(wide[name].to(torch.bfloat16).view(torch.int16), tensor.view(torch.int16)), name


@pytest.mark.parametrize("case", ["llama_oft", "llama_hra"])
def test_merge_weight_other_than_one_is_refused(case, rotation_adapter, peftc_binary, tmp_path):
    base, adapter = rotation_adapter(case)
    proc = subprocess.run([str(peftc_binary), "merge", "--base", str(base), "--adapter", f"{adapter}:0.5", "--out",
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "UNSUPPORTED" in proc.stderr and "no merge weight for rotations" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_gpt2_conv1d_is_refused(fixtures_dir, peftc_binary, tmp_path):
    """PEFT has no Conv1D form of OFT; an oft_R for GPT-2's c_attn is refused, not merged."""
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "OFT", "r": 4, "oft_block_size": 0, "target_modules": ["c_attn"]}))
    save_file({"base_model.model.transformer.h.0.attn.c_attn.oft_R.weight": torch.zeros(4, 6)},
              str(adapter / "adapter_model.safetensors"))
    proc = subprocess.run([str(peftc_binary), "merge", "--base", str(fixtures_dir / "models" / "gpt2"), "--adapter",
                           str(adapter), "--out", str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "Conv1D" in proc.stderr and "OFT" in proc.stderr, proc.stderr


def _names(adapter):
    return [m.name for m in adapter.modules if m.kind.name not in ("FULL", "TRAINABLE_TOKENS")]


@pytest.mark.parametrize("case", CASES)
def test_host_buffer_merge_matches_peft_and_comes_out(case, rotation_adapter, peft_c, tmp_path):
    base, adapter_dir = rotation_adapter(case)
    ref = saved_tensors(peft_reference(base, adapter_dir), tmp_path / "ref")
    tensors = file_tensors(base)
    with peft_c.Adapter.open(str(adapter_dir)) as adapter:
        names = _names(adapter)
        assert names
        for module in names:
            key = module + ".weight"
            original = tensors[key].clone()
            weight = original.clone()
            record = peft_c.merge_into(adapter, module, weight, keep_original_rows=True)
            want = ref[key].double()
            assert float((weight.double() - want).abs().max()) <= 1e-6 * float(want.abs().max()), key
            record.remove(weight)
            assert torch.equal(weight.view(torch.int32), original.view(torch.int32)), key

            # PEFT's arithmetic unmerge (the inverse rotation): close, not exact.
            record = peft_c.merge_into(adapter, module, weight)
            record.remove(weight)
            assert float((weight.double() - original.double()).abs().max()) <= 1e-5 * float(original.abs().max()), key

            half = original.to(torch.bfloat16)
            half_original = half.clone()
            wide = half.float()
            peft_c.merge_into(adapter, module, wide)
            record = peft_c.merge_into(adapter, module, half, keep_original_rows=True)
            assert torch.equal(half.view(torch.int16), wide.to(torch.bfloat16).view(torch.int16)), key
            assert not torch.equal(half.view(torch.int16), half_original.view(torch.int16)), key
            record.remove(half)
            assert torch.equal(half.view(torch.int16), half_original.view(torch.int16)), key
        with pytest.raises(peft_c.PeftError) as err:
            peft_c.merge_into(adapter, names[0], tensors[names[0] + ".weight"].clone(), scale=0.5)
        assert "no merge weight for rotations" in str(err.value)


def test_host_buffer_swap_among_methods_and_back_to_none(rotation_adapter, fixtures_dir, tmp_path, peft_c):
    """One llama weight: OFT, HRA, BOFT, LoHa and IA3 merged in turn with kept rows, removed in
    reverse order, in f32 and bf16: the buffer ends as it began, bit for bit."""
    cases = ["llama_oft", "llama_hra_gs", "llama_boft", "llama_loha", "llama_ia3"]
    opened = [peft_c.Adapter.open(str(rotation_adapter(c)[1])) for c in cases]
    module = "model.layers.0.self_attn.v_proj"
    try:
        for dtype in (torch.float32, torch.bfloat16):
            weight = file_tensors(fixtures_dir / "models" / "llama")[module + ".weight"].to(dtype).contiguous()
            original = weight.clone()
            view = torch.int32 if dtype == torch.float32 else torch.int16
            records = [peft_c.merge_into(a, module, weight, keep_original_rows=True) for a in opened]
            assert not torch.equal(weight.view(view), original.view(view))
            for record in reversed(records):
                record.remove(weight)
            assert torch.equal(weight.view(view), original.view(view))
    finally:
        for a in opened:
            a.close()


def test_boft_butterfly_factors_match_peft_permutations(rotation_adapter, peftc_binary, tmp_path):
    """boft_R with N = 2 butterfly factors (PEFT builds those only with its CUDA extension): the
    reference is PEFT's get_delta_weight arithmetic with its own block_butterfly_perm, perm2mat and
    cayley_batch, block-diagonalised per factor as its FastBlockDiag does."""
    from peft.tuners.boft.layer import BOFTLayer

    base, adapter = rotation_adapter("llama_boft")
    config = json.loads((adapter / "adapter_config.json").read_text())
    config["boft_n_butterfly_factor"] = 2
    (adapter / "adapter_config.json").write_text(json.dumps(config))
    params = load_file(str(adapter / "adapter_model.safetensors"))
    g = torch.Generator().manual_seed(3)
    for key in [k for k in params if k.endswith("boft_R")]:
        _, d, h, _ = params[key].shape
        params[key] = 0.3 * torch.randn((2, d, h, h), generator=g)
    save_file(params, str(adapter / "adapter_model.safetensors"))
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "ours")
    ours = file_tensors(tmp_path / "ours")
    weights = file_tensors(base)
    helper = BOFTLayer.__new__(BOFTLayer)
    checked = 0
    for key, boft_r in params.items():
        if not key.endswith("boft_R"):
            continue
        module = key.removeprefix("base_model.model.").removesuffix(".boft_R")
        boft_s = params[key.removesuffix("boft_R") + "boft_s"]
        n, d, h, _ = boft_r.shape
        w = weights[module + ".weight"]
        in_features = w.shape[1]
        perms = torch.stack([helper.perm2mat(helper.block_butterfly_perm(in_features, d // 2**i, h // 2, n - 1))
                             for i in range(n)])
        rotations = helper.cayley_batch(boft_r.reshape(n * d, h, h)).reshape(n, d, h, h)
        blocks = torch.stack([torch.block_diag(*rotations[i]) for i in range(n)])
        batch = torch.bmm(perms, torch.bmm(blocks, perms.permute(0, 2, 1)))
        mat = batch[0]
        for i in range(1, n):
            mat = batch[i] @ mat
        want = (mat @ w.t()).t() * boft_s
        got = ours[module + ".weight"]
        assert float((got.double() - want.double()).abs().max()) <= 1e-6 * float(want.abs().max()), module
        checked += 1
    assert checked
