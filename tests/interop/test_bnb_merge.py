"""`peftc merge` into bases saved by transformers with bitsandbytes (NF4 and FP4, with and without
double quantization, and LLM.int8()), against the bitsandbytes package on CPU:

* keep the format (no --dtype): every targeted weight and its state tensors equal, byte for byte,
  bitsandbytes quantizing [its own dequantization of the base weight + PEFT's get_delta_weight()] with
  the base's quant type, block size and double quantization; every other tensor and config.json are
  copied unchanged;
* --dtype bf16: every quantized weight is bitsandbytes' dequantization (+ the delta where targeted)
  rounded to bf16, the state tensors are gone, quantization_config is removed from config.json, and
  transformers loads the folder as a plain model.

Environment: PEFTC (the peftc binary).
"""
from __future__ import annotations

import json
import os
import pathlib

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")
F = bnb.functional

from merge_support import run_merge  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
PEFTC = pathlib.Path(os.environ.get("PEFTC") or REPO / "build" / "peftc")
TARGETS = ["q_proj", "v_proj", "down_proj"]
VARIANTS = {
    "nf4": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4"),
    "nf4-double": dict(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True),
    "fp4": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4"),
    "fp4-double": dict(load_in_4bit=True, bnb_4bit_quant_type="fp4", bnb_4bit_use_double_quant=True),
    "int8": dict(load_in_8bit=True),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny llama (odd sizes: 4-bit blocks straddle rows), its bnb-quantized copies and a LoRA adapter."""
    import transformers
    from peft import LoraConfig, get_peft_model
    from safetensors.torch import load_file

    root = tmp_path_factory.mktemp("bnb_merge")
    cfg = transformers.LlamaConfig(vocab_size=96, hidden_size=72, intermediate_size=120, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, head_dim=36)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(root / "plain")
    bases = {}
    for name, options in VARIANTS.items():
        quantized = transformers.LlamaForCausalLM.from_pretrained(
            root / "plain", quantization_config=transformers.BitsAndBytesConfig(**options), device_map="cpu")
        quantized.save_pretrained(root / name)
        bases[name] = root / name
    torch.manual_seed(1)
    peft_model = get_peft_model(transformers.LlamaForCausalLM(cfg),
                                LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False))
    peft_model.save_pretrained(root / "adapter")
    deltas = {}
    for module_name, module in peft_model.named_modules():
        if hasattr(module, "get_delta_weight") and module_name.split(".")[-1] in TARGETS:
            key = module_name.removeprefix("base_model.model.") + ".weight"
            deltas[key] = module.get_delta_weight("default").detach().float()
    return {"root": root, "bases": bases, "adapter": root / "adapter", "deltas": deltas, "load": load_file}


def quant_state(tensors: dict, weight: str):
    parts = {k[len(weight) + 1:]: v for k, v in tensors.items() if k.startswith(weight + ".")}
    return F.QuantState.from_dict(parts, device=torch.device("cpu"))


def dequantize(tensors: dict, weight: str) -> torch.Tensor:
    if tensors[weight].dtype == torch.int8:
        scb = tensors[weight.removesuffix(".weight") + ".SCB"]
        return F.int8_vectorwise_dequant(tensors[weight], scb)
    return F.dequantize_4bit(tensors[weight], quant_state(tensors, weight))


def quantized_weights(tensors: dict) -> list[str]:
    return [k for k, v in tensors.items() if k.endswith(".weight") and v.dtype in (torch.uint8, torch.int8)]


# Known differences, kept as strict xfails so that a fix shows (none at present).
KEEP_XFAIL: dict = {}
BF16_XFAIL: dict = {}


def _params(names, known):
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=known[n])) if n in known else n
            for n in names]


@pytest.mark.parametrize("variant", _params(list(VARIANTS), KEEP_XFAIL))
def test_keep_format_equals_bitsandbytes_requantizing(models, variant, tmp_path):
    base = models["bases"][variant]
    run_merge(PEFTC, base, [(models["adapter"], 1.0)], tmp_path / "out")
    before = models["load"](str(base / "model.safetensors"))
    after = models["load"](str(tmp_path / "out" / "model.safetensors"))
    assert sorted(after) == sorted(before)
    merged = set()
    for weight, delta in models["deltas"].items():
        expected = dequantize(before, weight) + delta
        if variant == "int8":
            q, scb, _ = F.int8_vectorwise_quant(expected)
            want = {weight: q, weight.removesuffix(".weight") + ".SCB": scb}
        else:
            state = quant_state(before, weight)
            packed, new_state = F.quantize_4bit(expected, blocksize=state.blocksize, quant_type=state.quant_type,
                                                compress_statistics=state.nested)
            want = {weight: packed, **{weight + "." + k: v for k, v in new_state.as_dict(packed=True).items()}}
        for name, tensor in want.items():
            assert after[name].numpy().tobytes() == tensor.numpy().tobytes(), name
            merged.add(name)
    assert merged
    for name in set(before) - merged:  # everything else byte for byte
        assert after[name].numpy().tobytes() == before[name].numpy().tobytes(), name
    assert (tmp_path / "out" / "config.json").read_bytes() == (base / "config.json").read_bytes()


@pytest.mark.parametrize("variant", _params(["nf4-double", "fp4", "int8"], BF16_XFAIL))
def test_dtype_bf16_writes_a_plain_model(models, variant, tmp_path):
    import transformers

    base = models["bases"][variant]
    out = tmp_path / "out"
    run_merge(PEFTC, base, [(models["adapter"], 1.0)], out, "--dtype", "bf16")
    before = models["load"](str(base / "model.safetensors"))
    after = models["load"](str(out / "model.safetensors"))
    plain = models["load"](str(models["root"] / "plain" / "model.safetensors"))
    assert sorted(after) == sorted(plain)  # the state tensors are gone
    for name, tensor in after.items():
        assert tensor.dtype == torch.bfloat16, name
        if name in quantized_weights(before):
            expected = dequantize(before, name)  # an untargeted weight keeps its -0.0s (no "+ 0.0")
            if name in models["deltas"]:
                expected = expected + models["deltas"][name]
        else:
            expected = before[name].float()
        assert tensor.view(torch.int16).equal(expected.to(torch.bfloat16).view(torch.int16)), name
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config and config["dtype"] == "bfloat16"
    model = transformers.AutoModelForCausalLM.from_pretrained(out)
    assert not hasattr(model.config, "quantization_config")
    assert model.model.layers[0].self_attn.q_proj.weight.dtype == torch.bfloat16
    assert model.model.layers[0].self_attn.q_proj.weight.view(torch.int16).equal(
        after["model.layers.0.self_attn.q_proj.weight"].view(torch.int16))


def test_other_quantization_methods_are_unsupported(models, tmp_path):
    import shutil
    import subprocess

    base = tmp_path / "awq"
    shutil.copytree(models["root"] / "plain", base)
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    (base / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([str(PEFTC), "merge", "--base", str(base), "--out", str(tmp_path / "out"),
                           "--adapter", str(models["adapter"])], capture_output=True, text=True)
    assert proc.returncode != 0 and "awq" in proc.stderr


def hostile_copy(models, variant: str, folder: pathlib.Path, change) -> pathlib.Path:
    """A copy of a quantized base whose tensors `change(tensors)` edits in place."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(models["bases"][variant], folder)
    tensors = models["load"](str(folder / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def edit_quant_state(tensors: dict, edit) -> None:
    """Applies `edit(dict)` to every 4-bit quant_state JSON of `tensors`."""
    for name in [k for k in tensors if ".quant_state.bitsandbytes__" in k]:
        state = json.loads(bytes(tensors[name].numpy().tobytes()))
        text = edit(state).encode() if callable(edit) else None
        tensors[name] = torch.frombuffer(bytearray(text), dtype=torch.uint8)


def merge_status(models, base: pathlib.Path, out: pathlib.Path, *extra: str):
    import subprocess

    proc = subprocess.run([str(PEFTC), "merge", "--base", str(base), "--out", str(out),
                           "--adapter", str(models["adapter"]), *extra], capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("field,variant", [("blocksize", "nf4"), ("nested_blocksize", "nf4-double")])
def test_a_blocksize_near_2_pow_64_is_refused(models, tmp_path, field, variant):
    """A blocksize of 2^64 - 1 used to wrap the block count to 0: an empty absmax passed and was read."""
    def edit(state):
        state[field] = 2**64 - 1
        return json.dumps(state)

    def change(tensors):
        edit_quant_state(tensors, edit)
        emptied = ".absmax" if field == "blocksize" else ".nested_absmax"
        for name in [k for k in tensors if k.endswith(emptied)]:
            tensors[name] = tensors[name][:0].clone()

    base = hostile_copy(models, variant, tmp_path / "base", change)
    code, err = merge_status(models, base, tmp_path / "out")
    assert code == 1 and "INVALID_CHECKPOINT" in err, err
    assert not (tmp_path / "out").exists()


def test_a_quant_state_nested_100000_deep_is_refused(models, tmp_path):
    """Written back by the merge, such a JSON overflowed the stack; it is refused when read."""
    def edit(state):
        return json.dumps(state)[:-1] + ', "deep": ' + "[" * 100000 + "]" * 100000 + "}"

    base = hostile_copy(models, "nf4", tmp_path / "base", lambda t: edit_quant_state(t, edit))
    code, err = merge_status(models, base, tmp_path / "out")
    assert code == 1 and "INVALID_CHECKPOINT" in err and "deep" in err, err


@pytest.mark.parametrize("variant", ["nf4", "int8"])
def test_a_nan_scale_is_refused_non_finite(models, tmp_path, variant):
    """A NaN absmax (NF4) or SCB (int8) makes the merged values NaN: refused as for every output format."""
    def change(tensors):
        name = next(k for k in tensors if k.endswith(".absmax" if variant == "nf4" else ".SCB")
                    and "q_proj" in k)
        tensors[name][0] = float("nan")

    base = hostile_copy(models, variant, tmp_path / "base", change)
    code, err = merge_status(models, base, tmp_path / "out")
    assert code == 1 and "NON_FINITE" in err, err
    assert not (tmp_path / "out").exists()
    code, err = merge_status(models, base, tmp_path / "kept", "--allow-nonfinite")
    assert code == 0, err
