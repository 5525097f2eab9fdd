"""LoHa and LoKr on nn.Conv2d layers, including the CP ("use_effective_conv2d") form, merged
against PEFT 0.21's own merge_and_unload(), on a tiny random ResNet (transformers ResNetConfig,
bottleneck layers: 1x1 and 3x3 convolutions, a 7x7 stem and 1x1 shortcuts).

The base and the adapters are made at test time with transformers and the real peft package
(seeded random parameters: PEFT initialises one factor to zero, which would make every merge a
no-op). Cases:

* LoHa plain (hada_w1_b [r, c * kh * kw]) and CP (hada_t1/hada_t2 [r, r, kh, kw] on the 3x3 and 7x7
  kernels; PEFT keeps the plain form on the 1x1 ones);
* LoKr with decomposed factors (decompose_both, r = 1: lokr_w1_a/b, lokr_w2_a/b), the same in the
  CP form (lokr_t2), and full factors (lokr_w1 [a, c], lokr_w2 [b, d, kh, kw]).

For each, `peftc merge` equals PEFT's merged model within 1e-6 relative to each tensor's largest
value (f32) and the logits within 1e-5; with `--dtype bf16` each tensor is our f32 merge rounded
once and at most 1 ulp from PEFT's f32 merge rounded; host-buffer merges through the Python binding
(peft_merge_buffer_apply) give the same weights and come out to the original bytes; and converting
a Conv2d module to LoRA is refused as PEFT refuses it.

Environment: PEFTC (the peftc binary), PEFT_C_LIB (the Python binding's library).
"""

from __future__ import annotations

import subprocess
import warnings

import pytest
import torch

from merge_support import check_bf16_buffer_merge, compare_weights, file_tensors, run_merge, saved_tensors

TARGETS = ["convolution"]  # every ResNetConvLayer's nn.Conv2d (stem, 1x1, 3x3, shortcuts)

# case -> (peft config name, arguments)
CASES = {
    "loha": ("LoHaConfig", {"r": 2, "alpha": 3, "target_modules": TARGETS}),
    "loha_cp": ("LoHaConfig", {"r": 2, "alpha": 5, "target_modules": TARGETS, "use_effective_conv2d": True}),
    "lokr_decomposed": ("LoKrConfig", {"r": 1, "alpha": 2, "target_modules": TARGETS, "decompose_both": True}),
    "lokr_cp": ("LoKrConfig", {"r": 1, "alpha": 3, "target_modules": TARGETS, "decompose_both": True,
                               "use_effective_conv2d": True}),
    "lokr_full": ("LoKrConfig", {"r": 64, "alpha": 16, "target_modules": TARGETS}),
}


def make_resnet(folder):
    import transformers

    config = transformers.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[16, 24], depths=[1, 1],
                                       layer_type="bottleneck", num_labels=3)
    torch.manual_seed(0)
    model = transformers.ResNetForImageClassification(config).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
        for name, b in model.named_buffers():
            if name.endswith("running_var"):
                b.copy_(1.0 + 0.1 * torch.rand(b.shape, generator=g))
            elif name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g))
    model.save_pretrained(str(folder))
    return folder


def make_adapter(case, base, folder, seed=0):
    import peft
    import transformers

    config_name, kwargs = CASES[case]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.ResNetForImageClassification.from_pretrained(str(base), dtype=torch.float32)
        peft_model = peft.get_peft_model(model, getattr(peft, config_name)(**kwargs))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if p.requires_grad and ("hada_" in name or "lokr_" in name):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    peft_model.save_pretrained(str(folder))
    return folder


def load_resnet(folder, dtype=torch.float32):
    import transformers

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.ResNetForImageClassification.from_pretrained(str(folder), dtype=dtype).eval()


def peft_merged(base, adapter):
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return PeftModel.from_pretrained(load_resnet(base), str(adapter)).merge_and_unload().eval()


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    return make_resnet(tmp_path_factory.mktemp("resnet"))


@pytest.fixture
def conv_adapter(resnet, tmp_path):
    def build(case):
        return make_adapter(case, resnet, tmp_path / case)

    return build


def adapter_params(adapter):
    from safetensors.torch import load_file

    return load_file(str(adapter / "adapter_model.safetensors"))


def test_the_cases_hold_the_forms_they_name(conv_adapter):
    """The adapters hold what each case is about (so that the merges below test those forms)."""
    shapes = {case: {k: tuple(v.shape) for k, v in adapter_params(conv_adapter(case)).items()} for case in CASES}
    assert not any("hada_t1" in k for k in shapes["loha"]) and any(len(s) == 2 and s[1] % 9 == 0 and "hada_w1_b" in k
                                                                  for k, s in shapes["loha"].items())
    cp = [k for k in shapes["loha_cp"] if k.endswith("hada_t1")]
    assert cp and all(shapes["loha_cp"][k][2:] in ((3, 3), (7, 7)) for k in cp)
    assert any(k.endswith("hada_w1_a") and k.replace("hada_w1_a", "hada_t1") not in shapes["loha_cp"]
               for k in shapes["loha_cp"])  # the 1x1 kernels stay plain
    assert any(k.endswith("lokr_w1_a") for k in shapes["lokr_decomposed"])
    assert not any(k.endswith("lokr_t2") for k in shapes["lokr_decomposed"])
    assert any(k.endswith("lokr_t2") for k in shapes["lokr_cp"])
    full = shapes["lokr_full"]
    assert any(k.endswith("lokr_w2") and len(s) == 4 and s[2:] == (3, 3) for k, s in full.items())
    assert not any(k.endswith("_a") or k.endswith("_b") for k in full)


@pytest.mark.parametrize("case", list(CASES))
def test_file_merge_matches_peft(case, resnet, conv_adapter, peftc_binary, tmp_path):
    adapter = conv_adapter(case)
    run_merge(peftc_binary, resnet, [(adapter, 1.0)], tmp_path / "ours")
    ref = peft_merged(resnet, adapter)
    ours = file_tensors(tmp_path / "ours")
    stats = compare_weights(ours, saved_tensors(ref, tmp_path / "ref"))
    assert stats["f32_rel"] <= 1e-6, stats
    base = file_tensors(resnet)
    changed = {n for n in ours if not torch.equal(ours[n], base[n])}
    convs = {n for n in base if n.endswith("convolution.weight")}
    assert changed == convs, sorted(changed ^ convs)
    pixels = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = load_resnet(tmp_path / "ours")(pixels).logits, ref(pixels).logits
    assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())


@pytest.mark.parametrize("case", ["loha_cp", "lokr_cp", "lokr_full"])
def test_bf16_merge_rounds_once(case, resnet, conv_adapter, peftc_binary, tmp_path):
    adapter = conv_adapter(case)
    run_merge(peftc_binary, resnet, [(adapter, 1.0)], tmp_path / "bf16", "--dtype", "bf16")
    run_merge(peftc_binary, resnet, [(adapter, 1.0)], tmp_path / "f32")
    ours, wide = file_tensors(tmp_path / "bf16"), file_tensors(tmp_path / "f32")
    ref = saved_tensors(peft_merged(resnet, adapter).to(torch.bfloat16), tmp_path / "ref")
    stats = compare_weights(ours, ref)
    assert stats["max_ulp"] <= 1, stats
    for name, tensor in ours.items():
        if tensor.dtype == torch.bfloat16:
            assert torch.equal(wide[name].to(torch.bfloat16).view(torch.int16), tensor.view(torch.int16)), name


@pytest.mark.parametrize("case", ["loha", "lokr_full"])
def test_weighted_merge_matches_peft(case, resnet, conv_adapter, peftc_binary, tmp_path):
    from peft import PeftModel

    adapter = conv_adapter(case)
    run_merge(peftc_binary, resnet, [(adapter, 0.5)], tmp_path / "ours")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(load_resnet(resnet), str(adapter))
        for module in model.modules():
            if isinstance(getattr(module, "scaling", None), dict) and "default" in module.scaling:
                module.scaling["default"] = 0.5 * module.scaling["default"]
        ref = model.merge_and_unload().eval()
    stats = compare_weights(file_tensors(tmp_path / "ours"), saved_tensors(ref, tmp_path / "ref"))
    assert stats["f32_rel"] <= 1e-6, stats


@pytest.mark.parametrize("case", list(CASES))
def test_host_buffer_merge_matches_peft_and_comes_out_exactly(case, resnet, conv_adapter, peft_c, tmp_path):
    """peft_merge_buffer_apply on each 4-D Conv2d weight: PEFT's merged weight (f32, 1e-6
    relative), a bf16 buffer the f32 merge of its values rounded once, removal with
    keep_original_rows restoring the original bytes."""
    adapter_dir = conv_adapter(case)
    ref = saved_tensors(peft_merged(resnet, adapter_dir), tmp_path / "ref")
    tensors = file_tensors(resnet)
    with peft_c.Adapter.open(str(adapter_dir)) as adapter:
        names = [m.name for m in adapter.modules]
        assert len(names) == len([n for n in tensors if n.endswith("convolution.weight")])
        for module in names:
            key = module + ".weight"
            weight = tensors[key].clone()
            assert weight.dim() == 4
            original = weight.clone()
            record = peft_c.merge_into(adapter, module, weight, keep_original_rows=True)
            want = ref[key].double()
            assert float((weight.double() - want).abs().max()) <= 1e-6 * float(want.abs().max()), key
            record.remove(weight)
            assert torch.equal(weight.view(torch.int32), original.view(torch.int32)), key

            check_bf16_buffer_merge(peft_c, adapter, module, original, key)


def test_host_buffer_of_the_wrong_shape_is_refused(resnet, conv_adapter, peft_c):
    """A CP module merged into a buffer of another kernel size fails (and leaves it untouched)."""
    adapter_dir = conv_adapter("loha_cp")
    params = adapter_params(adapter_dir)
    module = next(k for k in params if k.endswith("hada_t1"))[: -len(".hada_t1")].removeprefix("base_model.model.")
    weight = file_tensors(resnet)[module + ".weight"]
    out, c, kh, kw = weight.shape
    wrong = torch.zeros(out, c * kh, 1, kw)  # as many values, another kernel
    with peft_c.Adapter.open(str(adapter_dir)) as adapter:
        with pytest.raises(peft_c.PeftError) as info:
            peft_c.merge_into(adapter, module, wrong)
    assert "hada_t1" in str(info.value) or "hada_t2" in str(info.value)
    assert not wrong.any()


@pytest.mark.parametrize("case", ["loha_cp", "lokr_full"])
def test_conversion_to_lora_is_refused_for_conv2d(case, resnet, conv_adapter, peftc_binary, tmp_path):
    """PEFT's LoHa/LoKr Conv2d layers have no LoRA conversion, and the library's conversion
    handles Linear and Conv1D only: refused, naming the Conv2d module."""
    adapter = conv_adapter(case)
    proc = subprocess.run([str(peftc_binary), "adapter", "convert", str(adapter), str(tmp_path / "lora"), "--to",
                           "lora", "--rank", "2"], capture_output=True, text=True)
    assert proc.returncode != 0, proc.stdout
    assert "Conv2d" in proc.stderr or "conv2d" in proc.stderr, proc.stderr
