"""Lenient loading (`peftc merge --lenient`) against PEFT 0.21 on adapters PEFT loads with warnings.

Each case takes a committed fixture adapter (tests/fixtures/adapters) and changes it in a temporary
folder the way adapters in the wild differ from their config: a target module without tensors,
keys that are not adapter keys, tensors of modules target_modules does not select or the base does
not have, DoRA magnitudes without use_dora, lora_B or lora_B.bias missing. Then:

* PEFT loads it (PeftModel.from_pretrained on the tiny base) and merges it (merge_and_unload);
  `peftc merge --lenient` merges it too: the weights agree as in test_checkpoint_merge (f32 within
  1e-6 of each tensor's largest value);
* the keys PEFT ignores (load_adapter's load result: missing keys, which PEFT also warns about,
  and unexpected keys, which it drops silently) are the keys of peftc's warnings, as sets; PEFT's
  names are mapped to the file's (the adapter name removed, and the ".weight" PEFT appends to
  lora_magnitude_vector when loading removed);
* strict `peftc merge` refuses the adapter with the stated error code (or accepts it, where strict
  loading has nothing to refuse).

And cases PEFT loads with random weights or rejects stay errors in lenient mode, with their codes.

Environment: PEFTC (the peftc binary), PEFT_TEST_DATA.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil
import subprocess
import warnings
from dataclasses import dataclass

import pytest
import torch
from safetensors.torch import load_file, save_file

from merge_support import compare_weights, file_tensors, peft_merged, saved_tensors

P = "base_model.model.model.layers"


def edit_adapter(src: pathlib.Path, dst: pathlib.Path, config=None, drop=(), add=None) -> pathlib.Path:
    """A copy of the adapter `src` in `dst`: config fields replaced, keys dropped, tensors added."""
    dst.mkdir(parents=True)
    cfg = json.loads((src / "adapter_config.json").read_text())
    cfg.update(config or {})
    (dst / "adapter_config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    tensors = load_file(str(src / "adapter_model.safetensors"))
    for key in drop:
        del tensors[key]
    g = torch.Generator().manual_seed(7)
    for key, shape in (add or {}).items():
        tensors[key] = torch.randn(shape, generator=g)
    save_file(tensors, str(dst / "adapter_model.safetensors"), metadata={"format": "pt"})
    return dst


@dataclass
class Case:
    id: str
    base: str
    adapter: str
    strict_code: str | None  # what strict loading says; None when it loads the adapter
    config: dict | None = None
    drop: tuple = ()
    add: dict | None = None
    lenient_code: str | None = None  # ERROR_CASES: what lenient loading says (default: strict_code)


CASES = [
    # target_modules names q_proj, but the file has no tensors for layer 1's q_proj.
    Case("target_without_tensors", "llama", "llama_lora", None,
         drop=(f"{P}.1.self_attn.q_proj.lora_A.weight", f"{P}.1.self_attn.q_proj.lora_B.weight")),
    # The same through the config: q_proj added to a list whose file has none.
    Case("extra_target_module", "llama", "llama_dora", None, config={"target_modules": ["q_proj", "v_proj", "down_proj", "o_proj"]}),
    Case("keys_that_are_not_adapter_keys", "llama", "llama_lora", "UNRESOLVED_KEY",
         add={f"{P}.0.self_attn.q_proj.lora_X.weight": [4, 16], f"{P}.0.self_attn.q_proj.lora_A.other.weight": [4, 16]}),
    Case("untargeted_module", "llama", "llama_lora", "INVALID_CONFIG",
         config={"target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj"]}),
    Case("layers_to_transform", "llama", "llama_lora", "INVALID_CONFIG", config={"layers_to_transform": [0]}),
    Case("module_the_base_lacks", "llama", "llama_lora", "UNRESOLVED_KEY",
         add={f"{P}.7.self_attn.q_proj.lora_A.weight": [4, 16], f"{P}.7.self_attn.q_proj.lora_B.weight": [16, 4]}),
    Case("full_tensor_the_base_lacks", "llama", "llama_lora", "UNRESOLVED_KEY",
         add={"base_model.model.model.extra_head.weight": [3, 16]}),
    Case("magnitude_without_use_dora", "llama", "llama_dora", "INVALID_CONFIG", config={"use_dora": False}),
    Case("lora_B_missing", "llama", "llama_lora", "INVALID_CHECKPOINT", drop=(f"{P}.0.mlp.up_proj.lora_B.weight",)),
    Case("lora_B_missing_dora", "llama", "llama_dora", "INVALID_CHECKPOINT",
         drop=(f"{P}.1.self_attn.v_proj.lora_B.weight", f"{P}.1.self_attn.v_proj.lora_magnitude_vector")),
    Case("lora_B_bias_without_lora_bias", "llama", "llama_lora", "INVALID_CONFIG",
         add={f"{P}.0.self_attn.o_proj.lora_B.bias": [16]}),
    Case("lora_bias_without_lora_B_bias", "qwen2", "qwen2_lora_bias", "INVALID_CONFIG",
         drop=(f"{P}.0.self_attn.q_proj.lora_B.bias",)),
    # An embedding holding lora_embedding_B only: PEFT's lora_embedding_A starts at zero.
    Case("lora_embedding_A_missing", "llama", "llama_embedding", "INVALID_CHECKPOINT",
         drop=("base_model.model.model.embed_tokens.lora_embedding_A",)),
    # GPT-2 Conv1D layers: a targeted layer without tensors, and an untargeted one with tensors.
    Case("gpt2_conv1d_target_without_tensors", "gpt2", "gpt2_lora", None,
         drop=("base_model.model.transformer.h.1.attn.c_attn.lora_A.weight",
               "base_model.model.transformer.h.1.attn.c_attn.lora_B.weight")),
    Case("gpt2_conv1d_untargeted", "gpt2", "gpt2_lora", "INVALID_CONFIG", config={"target_modules": ["c_attn"]}),
    # BERT with modules_to_save: LoRA tensors of the classifier, which modules_to_save excludes.
    Case("bert_modules_to_save_excludes", "bert", "bert_seqcls_lora", "INVALID_CONFIG",
         add={"base_model.model.classifier.lora_A.weight": [4, 16], "base_model.model.classifier.lora_B.weight": [3, 4]}),
]

# Lenient mode keeps refusing what PEFT would load with random weights or reject.
ERROR_CASES = [
    Case("lora_A_missing", "llama", "llama_lora", "INVALID_CHECKPOINT", drop=(f"{P}.0.mlp.up_proj.lora_A.weight",)),
    Case("dora_magnitude_missing", "llama", "llama_dora", "INVALID_CONFIG",
         drop=(f"{P}.0.self_attn.q_proj.lora_magnitude_vector",)),
    Case("rank_mismatch", "llama", "llama_lora", "INVALID_CONFIG", config={"r": 8}),
    # Strict loading does not look for targets without tensors; lenient loading does, and PEFT
    # would leave this one's lora_B random.
    Case("init_false_with_missing_target", "llama", "llama_lora", None, lenient_code="INVALID_CONFIG",
         config={"init_lora_weights": False},
         drop=(f"{P}.1.self_attn.q_proj.lora_A.weight", f"{P}.1.self_attn.q_proj.lora_B.weight")),
    Case("shape_mismatch", "llama", "llama_lora", "SHAPE_MISMATCH",
         drop=(f"{P}.0.self_attn.q_proj.lora_A.weight",), add={f"{P}.0.self_attn.q_proj.lora_A.weight": [4, 12]}),
]


def run_peftc(peftc, base, adapter, out, lenient: bool):
    args = [str(peftc), "merge", "--base", str(base), "--adapter", str(adapter), "--out", str(out)]
    if lenient:
        args.append("--lenient")
    return subprocess.run(args, capture_output=True, text=True)


def warned_keys(stderr: str) -> set:
    keys = set()
    for line in stderr.splitlines():
        if line.startswith("warning: "):
            m = re.match(r'warning: (unexpected|missing) key "([^"]*)": ', line)
            assert m, f"warning without a stable kind: {line}"
            keys.add((m.group(1), m.group(2)))
    return keys


def peft_ignored_keys(base: pathlib.Path, adapter: pathlib.Path) -> set:
    """The keys PEFT's load_adapter reports for this adapter (missing: only its own LoRA keys, as
    from_pretrained filters and warns them; unexpected: every key it drops), in the file's naming."""
    from peft import PeftModel

    from merge_support import load_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(load_model(base), str(adapter))
        result = model.load_adapter(str(adapter), adapter_name="probe")

    def file_name(key: str) -> str:
        key = key.replace(".probe", "")
        return key[: -len(".weight")] if key.endswith("lora_magnitude_vector.weight") else key

    return {("missing", file_name(k)) for k in result.missing_keys} | {
        ("unexpected", file_name(k)) for k in result.unexpected_keys}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_lenient_equals_peft(case, peftc_binary, fixtures_dir, tmp_path):
    base = fixtures_dir / "models" / case.base
    adapter = edit_adapter(fixtures_dir / "adapters" / case.adapter, tmp_path / "adapter", case.config, case.drop,
                           case.add)

    strict = run_peftc(peftc_binary, base, adapter, tmp_path / "strict", lenient=False)
    if case.strict_code is None:
        assert strict.returncode == 0, strict.stderr
    else:
        assert strict.returncode == 1 and f"peftc: error: {case.strict_code}: " in strict.stderr, strict.stderr

    lenient = run_peftc(peftc_binary, base, adapter, tmp_path / "ours", lenient=True)
    assert lenient.returncode == 0, lenient.stderr
    ours = warned_keys(lenient.stderr)
    assert ours, "lenient loading of an adapter PEFT loads with warnings reported nothing"
    assert ours == peft_ignored_keys(base, adapter)

    ref = peft_merged(base, [(adapter, 1.0)])
    stats = compare_weights(file_tensors(tmp_path / "ours"), saved_tensors(ref, tmp_path / "ref"))
    assert stats["f32_rel"] <= 1e-6, stats


@pytest.mark.parametrize("case", ERROR_CASES, ids=lambda c: c.id)
def test_lenient_keeps_refusing(case, peftc_binary, fixtures_dir, tmp_path):
    base = fixtures_dir / "models" / case.base
    adapter = edit_adapter(fixtures_dir / "adapters" / case.adapter, tmp_path / "adapter", case.config, case.drop,
                           case.add)
    for lenient, code in ((False, case.strict_code), (True, case.lenient_code or case.strict_code)):
        proc = run_peftc(peftc_binary, base, adapter, tmp_path / f"out{lenient}", lenient)
        if code is None:
            assert proc.returncode == 0, proc.stderr
            continue
        assert proc.returncode == 1 and f"peftc: error: {code}: " in proc.stderr, (lenient, proc.stderr)
        assert not (tmp_path / f"out{lenient}").exists()
