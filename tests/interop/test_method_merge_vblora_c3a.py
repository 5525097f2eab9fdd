"""VB-LoRA and C3A (issue 18) against PEFT 0.21's own merge_and_unload(), on the tiny llama and gpt2
(Conv1D, fan_in_fan_out) models; PEFT implements C3A for torch.nn.Linear only, so gpt2 has VB-LoRA
cases and a C3A refusal.

The adapters are made at test time by tests/fixtures/generator/method_adapters.py with the real peft
package (seeded random logits, vector bank and kernels). VB-LoRA is saved both ways: logits whole,
and with save_only_topk_weights (top-k indices as uint8 / int16 and the first topk - 1 weights). For
each:

* `peftc merge`: every tensor within 1e-6 of PEFT's merged model relative to the tensor's largest
  value (f32), the logits within 1e-5; `--dtype bf16` is our f32 merge rounded once, at most 1 ulp
  from PEFT's f32 merge rounded;
* a BF16 base (llama_bf16): round(float(W) + dW), within one bf16 step of PEFT's merge into that
  base held in f32 and rounded once;
* weighted: VB-LoRA and C3A have no scale, so C3A at 0.5 against PEFT with the kernels halved, and
  VB-LoRA at 0.25 against PEFT with the vector bank halved (A and B both halve); exact in binary;
* host buffers (peft_merge_buffer_apply via the Python binding): f32 as PEFT's, bf16 the f32 merge
  rounded once, removal with kept rows giving back the original bytes;
* registry host swap (Registry + HostModel, F32 and BF16): after each swap every host tensor is
  PEFT's merge of that adapter alone, and swapping to none restores the original bits;
* conversion to LoRA (`peftc adapter convert --to lora --rank R`): the reported relative error
  equals that of the best rank-R approximation of PEFT's delta W' - W (numpy SVD), and so does the
  written B A's;
* C3A on GPT-2 Conv1D: PEFT raises TypeError, peftc refuses naming C3A and Linear;
* the C3A delta is the exact circulant: PEFT's FFT-built delta (get_circulant_fast) is within the
  bound of docs/peft-semantics.md of ours, for blocks up to 64.

Environment: PEFTC (the peftc binary), PEFT_C_LIB (for the binding), PEFT_TEST_DATA.
"""

from __future__ import annotations

import json
import math
import subprocess
import warnings

import numpy as np
import pytest
import torch

from merge_support import (check_bf16_buffer_merge, compare_weights, file_tensors, load_model,
                           relative_logit_error, run_merge, saved_tensors)
from test_method_merge import _module_names, method_adapter  # noqa: F401  (fixture)

pytest.importorskip("peft")

CASE_NAMES = ["llama_vblora", "llama_vblora_topk", "gpt2_vblora", "gpt2_vblora_topk", "llama_c3a"]


def peft_reference(base, adapter, weight=1.0, dtype=None):
    """PEFT's merge_and_unload(); weight != 1 multiplies the vector bank by sqrt(weight) (A and B
    are both mixtures of it) or the C3A kernels by weight: for 0.25 / 0.5 PEFT's delta scales
    exactly."""
    from peft import PeftModel

    model = load_model(base, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = PeftModel.from_pretrained(model, str(adapter))
        if weight != 1.0:
            banks = getattr(peft_model.base_model, "vblora_vector_bank", None)
            if banks is not None:
                banks["default"].data *= math.sqrt(weight)
            for module in peft_model.modules():
                if "default" in getattr(module, "c3a_kernel", {}):
                    module.c3a_kernel["default"].data *= weight
        return peft_model.merge_and_unload().eval()


@pytest.mark.parametrize("case", CASE_NAMES)
def test_file_merge_matches_peft(case, method_adapter, peftc_binary, tmp_path):  # noqa: F811
    base, adapter = method_adapter(case)
    if case.endswith("_topk"):
        saved = json.loads((adapter / "adapter_config.json").read_text())
        assert saved["save_only_topk_weights"] is True
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "ours")
    ref = peft_reference(base, adapter)
    ours = file_tensors(tmp_path / "ours")
    stats = compare_weights(ours, saved_tensors(ref, tmp_path / "ref"))
    assert stats["f32_rel"] <= 1e-6, stats
    base_tensors = file_tensors(base)
    changed = [n for n in ours if not torch.equal(ours[n], base_tensors[n])]
    assert len(changed) == (12 if case.startswith("llama") else 4), changed
    assert relative_logit_error(load_model(tmp_path / "ours"), ref) <= 1e-5


def test_topk_adapter_holds_indices_and_weights(method_adapter):  # noqa: F811
    from safetensors.torch import load_file

    for case, index_dtype in (("llama_vblora_topk", torch.uint8), ("gpt2_vblora_topk", torch.int16)):
        _, adapter = method_adapter(case)
        saved = load_file(str(adapter / "adapter_model.safetensors"))
        indices = [k for k in saved if k.endswith("_topk_indices")]
        assert indices and not [k for k in saved if k.endswith(("logits_A", "logits_B"))]
        assert {saved[k].dtype for k in indices} == {index_dtype}
        assert "base_model.vblora_vector_bank" in saved


@pytest.mark.parametrize("case", ["llama_vblora", "gpt2_vblora_topk", "llama_c3a"])
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


def _within_one_bf16_step(ours: torch.Tensor, ref: torch.Tensor) -> bool:
    a, b = ours.float(), ref.float()
    step = torch.exp2(torch.floor(torch.log2(torch.maximum(a.abs(), b.abs()).clamp_min(1e-30))) - 7)
    return bool(((a - b).abs() <= step).all())


@pytest.mark.parametrize("case", ["llama_vblora", "llama_vblora_topk", "llama_c3a"])
def test_bf16_base_merge(case, method_adapter, peftc_binary, fixtures_dir, tmp_path):  # noqa: F811
    """The llama_bf16 base: our merge is round(float(W) + dW), within one bf16 step of PEFT's merge
    into that base held in f32, rounded once."""
    _, adapter = method_adapter(case)
    base = fixtures_dir / "models" / "llama_bf16"
    run_merge(peftc_binary, base, [(adapter, 1.0)], tmp_path / "ours")
    ours = file_tensors(tmp_path / "ours")
    ref = peft_reference(base, adapter, dtype=torch.float32).to(torch.bfloat16).state_dict()
    before = file_tensors(base)
    changed = 0
    for name, tensor in ours.items():
        assert tensor.dtype == torch.bfloat16, name
        assert _within_one_bf16_step(tensor, ref[name]), name
        changed += not torch.equal(tensor.view(torch.int16), before[name].view(torch.int16))
    assert changed == 12


@pytest.mark.parametrize("case", ["llama_vblora", "gpt2_vblora", "llama_vblora_topk", "llama_c3a"])
def test_weighted_merge_matches_peft(case, method_adapter, peftc_binary, tmp_path):  # noqa: F811
    base, adapter = method_adapter(case)
    weight = 0.5 if case.endswith("c3a") else 0.25
    run_merge(peftc_binary, base, [(adapter, weight)], tmp_path / "ours")
    ref = peft_reference(base, adapter, weight=weight)
    stats = compare_weights(file_tensors(tmp_path / "ours"), saved_tensors(ref, tmp_path / "ref"))
    assert stats["f32_rel"] <= 1e-6, stats


@pytest.mark.parametrize("case", CASE_NAMES)
def test_host_buffer_merge_matches_peft_and_comes_out_exactly(case, method_adapter, peft_c, tmp_path):  # noqa: F811
    base, adapter_dir = method_adapter(case)
    ref = saved_tensors(peft_reference(base, adapter_dir), tmp_path / "ref")
    tensors = file_tensors(base)
    with peft_c.Adapter.open(str(adapter_dir)) as adapter:
        names = _module_names(adapter)
        assert len(names) == (12 if case.startswith("llama") else 4)
        for module in names:
            key = module + ".weight"
            weight = tensors[key].clone()
            original = weight.clone()
            record = peft_c.merge_into(adapter, module, weight, keep_original_rows=True)
            want = ref[key].double()
            assert not torch.equal(weight, original), key
            assert float((weight.double() - want).abs().max()) <= 1e-6 * float(want.abs().max()), key
            record.remove(weight)
            assert torch.equal(weight.view(torch.int32), original.view(torch.int32)), key

            check_bf16_buffer_merge(peft_c, adapter, module, original, key)


# Registry host swap ---------------------------------------------------------------------------


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


SWAPS = {"llama": ["llama_vblora", "llama_c3a", "llama_vblora_topk", "llama_loha", "llama_c3a"],
         "gpt2": ["gpt2_vblora", "gpt2_vblora_topk", "gpt2_ia3", "gpt2_vblora"]}


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_registry_swap_and_back_to_none(family, dtype, method_adapter, peft_c):  # noqa: F811
    from serve_support import TORCH_DTYPES, host_layers, load_base

    folders = {}
    for case in SWAPS[family]:
        base, folders[case] = method_adapter(case)
    torch_dtype = TORCH_DTYPES[dtype]
    model = load_base(base, torch_dtype)
    tensors = {}
    with peft_c.HostModel() as host, peft_c.Registry(dtype, 1 << 30) as registry:
        for name, module in host_layers(model).items():
            bias = module.bias.data if module.bias is not None else None
            host.add_weight(f"{name}.weight", module.weight.data, bias=bias)
            tensors[f"{name}.weight"] = module.weight.data
            if bias is not None:
                tensors[f"{name}.bias"] = bias
        original = {k: v.clone() for k, v in tensors.items()}
        for case, folder in folders.items():
            registry.register(case, folder, base_dir=base)
        for case in SWAPS[family]:
            with registry.acquire(case) as lease:
                swap = host.swap(lease)
            assert host.current == case and swap.layers_merged > 0
            if dtype == "F32":
                ref = {k: v.detach() for k, v in peft_reference(base, folders[case]).state_dict().items()}
            else:  # PEFT's merge into the bf16 base held in f32, rounded once (the buffer merge's arithmetic)
                model32 = load_base(base, torch.bfloat16).float()
                from peft import PeftModel

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    merged = PeftModel.from_pretrained(model32, str(folders[case])).merge_and_unload()
                ref = {k: v.detach().to(torch.bfloat16) for k, v in merged.state_dict().items()}
            changed = 0
            for key, tensor in tensors.items():
                theirs = ref[key]
                if dtype == "F32":
                    rel = float((tensor.double() - theirs.double()).abs().max() / theirs.double().abs().max())
                    assert rel <= 1e-6, f"{case} {key}: {rel}"
                else:
                    assert _within_one_bf16_step(tensor, theirs), f"{case} {key}"
                changed += not torch.equal(_bits(tensor), _bits(original[key]))
            assert changed, case
        swap = host.swap(None)
        assert host.current is None and swap.layers_merged == 0
        for key, tensor in tensors.items():
            assert torch.equal(_bits(tensor), _bits(original[key])), key
        assert registry.stats().pinned == 0


# Conversion to LoRA ---------------------------------------------------------------------------


def _convert(peftc, adapter, out, *args):
    result = subprocess.run([str(peftc), "adapter", "convert", str(adapter), str(out), "--to", "lora",
                             *map(str, args), "--json"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    return {m["name"]: m for m in json.loads(result.stdout)["modules"]}


def _products(out) -> dict:
    from safetensors.numpy import load_file

    f = load_file(str(out / "adapter_model.safetensors"))
    names = sorted({k[len("base_model.model."):-len(".lora_A.weight")] for k in f if k.endswith(".lora_A.weight")})
    return {n: f[f"base_model.model.{n}.lora_B.weight"].astype(np.float64)
            @ f[f"base_model.model.{n}.lora_A.weight"].astype(np.float64) for n in names}


def _peft_deltas(base, adapter) -> dict:
    """PEFT's W' - W per adapted module (f64 of the f32 weights)."""
    before = {k: v.detach().double().clone() for k, v in load_model(base).state_dict().items()}
    merged = peft_reference(base, adapter).state_dict()
    return {k[: -len(".weight")]: (merged[k].double() - before[k]).numpy() for k in merged
            if k.endswith(".weight") and not torch.equal(merged[k].double(), before[k])}


@pytest.mark.parametrize("case,rank", [("llama_vblora", 2), ("llama_vblora_topk", 1), ("llama_c3a", 3),
                                       ("gpt2_vblora", 2)])
def test_convert_to_lora_against_svd_of_peft_delta(case, rank, method_adapter, peftc_binary, tmp_path):  # noqa: F811
    base, adapter = method_adapter(case)
    out = tmp_path / "lora"
    report = _convert(peftc_binary, adapter, out, "--rank", rank)
    deltas = _peft_deltas(base, adapter)
    ours = _products(out)
    assert sorted(ours) == sorted(deltas) == sorted(report)
    lossy = 0.0
    for name, delta in deltas.items():
        if case.startswith("gpt2"):
            delta = delta.T  # Conv1D stores [in, out]; the LoRA product is [out, in]
        s = np.linalg.svd(delta, compute_uv=False)
        expected = float(np.sqrt((s[rank:] ** 2).sum() / (s**2).sum()))
        assert report[name]["rank"] == rank
        assert abs(report[name]["relative_error"] - expected) < 1e-4, (name, report[name], expected)
        # B A is a best rank-R approximation: its error is the optimum (C3A's circulant blocks have
        # paired singular values, so the best approximation itself need not be unique).
        assert abs(float(np.linalg.norm(ours[name] - delta) / np.linalg.norm(delta)) - expected) < 1e-4, name
        lossy = max(lossy, expected)
    assert lossy > 0.01  # a rank below the delta's: the check can fail


# C3A on GPT-2 Conv1D --------------------------------------------------------------------------


def test_c3a_on_conv1d_is_refused_like_peft(fixtures_dir, peftc_binary, tmp_path):
    import peft
    import transformers
    from safetensors.torch import save_file

    gpt2 = fixtures_dir / "models" / "gpt2"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.AutoModelForCausalLM.from_pretrained(str(gpt2), dtype=torch.float32)
        with pytest.raises(TypeError, match="only `torch.nn.Linear` is supported"):
            peft.get_peft_model(model, peft.C3AConfig(block_size=4, target_modules=["c_attn"]))
    # The adapter PEFT would write if it accepted the layer: c_attn is Conv1D [16, 48], out 48, in 16.
    adapter = tmp_path / "c3a_gpt2"
    adapter.mkdir()
    config = peft.C3AConfig(block_size=4, target_modules=["c_attn"]).to_dict()
    config["peft_type"] = "C3A"
    (adapter / "adapter_config.json").write_text(json.dumps(config, default=list))
    g = torch.Generator().manual_seed(0)
    save_file({"base_model.model.transformer.h.0.attn.c_attn.c3a_kernel": torch.randn(12, 4, 4, generator=g)},
              str(adapter / "adapter_model.safetensors"))
    proc = subprocess.run([str(peftc_binary), "merge", "--base", str(gpt2), "--adapter", str(adapter), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert "C3A" in proc.stderr and "Linear" in proc.stderr and "Conv1D" in proc.stderr, proc.stderr


# The C3A delta against PEFT's FFT construction ------------------------------------------------


@pytest.mark.parametrize("blocks_out,blocks_in,b", [(2, 3, 4), (3, 2, 16), (1, 2, 64), (2, 2, 5)])
def test_c3a_fft_delta_within_bound_of_exact(blocks_out, blocks_in, b, method_adapter, peft_c, tmp_path):  # noqa: F811
    """PEFT's get_circulant_fast(kernel) / in (f32 pocketfft) against our host-buffer merge into a zero
    weight (the exact circulant / in, rounded once): |PEFT - ours| <= (2 log2(b) + 4) 2^-24
    max_(M,N) ||kernel[M, N]||_1 / in + 1 ulp of ours, per element."""
    from peft.tuners.c3a.utils import get_circulant_fast
    from safetensors.torch import save_file

    out, inp = blocks_out * b, blocks_in * b
    g = torch.Generator().manual_seed(b)
    kernel = torch.randn(blocks_out, blocks_in, b, generator=g)
    adapter = tmp_path / "c3a"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "C3A", "block_size": b, "target_modules": ["lin"], "task_type": None}))
    save_file({"base_model.model.lin.c3a_kernel": kernel}, str(adapter / "adapter_model.safetensors"))
    ours = torch.zeros(out, inp)
    with peft_c.Adapter.open(str(adapter)) as handle:
        peft_c.merge_into(handle, "lin", ours)
    exact = torch.zeros(out, inp, dtype=torch.float64)
    for i in range(out):
        for j in range(inp):
            exact[i, j] = float(kernel[i // b, j // b, ((j % b) - (i % b)) % b]) / inp
    assert torch.equal(ours, exact.float()), "ours is not the exact circulant rounded once"
    theirs = get_circulant_fast(kernel) / inp
    bound = (2 * math.log2(b) + 4) * 2.0**-24 * float(kernel.abs().sum(-1).max()) / inp
    ulp = ours.double().abs() * 2.0**-23
    assert bool(((theirs.double() - ours.double()).abs() <= bound + ulp).all())


# Inspection -----------------------------------------------------------------------------------


@pytest.mark.parametrize("case,method", [("llama_vblora", "VBLORA"), ("llama_vblora_topk", "VBLORA"),
                                         ("gpt2_vblora", "VBLORA"), ("llama_c3a", "C3A")])
def test_inspect_and_doctor_report_the_method(case, method, method_adapter, peftc_binary):  # noqa: F811
    base, adapter = method_adapter(case)
    run = subprocess.run([str(peftc_binary), "adapter", "inspect", str(adapter), "--base", str(base), "--json"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["peft_type"] == method
    modules = {m["module"]: m for m in report["modules"]}
    assert len(modules) == (12 if case.startswith("llama") else 4), sorted(modules)
    for name, m in modules.items():
        assert m["kind"] == ("conv1d" if case.startswith("gpt2") else "linear"), name
        if method == "C3A":
            assert set(m["tensors"]) == {"c3a_kernel"}
            assert m["rank"] == (8 if name.endswith("up_proj") else 4), name  # the block size
        elif case.endswith("_topk"):
            assert {t for t in m["tensors"]} == {f"vblora_logits_{f}_topk_{p}" for f in "AB"
                                                 for p in ("indices", "weights")}
        else:
            assert set(m["tensors"]) == {"vblora_logits_A", "vblora_logits_B"}
            assert m["rank"] == json.loads((adapter / "adapter_config.json").read_text())["r"]
    doctor = subprocess.run([str(peftc_binary), "doctor", "--json", "--adapter", str(adapter), "--base", str(base)],
                            capture_output=True, text=True)
    assert doctor.returncode in (0, 1), doctor.stderr
    found = json.loads(doctor.stdout)
    assert [p for p in found["problems"] if p["kind"] == "unmatched_key"] == []
    reported = {m["module"]: m for m in found["modules"] if m.get("method")}
    assert len(reported) == len(modules) and {m["method"] for m in reported.values()} == {method}
