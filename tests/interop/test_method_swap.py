"""Hot swap of non-LoRA adapters (issue 18: "swapping among methods in host buffers and back to none
restores the original bits"), through the Python binding's Registry + HostModel, against PEFT 0.21:

* a host model (a tiny llama or gpt2 whose Linear / Conv1D weights, and biases, are the host's
  buffers, F32 and BF16) swaps LoRA, LoHa, LoKr, AdaLoRA, IA3, MiSS (its standard and bat forms),
  SHiRA, VeRA, RandLoRA, FourierFT, OFT, BOFT and HRA adapters in turn (on gpt2 the ones PEFT
  implements for Conv1D: AdaLoRA, IA3, VeRA, RandLoRA, FourierFT): after each swap
  every host tensor is PEFT's merge_and_unload() of that adapter alone (F32 within 1e-6 of the
  tensor's largest value; BF16 within one bf16 step of PEFT's f32 merge into the bf16 base, rounded
  once, which is the buffer merge's arithmetic), IA3 scaling the
  biases of gpt2's non-feed-forward c_attn as PEFT does; swapping to none gives back the original
  bits of every weight and bias;
* pairs of a multiplicative (IA3, OFT, BOFT, HRA, MiSS bat) and an additive method swapped
  method -> other method -> none, in both orders, each state against PEFT and none giving back the
  original bits (exact mode: the multiplicative methods come out through the kept originals);
* LN tuning and trainable tokens (whole-tensor replacements) are refused by the swap with
  UNSUPPORTED naming the method, the buffers untouched;
* unmerged apply (lora_apply) of a LoHa layer fails with UNSUPPORTED naming LOHA.

The adapters are made at test time: LoRA by serve_support.make_adapters, the others by
tests/fixtures/generator/method_adapters.py (real peft).
"""
from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from serve_support import TORCH_DTYPES, host_layers, load_base, make_adapters, peft_merged_state  # noqa: E402

METHODS = {
    "llama": ["llama_loha", "llama_lokr_decomposed", "llama_ia3", "llama_adalora", "llama_miss", "llama_miss_bat",
              "llama_shira", "llama_vera", "llama_randlora", "llama_fourierft", "llama_oft", "llama_boft",
              "llama_hra"],
    "gpt2": ["gpt2_ia3", "gpt2_adalora", "gpt2_vera", "gpt2_randlora", "gpt2_fourierft"],
}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16 if t.element_size() == 2 else torch.int32)


@pytest.fixture
def swap_adapters(fixtures_dir, tmp_path):
    sys.path.insert(0, str(fixtures_dir))
    from generator.method_adapters import make_method_adapter

    def build(family):
        base = fixtures_dir / "models" / family
        if not (base / "model.safetensors").exists():
            pytest.skip(f"fixture {base} is absent")
        lora = make_adapters(base, family, tmp_path / "lora")
        first = next(iter(lora))
        folders = {f"lora_{first}": lora[first]}
        for case in METHODS[family]:
            folders[case] = make_method_adapter(case, base, tmp_path / case)
        # back to LoRA after the other methods, then to a method again
        folders["lora_again"] = lora[first]
        folders["loha_again" if family == "llama" else "ia3_again"] = folders[METHODS[family][0]]
        return base, folders

    return build


def reference_state(base, dtype, folder):
    """PEFT's merge_and_unload() of the adapter alone. BF16: into the bf16 base held in f32, rounded
    to bf16 once, which is what the buffer merge does (round(float(W) + dW)); PEFT's own bf16 merge
    computes some deltas (AdaLoRA's) in bf16, several steps away."""
    if dtype == "F32":
        return peft_merged_state(base, torch.float32, folder)
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = load_base(base, torch.bfloat16).float()
        merged = PeftModel.from_pretrained(model, str(folder)).merge_and_unload()
    return {k: v.detach().to(torch.bfloat16) for k, v in merged.state_dict().items()}


def compare(tensors, merged, dtype, name):
    worst = 0.0
    for key, tensor in tensors.items():
        theirs = merged[key]
        assert theirs.dtype == tensor.dtype and theirs.shape == tensor.shape, key
        if dtype == "F32":
            rel = float((tensor.double() - theirs.double()).abs().max() / theirs.double().abs().max())
            assert rel <= 1e-6, f"{name} {key}: {rel}"
            worst = max(worst, rel)
        else:
            ours, ref = tensor.float(), theirs.float()
            step = torch.exp2(torch.floor(torch.log2(torch.maximum(ours.abs(), ref.abs()).clamp_min(1e-30))) - 7)
            assert bool(((ours - ref).abs() <= step).all()), f"{name} {key}: more than one bf16 step from PEFT"
    return worst


def host_round(peft_c, base, dtype, folders, family):
    """Swaps to each of `folders` in turn, checking every state against PEFT, then to none, checking
    the original bits. Returns the worst F32 relative error per adapter."""
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
        for name, folder in folders.items():
            registry.register(name, folder, base_dir=base)
        report = {}
        for name, folder in folders.items():
            with registry.acquire(name) as lease:
                swap = host.swap(lease)
            assert host.current == name and swap.layers_merged > 0
            changed = [k for k in tensors if not torch.equal(_bits(tensors[k]), _bits(original[k]))]
            assert changed, name
            if "ia3" in name and family == "gpt2":
                assert any(k.endswith("c_attn.bias") for k in changed)  # IA3 scales c_attn's bias
            report[name] = compare(tensors, reference_state(base, dtype, folder), dtype, name)
        swap = host.swap(None)
        assert host.current is None and swap.layers_merged == 0
        for key, tensor in tensors.items():
            assert torch.equal(_bits(tensor), _bits(original[key])), key
        assert registry.stats().pinned == 0
    return report


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_swap_among_methods_and_back(family, dtype, peft_c, swap_adapters):
    base, folders = swap_adapters(family)
    report = host_round(peft_c, base, dtype, folders, family)
    print(f"{family} {dtype}: {report}")


PAIRS = [("llama_oft", "llama_vera"), ("llama_boft", "llama_shira"), ("llama_hra", "llama_fourierft"),
         ("llama_miss_bat", "llama_randlora"), ("llama_ia3", "llama_miss"), ("gpt2_ia3", "gpt2_vera")]


@pytest.mark.parametrize("dtype", ["F32", "BF16"])
@pytest.mark.parametrize("pair", PAIRS, ids=["-".join(p) for p in PAIRS])
@pytest.mark.parametrize("reverse", [False, True], ids=["mult-first", "add-first"])
def test_swap_pair_and_back(pair, reverse, dtype, peft_c, fixtures_dir, tmp_path):
    sys.path.insert(0, str(fixtures_dir))
    from generator.method_adapters import CASES, make_method_adapter

    family = CASES[pair[0]][0]
    base = fixtures_dir / "models" / family
    if not (base / "model.safetensors").exists():
        pytest.skip(f"fixture {base} is absent")
    order = list(reversed(pair)) if reverse else list(pair)
    folders = {case: make_method_adapter(case, base, tmp_path / case) for case in order}
    host_round(peft_c, base, dtype, folders, family)


@pytest.mark.parametrize("case", ["llama_ln_tuning", "llama_trainable_tokens", "gpt2_trainable_tokens"])
def test_swap_refuses_replacements(case, peft_c, fixtures_dir, tmp_path):
    sys.path.insert(0, str(fixtures_dir))
    from generator.method_adapters import CASES, make_method_adapter

    family = CASES[case][0]
    base = fixtures_dir / "models" / family
    if not (base / "model.safetensors").exists():
        pytest.skip(f"fixture {base} is absent")
    folder = make_method_adapter(case, base, tmp_path / case)
    lora = make_adapters(base, family, tmp_path / "lora")
    first = next(iter(lora))
    model = load_base(base, torch.float32)
    tensors = {}
    with peft_c.HostModel() as host, peft_c.Registry("F32", 1 << 30) as registry:
        for name, module in host_layers(model).items():
            host.add_weight(f"{name}.weight", module.weight.data,
                            bias=module.bias.data if module.bias is not None else None)
            tensors[name] = module.weight.data
        registry.register("lora", lora[first], base_dir=base)
        registry.register(case, folder, base_dir=base)
        with registry.acquire("lora") as lease:
            host.swap(lease)
        merged = {k: v.clone() for k, v in tensors.items()}
        with registry.acquire(case) as lease:
            with pytest.raises(peft_c.PeftError) as err:
                host.swap(lease)
        method = "LN_TUNING" if "ln_tuning" in case else "TRAINABLE_TOKENS"
        assert err.value.code == 22 and method in str(err.value) and "replaces whole tensors" in str(err.value), err.value
        assert "peft_merge_buffer_apply" in str(err.value)
        # the failed swap changed nothing: the LoRA stays merged
        assert host.current == "lora"
        for key, tensor in tensors.items():
            assert torch.equal(tensor, merged[key]), key
        host.swap(None)


def test_unmerged_apply_refuses_other_methods(peft_c, swap_adapters):
    base, folders = swap_adapters("llama")
    with peft_c.Registry("F32", 1 << 30) as registry:
        registry.register("loha", folders["llama_loha"], base_dir=base)
        with registry.acquire("loha") as lease:
            x = np.ones((2, 16), dtype=np.float32)
            y = np.zeros((2, 16), dtype=np.float32)
            with pytest.raises(peft_c.PeftError) as err:
                peft_c.lora_apply("model.layers.0.self_attn.q_proj", lease, None, x, y)
            assert "LOHA" in str(err.value) and err.value.code == 22
            assert not y.any()
