"""GGUF LoRA adapters as merge inputs: `peftc merge --base BASE.gguf --adapter LORA.gguf[:W] ...`.

- A GGUF LoRA written by convert_lora_to_gguf.py (F32, F16, BF16 and Q8_0 factors; a token_embd pair;
  alpha 0) merges as llama-export-lora merges it into the same F32 or F16 base. llama-export-lora refuses
  quantized adapters: for Q8_0 factors its reference is the same adapter dequantized by gguf-py.
- A weighted mix of GGUF LoRAs and PEFT folders, in either order, equals llama-export-lora with both
  (the folder converted by convert_lora_to_gguf.py), --lora-scaled with the same weights.
- --lenient with a GGUF base opens the folders without it, and passes GGUF LoRAs on.
- Refused before anything is written, with their codes: an architecture other than the base's, a pair
  without lora_b, factors that do not fit, a tensor the base lacks, a GGUF LoRA with a Hugging Face base,
  a GGUF model file given as an adapter.

Skipped (with the reason) when PEFT_LLAMA_CPP_BIN is not set; scripts/test.sh sets it.
"""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from gguf_reference import (assert_same_merge, convert_hf_to_gguf, convert_lora_to_gguf, dequantized_gguf,
                            export_lora, gguf_module, read_gguf, rewrite_gguf, run_peftc)

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
MODELS = FIXTURES / "models"
ADAPTERS = FIXTURES / "adapters"

# (base outtype, adapter, factor outtype, weight). convert_lora_to_gguf.py writes Q8_0 only for rows of a
# multiple of 32 values (F16 otherwise): in the tiny llama only ffn_down's lora_a, which llama_all_linear
# has, so its q8_0 file mixes Q8_0 and F16 factors in one pair.
GGUF_LORAS = [("f32", "llama_lora", "f32", 1.0), ("f32", "llama_lora", "f16", 0.7), ("f16", "llama_lora", "f16", 1.0),
              ("f32", "llama_lora", "bf16", 1.0), ("f32", "llama_all_linear", "f32", 1.0),
              ("f32", "llama_all_linear", "q8_0", 1.0), ("f16", "llama_all_linear", "q8_0", -0.5),
              ("f32", "llama_embedding", "f32", 1.0), ("f16", "llama_embedding", "f16", 0.5),
              ("f32", "llama_rank_alpha_pattern", "f32", 1.0)]


def gguf_lora(adapter: str, outtype: str = "f32") -> pathlib.Path:
    return convert_lora_to_gguf(ADAPTERS / adapter, MODELS / "llama", outtype=outtype)


def reference_adapter(lora: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    """The adapter llama-export-lora takes for `lora`: itself, or dequantized when it holds Q8_0 factors."""
    quantized = any(t.tensor_type.name not in ("F32", "F16", "BF16") for t in read_gguf(lora).tensors)
    return dequantized_gguf(lora, tmp_path / "dequantized.gguf") if quantized else lora


def merge(peftc, base: pathlib.Path, out: pathlib.Path, adapters, *extra: str, expect: int = 0):
    args = ["merge", "--base", base, "--out", out, *extra]
    for adapter, weight in adapters:
        args += ["--adapter", f"{adapter}:{weight!r}"]
    return run_peftc(peftc, *args, expect=expect)


@pytest.mark.parametrize("base_type,adapter,factor_type,weight", GGUF_LORAS,
                         ids=[f"{b}-{a}-{f}-{w}" for b, a, f, w in GGUF_LORAS])
def test_gguf_lora_merges_as_llama_export_lora(peftc_binary, tmp_path, base_type, adapter, factor_type, weight):
    base = convert_hf_to_gguf(MODELS / "llama", outtype=base_type)
    lora = gguf_lora(adapter, factor_type)
    types = {t.tensor_type.name for t in read_gguf(lora).tensors}
    assert factor_type.upper() in types, types
    reference = export_lora(base, [(reference_adapter(lora, tmp_path), weight)])
    out = tmp_path / "merged.gguf"
    proc = merge(peftc_binary, base, out, [(lora, weight)])
    assert "merged 1 adapter" in proc.stdout
    assert assert_same_merge(out, reference, base) > 0


def test_alpha_zero_scales_by_the_weight(peftc_binary, tmp_path):
    gguf = gguf_module()
    base = convert_hf_to_gguf(MODELS / "llama", outtype="f32")
    lora = rewrite_gguf(gguf_lora("llama_lora"), tmp_path / "alpha0.gguf",
                        {"adapter.lora.alpha": (0.0, gguf.GGUFValueType.FLOAT32)})
    no_alpha = rewrite_gguf(lora, tmp_path / "no-alpha.gguf", {"adapter.lora.alpha": (None, None)})
    reference = export_lora(base, [(lora, 0.25)])
    for adapter in (lora, no_alpha):
        out = tmp_path / f"merged-{adapter.stem}.gguf"
        merge(peftc_binary, base, out, [(adapter, 0.25)])
        assert assert_same_merge(out, reference, base) > 0


# (base outtype, [(adapter, "gguf" or "peft" and the GGUF factor type, weight)])
MIXES = [("f32", [("llama_lora", "gguf-f32", 1.0), ("llama_lora_second", "peft", -0.5)]),
         ("f32", [("llama_lora_second", "peft", 0.5), ("llama_lora", "gguf-f16", 0.75)]),
         ("f16", [("llama_lora", "gguf-f32", 1.0), ("llama_lora_second", "peft", 1.0), ("llama_lora", "gguf-f16", -0.25)])]


@pytest.mark.parametrize("base_type,adapters", MIXES,
                         ids=[f"{b}-" + "+".join(f"{a}.{k}" for a, k, _ in ads) for b, ads in MIXES])
def test_mix_of_gguf_lora_and_peft_folder(peftc_binary, tmp_path, base_type, adapters):
    base = convert_hf_to_gguf(MODELS / "llama", outtype=base_type)
    ours, theirs = [], []
    for adapter, kind, weight in adapters:
        if kind == "peft":
            ours.append((ADAPTERS / adapter, weight))
            theirs.append((gguf_lora(adapter), weight))
        else:
            ours.append((gguf_lora(adapter, kind[len("gguf-"):]), weight))
            theirs.append((ours[-1][0], weight))
    reference = export_lora(base, theirs)
    out = tmp_path / "merged.gguf"
    merge(peftc_binary, base, out, ours)
    assert assert_same_merge(out, reference, base) > 0


def test_lenient_with_a_gguf_base(peftc_binary, tmp_path):
    base = convert_hf_to_gguf(MODELS / "llama", outtype="f32")
    # A PEFT folder alone: opened without the base (it is no model folder).
    out = tmp_path / "folder.gguf"
    merge(peftc_binary, base, out, [(ADAPTERS / "llama_lora", 1.0)], "--lenient")
    assert assert_same_merge(out, export_lora(base, [(gguf_lora("llama_lora"), 1.0)]), base) > 0
    # With a GGUF LoRA.
    out = tmp_path / "mixed.gguf"
    merge(peftc_binary, base, out, [(ADAPTERS / "llama_lora_second", 0.5), (gguf_lora("llama_lora"), 1.0)],
          "--lenient")
    reference = export_lora(base, [(gguf_lora("llama_lora_second"), 0.5), (gguf_lora("llama_lora"), 1.0)])
    assert assert_same_merge(out, reference, base) > 0


# --- refused before writing -----------------------------------------------------------------------------

def factors(path: pathlib.Path) -> list:
    return [(t.name, np.array(t.data), t.tensor_type) for t in read_gguf(path).tensors]


def refused(peftc, tmp_path, adapter, code: str, *needles: str, base=None):
    base = base or convert_hf_to_gguf(MODELS / "llama", outtype="f32")
    out = tmp_path / "merged.gguf"
    proc = merge(peftc, base, out, [(adapter, 1.0)], expect=1)
    assert code in proc.stderr, proc.stderr
    for needle in needles:
        assert needle in proc.stderr, proc.stderr
    assert not out.exists()
    assert list(tmp_path.glob("merged*")) == []
    return proc


def test_architecture_mismatch(peftc_binary, tmp_path):
    gguf = gguf_module()
    lora = rewrite_gguf(gguf_lora("llama_lora"), tmp_path / "qwen2.gguf",
                        {"general.architecture": ("qwen2", gguf.GGUFValueType.STRING)})
    refused(peftc_binary, tmp_path, lora, "INVALID_ARGUMENT", "architecture", "qwen2")


def test_missing_lora_b(peftc_binary, tmp_path):
    tensors = factors(gguf_lora("llama_lora"))
    dropped = next(name for name, _, _ in tensors if name.endswith(".lora_b"))
    lora = rewrite_gguf(gguf_lora("llama_lora"), tmp_path / "no-b.gguf",
                        tensors=[t for t in tensors if t[0] != dropped])
    refused(peftc_binary, tmp_path, lora, "INVALID_CHECKPOINT", dropped, "is missing")


def test_shapes_that_do_not_fit(peftc_binary, tmp_path):
    tensors = factors(gguf_lora("llama_lora"))
    a_name = next(name for name, _, _ in tensors if name.endswith(".lora_a"))
    changed = [(n, np.zeros((d.shape[0], d.shape[1] + 32), np.float32) if n == a_name else d, t) for n, d, t in tensors]
    lora = rewrite_gguf(gguf_lora("llama_lora"), tmp_path / "wide.gguf", tensors=changed)
    refused(peftc_binary, tmp_path, lora, "SHAPE_MISMATCH", a_name[:-len(".lora_a")], "does not fit")


def test_every_problem_listed(peftc_binary, tmp_path):
    tensors = factors(gguf_lora("llama_lora"))
    a_names = [name for name, _, _ in tensors if name.endswith(".lora_a")]
    wide, lost = a_names[0], a_names[1][:-len(".lora_a")] + ".lora_b"
    changed = [(n, np.zeros((d.shape[0], d.shape[1] + 32), np.float32) if n == wide else d, t)
               for n, d, t in tensors if n != lost]
    changed.append(("blk.99.attn_q.weight.lora_a", tensors[0][1], tensors[0][2]))
    changed.append(("blk.99.attn_q.weight.lora_b", tensors[1][1], tensors[1][2]))
    changed.append(("blk.0.attn_norm.weight.delta", np.zeros(4, np.float32), gguf_module().GGMLQuantizationType.F32))
    lora = rewrite_gguf(gguf_lora("llama_lora"), tmp_path / "broken.gguf", tensors=changed)
    proc = refused(peftc_binary, tmp_path, lora, "INVALID_CHECKPOINT", "4 problems", "SHAPE_MISMATCH",
                   "UNRESOLVED_KEY", "blk.99.attn_q.weight", "UNSUPPORTED", "attn_norm.weight.delta", lost)
    assert proc.stderr.index("INVALID_CHECKPOINT: ") < proc.stderr.index("UNRESOLVED_KEY: ") \
        < proc.stderr.index("SHAPE_MISMATCH: ") < proc.stderr.index("UNSUPPORTED: ")


def test_gguf_lora_with_a_hugging_face_base(peftc_binary, tmp_path):
    out = tmp_path / "merged"
    proc = merge(peftc_binary, MODELS / "llama", out, [(gguf_lora("llama_lora"), 1.0)], expect=1)
    assert "UNSUPPORTED" in proc.stderr and "--format peft" in proc.stderr and "peft_adapter_import_gguf" in proc.stderr
    assert not out.exists()


def test_gguf_model_file_as_adapter(peftc_binary, tmp_path):
    model = convert_hf_to_gguf(MODELS / "llama", outtype="f16")
    refused(peftc_binary, tmp_path, model, "INVALID_ARGUMENT", "is not a GGUF adapter", "general.type")


def test_gguf_lora_without_base(peftc_binary, tmp_path):
    out = tmp_path / "merged.gguf"
    proc = run_peftc(peftc_binary, "merge", "--adapter", gguf_lora("llama_lora"), "--out", out, expect=2)
    assert "needs --base" in proc.stderr
    assert not out.exists()
