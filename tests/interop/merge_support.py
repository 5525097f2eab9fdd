"""Helpers of the merge and combination tests: running `peftc merge`, building PEFT's merged model,
comparing weights and logits, and peft_c's DARE masks (`dare_keep`).

Imported by the test module (pytest puts this folder on sys.path), not a conftest: the helpers need
torch, transformers and peft, which only these tests load.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import warnings

import numpy as np
import torch

TORCH_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}


def run_merge(peftc: pathlib.Path, base: pathlib.Path, adapters, out: pathlib.Path, *extra: str) -> str:
    """Runs `peftc merge`; adapters are (folder, weight) pairs. Returns stdout; fails the test on error."""
    args = [str(peftc), "merge", "--base", str(base), "--out", str(out), *extra]
    for folder, weight in adapters:
        args += ["--adapter", f"{folder}:{weight!r}"]
    proc = subprocess.run(args, capture_output=True, text=True)
    assert proc.returncode == 0, f"peftc merge failed ({proc.returncode}): {proc.stderr}"
    return proc.stdout


def model_class(folder: pathlib.Path):
    import transformers

    config = json.loads((folder / "config.json").read_text())
    return getattr(transformers, config["architectures"][0])


def load_model(folder: pathlib.Path, dtype=None):
    """A transformers model from a folder, in its stored dtype unless `dtype` is given."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_class(folder).from_pretrained(str(folder), dtype=dtype or "auto")
    return model.eval()


def peft_merged(base: pathlib.Path, adapters, dtype=None):
    """PEFT's merge_and_unload() of the adapters into the base.

    One adapter with weight 1: PeftModel.from_pretrained + merge_and_unload, PEFT's ordinary path.
    Several, or another weight: every adapter loaded, combined with add_weighted_adapter(...,
    combination_type="cat"), which concatenates the factors (A_i scaled by weight_i * scaling_i), so
    the combined delta is exactly sum_i weight_i * scaling_i * B_i A_i up to f32 rounding; then
    merged once. (Sequential merges would round to the storage dtype after every adapter.)
    """
    from peft import PeftModel

    model = load_model(base, dtype)
    names = [f"a{i}" for i in range(len(adapters))]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = PeftModel.from_pretrained(model, str(adapters[0][0]), adapter_name=names[0])
        for name, (folder, _) in zip(names[1:], adapters[1:]):
            peft_model.load_adapter(str(folder), adapter_name=name)
        if len(adapters) > 1 or adapters[0][1] != 1.0:
            peft_model.add_weighted_adapter(names, [w for _, w in adapters], "combined", combination_type="cat")
            peft_model.set_adapter("combined")
        return peft_model.merge_and_unload().eval()


def saved_tensors(model, folder: pathlib.Path) -> dict[str, torch.Tensor]:
    """The tensors transformers writes for a model (its on-disk names), via save_pretrained."""
    model.save_pretrained(str(folder))
    return file_tensors(folder)


def file_tensors(folder: pathlib.Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors = {}
    for path in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def _ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in representable steps between same-dtype 16-bit floats (sign-magnitude order)."""
    ia = a.contiguous().view(torch.int16).to(torch.int32)
    ib = b.contiguous().view(torch.int16).to(torch.int32)
    ia = torch.where(ia < 0, -(ia & 0x7FFF), ia)
    ib = torch.where(ib < 0, -(ib & 0x7FFF), ib)
    return (ia - ib).abs()


def compare_weights(ours: dict, ref: dict) -> dict:
    """Per-dtype agreement of two tensor dicts with the same names. Returns statistics:
    f32: largest |ours - ref| / max|ref| over all tensors; f16/bf16: largest ulp distance and the
    fraction of identical elements."""
    assert sorted(ours) == sorted(ref), (
        f"tensor names differ: only ours {sorted(set(ours) - set(ref))}, only PEFT's {sorted(set(ref) - set(ours))}")
    stats = {"f32_rel": 0.0, "max_ulp": 0, "identical": 0, "half_elements": 0, "tensors": len(ours)}
    for name in sorted(ours):
        a, b = ours[name], ref[name]
        assert a.dtype == b.dtype, f"{name}: {a.dtype} vs {b.dtype}"
        assert a.shape == b.shape, f"{name}: {tuple(a.shape)} vs {tuple(b.shape)}"
        if a.dtype in (torch.bfloat16, torch.float16):
            stats["max_ulp"] = max(stats["max_ulp"], int(_ulp_distance(a, b).max()) if a.numel() else 0)
            stats["identical"] += int((a.view(torch.int16) == b.view(torch.int16)).sum())
            stats["half_elements"] += a.numel()
        elif a.is_floating_point():
            scale = float(b.abs().max()) if b.numel() else 0.0
            diff = float((a.double() - b.double()).abs().max()) if b.numel() else 0.0
            stats["f32_rel"] = max(stats["f32_rel"], diff / scale if scale else diff)
        else:
            assert torch.equal(a, b), name
    return stats


def model_inputs(model, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.get_text_config().vocab_size if hasattr(model.config, "get_text_config") else model.config.vocab_size
    ids = torch.randint(0, vocab, (2, 7), generator=g)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = torch.randint(0, vocab, (2, 5), generator=g)
    return inputs


@torch.no_grad()
def logits(model, inputs) -> torch.Tensor:
    return model(**inputs).logits.float()


def relative_logit_error(ours, ref, seed: int = 0) -> float:
    inputs = model_inputs(ref, seed)
    a, b = logits(ours, inputs), logits(ref, inputs)
    return float((a - b).abs().max()) / float(b.abs().max())


def as_numpy(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy()


def check_bf16_buffer_merge(peft_c, adapter, module: str, original: torch.Tensor, key: str) -> None:
    """A host-buffer merge of `module` into the BF16 copy of `original` is our f32 merge rounded once, and
    removing it gives back the BF16 bits."""
    half = original.to(torch.bfloat16)
    half_original = half.clone()
    wide = half.float()
    peft_c.merge_into(adapter, module, wide)
    record = peft_c.merge_into(adapter, module, half, keep_original_rows=True)
    assert torch.equal(half.view(torch.int16), wide.to(torch.bfloat16).view(torch.int16)), key
    record.remove(half)
    assert torch.equal(half.view(torch.int16), half_original.view(torch.int16)), key


def _mix(x: int) -> int:
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def dare_keep(seed: int, stream: str, index: int, factor: int, n: int, density: float) -> list[bool]:
    """peft_c's DARE mask as include/peft_c.h (peft_export_options_set_combine_seed) specifies it: value e
    of factor `factor` (0 lora_A, 1 lora_B, 2 a delta) of the `index`-th input in stream `stream` (a module
    or tensor name) is kept iff u < density."""
    h = 0xcbf29ce484222325
    for byte in stream.encode():
        h = ((h ^ byte) * 0x100000001b3) & ((1 << 64) - 1)
    s = _mix(_mix(seed ^ h) ^ (2 * index + factor))
    return [((_mix(s ^ e) >> 11) * 2.0 ** -53) < density for e in range(n)]
