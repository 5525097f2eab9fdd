"""The PEFT side of test_serve_apply.py: tiny adapters made with PEFT, and PEFT's own mixed-batch forward
of the unmerged model, captured layer by layer.

Imported by the test module (pytest puts this folder on sys.path), not a conftest: it needs torch,
transformers and peft, which only these tests load.
"""

from __future__ import annotations

import json
import pathlib
import warnings
from dataclasses import dataclass

import numpy as np
import torch

# The adapters of each family: PEFT LoraConfig arguments. Different ranks and alphas, one with rslora,
# one (gpt2) with lora_bias, and target sets that differ, so that in a mixed batch some rows meet a
# layer their adapter does not have.
ADAPTERS = {
    "llama": {
        "alpha": dict(r=4, lora_alpha=8,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]),
        "beta": dict(r=8, lora_alpha=4, target_modules=["q_proj", "v_proj", "down_proj"]),
        "gamma": dict(r=2, lora_alpha=16, use_rslora=True,
                      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]),
    },
    "gpt2": {
        "alpha": dict(r=4, lora_alpha=8, target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True),
        "beta": dict(r=8, lora_alpha=4, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True, lora_bias=True),
        "gamma": dict(r=2, lora_alpha=16, use_rslora=True, target_modules=["c_proj", "c_fc"], fan_in_fan_out=True),
    },
}

# lora_B as initialised by init_lora_weights=False (nn.Linear's uniform init) gives deltas tens of times
# the base layer's output; this brings them to a size like a trained adapter's (about the base's).
LORA_B_SCALE = 0.1

# The adapter of each sequence of the mixed batch ("__base__": none), and the sequence length.
BATCH = ["alpha", "beta", "__base__", "gamma", "alpha", "gamma"]
SEQUENCE_LENGTH = 8

TORCH_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16}


def model_class(folder: pathlib.Path):
    import transformers

    config = json.loads((folder / "config.json").read_text())
    return getattr(transformers, config["architectures"][0])


def load_base(folder: pathlib.Path, dtype: torch.dtype):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_class(folder).from_pretrained(str(folder), dtype=dtype)
    return model.eval()


def make_adapters(base: pathlib.Path, family: str, out: pathlib.Path) -> dict[str, pathlib.Path]:
    """Saves the family's adapters with PEFT (get_peft_model + save_pretrained) into ``out``.

    The factors are random (init_lora_weights=False, so lora_B is not zero) and rounded to values that
    bfloat16 holds exactly, so that a registry storing BF16, one storing F32 and PEFT with or without
    autocast to f32 all multiply with the same factors: the comparisons then test the arithmetic,
    not the rounding of the factors. "gamma" is saved as BF16 tensors, the others as F32.
    """
    from peft import LoraConfig, get_peft_model

    folders = {}
    for seed, (name, config) in enumerate(ADAPTERS[family].items()):
        torch.manual_seed(100 + seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = get_peft_model(load_base(base, torch.float32),
                                   LoraConfig(init_lora_weights=False, lora_dropout=0.0, **config))
        with torch.no_grad():
            for param_name, param in model.named_parameters():
                if "lora_" in param_name:
                    if "lora_B" in param_name:
                        param.mul_(LORA_B_SCALE)
                    param.copy_(param.to(torch.bfloat16).to(torch.float32))
        if name == "gamma":
            model = model.to(torch.bfloat16)
        folders[name] = out / name
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PEFT takes the 1-D lora_B.bias for an unsharded ZeRO tensor
            model.save_pretrained(str(folders[name]))
    return folders


@dataclass
class LayerCapture:
    """One LoRA layer of PEFT's forward: its input, its base layer's output and its own output, each
    flattened to rows (tokens) x features."""

    module: str  # HuggingFace module path, e.g. "model.layers.0.self_attn.q_proj"
    x: torch.Tensor
    base_out: torch.Tensor
    out: torch.Tensor


def batch_input_ids(vocab_size: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (len(BATCH), SEQUENCE_LENGTH), generator=g)


def peft_unmerged(base: pathlib.Path, dtype: torch.dtype, adapters: dict[str, pathlib.Path], autocast: bool):
    """PeftModel over the base loaded in ``dtype`` with every adapter; ``autocast`` is PEFT's
    autocast_adapter_dtype (True, its default, keeps bf16 adapters in f32)."""
    from peft import PeftModel

    names = list(adapters)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(load_base(base, dtype), str(adapters[names[0]]), adapter_name=names[0],
                                          autocast_adapter_dtype=autocast)
        for name in names[1:]:
            model.load_adapter(str(adapters[name]), adapter_name=name, autocast_adapter_dtype=autocast)
    return model.eval()


@torch.no_grad()
def capture_mixed_batch(model) -> list[LayerCapture]:
    """Runs ONE forward of the mixed batch (``adapter_names=BATCH``) and captures every LoRA layer."""
    from peft.tuners.lora import LoraLayer

    captures: dict[str, dict] = {}
    hooks = []

    def flat(t: torch.Tensor) -> torch.Tensor:
        # The LoRA layer adds into its base layer's output in place: copy what the hook sees.
        return t.detach().reshape(-1, t.shape[-1]).clone()

    for name, module in model.named_modules():
        if not isinstance(module, LoraLayer):
            continue
        entry = captures.setdefault(name.removeprefix("base_model.model."), {})

        def on_base(_module, _args, output, entry=entry):
            entry["base_out"] = flat(output)

        def on_layer(_module, args, output, entry=entry):
            entry["x"] = flat(args[0])
            entry["out"] = flat(output)

        hooks.append(module.base_layer.register_forward_hook(on_base))
        hooks.append(module.register_forward_hook(on_layer))
    try:
        ids = batch_input_ids(model.config.vocab_size)
        model(input_ids=ids, attention_mask=torch.ones_like(ids), adapter_names=list(BATCH))
    finally:
        for hook in hooks:
            hook.remove()
    assert captures, "the model has no LoRA layers"
    return [LayerCapture(module, **entry) for module, entry in sorted(captures.items())]


def row_leases(adapter_names: list[str]) -> np.ndarray:
    """Each token's index into ``adapter_names`` (-1 for "__base__"), in the batch's row order."""
    per_sequence = [adapter_names.index(name) if name != "__base__" else -1 for name in BATCH]
    return np.repeat(np.array(per_sequence, dtype=np.int32), SEQUENCE_LENGTH)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous numpy copy in the same dtype (bfloat16 as ml_dtypes.bfloat16)."""
    import ml_dtypes

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


def bf16_ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Element-wise distance in bf16 steps between two bfloat16 arrays (+0 and -0 coincide)."""
    def ordered(x):
        bits = x.view(np.uint16).astype(np.int32)
        return np.where(bits & 0x8000, 0x8000 - bits, bits)
    return np.abs(ordered(a) - ordered(b))


def bf16_ulp_of(values: np.ndarray) -> np.ndarray:
    """The bf16 unit in the last place at each |value| (the gap above it); the smallest normal's for 0."""
    magnitude = np.maximum(np.abs(values.astype(np.float64)), np.finfo(np.float32).tiny)
    return np.exp2(np.floor(np.log2(magnitude)) - 7)


@dataclass
class Reference:
    """The exact (float64) result of the LoRA formula on PEFT's own factors, for one layer."""

    base: np.ndarray  # the base layer's output
    out: np.ndarray  # base + delta
    delta: np.ndarray  # scaling * (x A^T) B^T (+ scaling * lora_B.bias), zero for rows without an adapter here
    terms: np.ndarray  # scaling * |x A^T| |B^T|: the size of what the rank sum adds up (cancellation shows here)
    adapted: np.ndarray  # bool per row: the row's adapter has this layer
    # The bound on the error of any f32 evaluation of base + delta: gamma(n) = n u / (1 - n u)
    # (u = 2^-24) times the sum of the magnitudes of all terms, with n = in + rank + 6 roundings
    # deep (tests/unit/test_serve_apply.cpp derives the count); holds for every summation order and
    # BLAS kernel.
    f32_bound: np.ndarray


def reference(model, capture: LayerCapture, adapter_names: list[str], rows: np.ndarray) -> Reference:
    from peft.tuners.lora import LoraLayer

    layer = model.get_submodule("base_model.model." + capture.module)
    assert isinstance(layer, LoraLayer)
    x = capture.x.double().numpy()
    base = capture.base_out.double().numpy()
    delta, terms = np.zeros_like(base), np.zeros_like(base)
    f32_bound = np.zeros_like(base)
    adapted = np.zeros(len(rows), dtype=bool)
    for index, name in enumerate(adapter_names):
        if name not in layer.lora_A:
            continue
        a = layer.lora_A[name].weight.detach().double().numpy()
        b = layer.lora_B[name].weight.detach().double().numpy()
        scaling = layer.scaling[name]
        selected = rows == index
        hidden = x[selected] @ a.T
        delta[selected] = scaling * hidden @ b.T
        if layer.lora_B[name].bias is not None:
            delta[selected] += scaling * layer.lora_B[name].bias.detach().double().numpy()
        terms[selected] = abs(scaling) * np.abs(hidden) @ np.abs(b.T)
        magnitude = np.abs(base[selected]) + abs(scaling) * (np.abs(x[selected]) @ np.abs(a.T)) @ np.abs(b.T)
        if layer.lora_B[name].bias is not None:
            magnitude += abs(scaling) * np.abs(layer.lora_B[name].bias.detach().double().numpy())
        n = a.shape[1] + a.shape[0] + 6
        u = 2.0 ** -24
        f32_bound[selected] = n * u / (1 - n * u) * magnitude
        adapted |= selected
    return Reference(base, base + delta, delta, terms, adapted, f32_bound)


def peft_merged_state(base: pathlib.Path, dtype: torch.dtype, folder: pathlib.Path) -> dict[str, torch.Tensor]:
    """PEFT's merge_and_unload() of one adapter into the base loaded in ``dtype`` (PEFT's defaults:
    adapter autocast to f32, the delta added to the weight with one rounding)."""
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = PeftModel.from_pretrained(load_base(base, dtype), str(folder)).merge_and_unload()
    return {name: tensor.detach().clone() for name, tensor in merged.state_dict().items()}


def host_layers(model) -> dict[str, torch.nn.Module]:
    """The Linear and GPT-2 Conv1D layers a host would give a HostModel (lm_head excluded: gpt2 ties it
    to the input embedding)."""
    from transformers.pytorch_utils import Conv1D

    return {name: module for name, module in model.named_modules()
            if isinstance(module, (torch.nn.Linear, Conv1D)) and name != "lm_head"}
