"""Merges into block-quantized GGUF bases: `peftc merge --base Q.gguf [--quant TYPE | --dtype D] [--report]`.

The base: a tiny llama made by transformers (hidden 256, so that every weight row fills Q4_K's blocks of
256), converted by convert_hf_to_gguf.py to F32 and quantized by llama-quantize to Q4_K_M (Q4_K and Q6_K
tensors) and to Q8_0. The adapter: a PEFT LoRA (random A and B) on the attention and MLP projections,
converted by convert_lora_to_gguf.py.

The reference, built from ggml alone: the quantized base dequantized by ggml (`to_float`, through the
test driver ggml_quant_driver linked to the reference build's libggml-base), merged by llama-export-lora
(F32 in, F32 out), and each merged tensor quantized back to its base type by ggml_quantize_chunk.
Untouched tensors are copied byte for byte. Each merged tensor is byte for byte ggml's quantization of
our own f32 merge (the same merge written with --dtype f32 / --quant F32), that f32 merge is within 1e-6
relative of llama-export-lora's, and ggml's quantization of llama-export-lora's merge equals ours in every
block whose f32 values are the same in both merges (llama-export-lora's sums depend on how ggml was built:
the reference build, without GGML_SIMD, adds the rank products in double; ours are the fused float order of
ggml's SIMD builds; docs/quantized-bases.md), and llama-export-lora's F32 merge is exactly that double-sum
order, recomputed here in numpy. With --quant Q8_0 the same holds for Q8_0; with --dtype f16 the merged tensors are
F16 within one step of llama-export-lora's values. llama.cpp (llama-simple) loads the merged file and generates a few greedy tokens.
--report prints each merged tensor's figures, and the C API (through the Python binding's ctypes library)
gives them as JSON: zero error for F32 output, and figures of the right size for Q4_K.

Skipped (with the reason) when PEFT_LLAMA_CPP_BIN is not set or the driver was not built; scripts/test.sh
sets it up.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

from gguf_reference import (convert_hf_to_gguf, convert_lora_to_gguf, export_lora, gguf_module, llama_cpp,
                            quantize, read_gguf, rewrite_gguf, run_peftc)

REPO = pathlib.Path(__file__).resolve().parents[2]
DRIVER = pathlib.Path(os.environ.get("PEFT_GGML_QUANT_DRIVER")
                      or REPO / "build" / "tests" / "interop" / "ggml_quant_driver")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "down_proj"]


def driver() -> pathlib.Path:
    llama_cpp()  # skips without the reference build
    if not DRIVER.exists():
        pytest.skip(f"{DRIVER} not built (configure with the llama.cpp reference build's environment)")
    return DRIVER


def ggml(mode: str, type_id: int, rows: int, cols: int, data: bytes, tmp: pathlib.Path) -> bytes:
    src, dst = tmp / "driver.in", tmp / "driver.out"
    src.write_bytes(data)
    subprocess.run([str(driver()), mode, str(type_id), str(rows), str(cols), str(src), str(dst)], check=True)
    return dst.read_bytes()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(model folder, GGUF LoRA, PEFT adapter folder)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    root = tmp_path_factory.mktemp("quant_llama")
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=256, max_position_embeddings=64, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    model.save_pretrained(str(root / "model"))
    lora = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False))
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_" in name:
                p.mul_(0.5)
    lora.save_pretrained(str(root / "adapter"))
    gguf_lora = convert_lora_to_gguf(root / "adapter", root / "model")
    return root / "model", gguf_lora, root / "adapter"


@pytest.fixture(scope="module")
def second(tmp_path_factory, tiny):
    """A second GGUF LoRA on the same modules (llama-export-lora merges several only when their tensors match)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    model, _, _ = tiny
    root = tmp_path_factory.mktemp("quant_llama_second")
    torch.manual_seed(1)
    lora = get_peft_model(LlamaForCausalLM.from_pretrained(str(model)),
                          LoraConfig(r=8, lora_alpha=12, target_modules=TARGETS, init_lora_weights=False))
    lora.save_pretrained(str(root / "adapter"))
    return convert_lora_to_gguf(root / "adapter", model)


def raw(t) -> bytes:
    return np.ascontiguousarray(np.array(t.data)).tobytes()


def reference_merge(base: pathlib.Path, lora: pathlib.Path, tmp: pathlib.Path) -> pathlib.Path:
    """ggml's dequantization of `base`, merged by llama-export-lora: an F32 GGUF."""
    gguf = gguf_module()
    F32 = gguf.GGMLQuantizationType.F32
    out = []
    for t in read_gguf(base).tensors:
        cols, rows = int(t.shape[0]), int(np.prod(t.shape[1:]))
        values = np.frombuffer(ggml("dequantize", int(t.tensor_type), rows, cols, raw(t), tmp), dtype=np.float32)
        out.append((t.name, values.reshape(list(reversed([int(n) for n in t.shape]))), F32))
    dequantized = rewrite_gguf(base, tmp / "dequantized.gguf", tensors=out)
    return export_lora(dequantized, [(lora, 1.0)], out_path=tmp / "reference.gguf")


def merge(peftc, base, lora, out, *extra):
    return run_peftc(peftc, "merge", "--base", base, "--adapter", lora, "--out", out, "--threads", "2", *extra)


def check_against_ggml(out: pathlib.Path, exact: pathlib.Path, base: pathlib.Path, reference: pathlib.Path,
                       tmp: pathlib.Path, quant: int | None = None) -> dict:
    """`out` against ggml, tensor by tensor. Untouched tensors: the base's bytes. Merged ones: in their base
    type (or `quant`), byte for byte ggml's quantization of `exact` (our merge written F32, --dtype f32);
    `exact` within 1e-6 relative of llama-export-lora's F32 merge `reference`; and ggml's quantization of
    `reference` equal to `out` in every block whose f32 values are the same in `exact` and `reference`. Returns
    {tensor: type name} of the merged tensors."""
    got = {t.name: t for t in read_gguf(out).tensors}
    f32 = {t.name: t for t in read_gguf(exact).tensors}
    want = {t.name: t for t in read_gguf(reference).tensors}
    merged = {}
    for t in read_gguf(base).tensors:
        cols, rows = int(t.shape[0]), int(np.prod(t.shape[1:]))
        g = got[t.name]
        assert [int(n) for n in g.shape] == [int(n) for n in t.shape], t.name
        base_values = ggml("dequantize", int(t.tensor_type), rows, cols, raw(t), tmp)
        theirs = np.array(want[t.name].data, dtype=np.float32).reshape(rows, cols)
        if theirs.tobytes() == base_values:  # not merged: copied byte for byte
            assert g.tensor_type == t.tensor_type and raw(g) == raw(t), t.name
            continue
        out_type = int(t.tensor_type if quant is None or len(t.shape) < 2 else quant)
        assert int(g.tensor_type) == out_type, t.name
        ours = np.array(f32[t.name].data, dtype=np.float32).reshape(rows, cols)
        assert raw(g) == ggml("quantize", out_type, rows, cols, ours.tobytes(), tmp), \
            f"{t.name}: {g.tensor_type.name} bytes differ from ggml's quantization of the same f32 merge"
        scale = float(np.abs(theirs).max())
        assert float(np.abs(ours.astype(np.float64) - theirs).max()) <= 1e-6 * scale, t.name
        block_values, block_bytes = gguf_module().GGML_QUANT_SIZES[g.tensor_type]
        stored = np.frombuffer(raw(g), dtype=np.uint8).reshape(-1, block_bytes)
        requantized = np.frombuffer(ggml("quantize", out_type, rows, cols, theirs.tobytes(), tmp),
                                    dtype=np.uint8).reshape(-1, block_bytes)
        # A block may differ only where its f32 inputs differ (docs/quantized-bases.md: llama-export-lora's
        # sums depend on how ggml was built; ours are the fused float order of its SIMD builds).
        differing = ~np.all(stored == requantized, axis=1)
        inputs_differ = ~np.all(ours.reshape(-1, block_values).view(np.uint32)
                                == theirs.reshape(-1, block_values).view(np.uint32), axis=1)
        assert not np.any(differing & ~inputs_differ), \
            f"{t.name}: blocks {np.flatnonzero(differing & ~inputs_differ)[:8]} differ from ggml's quantization of " \
            "llama-export-lora's merge although their f32 values are the same"
        merged[t.name] = g.tensor_type.name
    return merged


def assert_reference_order(dequantized: pathlib.Path, lora: pathlib.Path, reference: pathlib.Path) -> None:
    """The reference build's llama-export-lora (ggml without GGML_SIMD) sums each delta value as float
    products added in double in rank order, rounded to float once; then x (alpha / rank) and + base in
    float (docs/quantized-bases.md). Reproduced here bit for bit, for every merged tensor."""
    adapter = read_gguf(lora)
    alpha = float(adapter.fields["adapter.lora.alpha"].parts[-1][0])
    factors = {t.name: np.array(t.data, dtype=np.float32) for t in adapter.tensors}
    base = {t.name: np.array(t.data, dtype=np.float32) for t in read_gguf(dequantized).tensors}
    checked = 0
    for t in read_gguf(reference).tensors:
        if t.name + ".lora_a" not in factors:
            continue
        a, b = factors[t.name + ".lora_a"], factors[t.name + ".lora_b"]  # [rank, in], [out, rank]
        total = np.zeros((b.shape[0], a.shape[1]), dtype=np.float64)
        for k in range(a.shape[0]):
            total += (b[:, k:k + 1] * a[k:k + 1, :]).astype(np.float64)  # float products, double sum
        scale = np.float32(alpha) / np.float32(a.shape[0])
        want = total.astype(np.float32) * scale + base[t.name].reshape(total.shape)
        assert np.array(t.data, dtype=np.float32).reshape(total.shape).tobytes() == want.tobytes(), t.name
        checked += 1
    assert checked == 2 * len(TARGETS)


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q8_0"])
def test_merge_equals_ggml_requantized_export_lora(peftc_binary, tmp_path, tiny, ftype):
    model, lora, _ = tiny
    base = quantize(convert_hf_to_gguf(model, outtype="f32"), type=ftype)
    out, exact = tmp_path / "merged.gguf", tmp_path / "exact.gguf"
    merge(peftc_binary, base, lora, out)
    merge(peftc_binary, base, lora, exact, "--dtype", "f32")
    reference = reference_merge(base, lora, tmp_path)
    assert_reference_order(tmp_path / "dequantized.gguf", lora, reference)
    merged = check_against_ggml(out, exact, base, reference, tmp_path)
    assert len(merged) == 2 * len(TARGETS)
    types = set(merged.values())
    assert types == ({"Q4_K", "Q6_K"} if ftype == "Q4_K_M" else {"Q8_0"}), types
    assert abs(out.stat().st_size - base.stat().st_size) < 4096  # the base's size, not F16's


def merged_names(lora: pathlib.Path) -> set:
    return {t.name[:-len(".lora_a")] for t in read_gguf(lora).tensors if t.name.endswith(".lora_a")}


def assert_ggml_equal(out: pathlib.Path, exact: pathlib.Path, base: pathlib.Path, reference: pathlib.Path,
                      merged: set, tmp: pathlib.Path) -> None:
    """--arithmetic ggml: `exact` (--dtype f32) holds llama-export-lora's F32 merge `reference` bit for bit in
    every merged tensor, and `out` holds, byte for byte, ggml's quantization of it to the base's type;
    untouched tensors are the base's bytes."""
    got = {t.name: t for t in read_gguf(out).tensors}
    f32 = {t.name: t for t in read_gguf(exact).tensors}
    want = {t.name: t for t in read_gguf(reference).tensors}
    seen = 0
    for t in read_gguf(base).tensors:
        g = got[t.name]
        if t.name not in merged:
            assert g.tensor_type == t.tensor_type and raw(g) == raw(t), t.name
            continue
        seen += 1
        cols, rows = int(t.shape[0]), int(np.prod(t.shape[1:]))
        theirs = np.array(want[t.name].data, dtype=np.float32).reshape(rows, cols)
        ours = np.array(f32[t.name].data, dtype=np.float32).reshape(rows, cols)
        differ = int(np.count_nonzero(ours.view(np.uint32) != theirs.view(np.uint32)))
        assert differ == 0, f"{t.name}: {differ} f32 values differ from llama-export-lora's merge"
        assert g.tensor_type == t.tensor_type, t.name
        assert raw(g) == ggml("quantize", int(t.tensor_type), rows, cols, theirs.tobytes(), tmp), \
            f"{t.name}: {g.tensor_type.name} bytes differ from ggml's quantization of llama-export-lora's merge"
    assert seen == len(merged) == 2 * len(TARGETS)


@pytest.mark.parametrize("ftype", ["Q4_K_M", "Q8_0"])
def test_ggml_arithmetic_equals_export_lora(peftc_binary, tmp_path, tiny, ftype):
    """peftc merge --arithmetic ggml: the quantized merge is ggml's quantization of llama-export-lora's F32
    merge of the same dequantized base, byte for byte (issue 17), and the F32 merge is llama-export-lora's."""
    model, lora, _ = tiny
    base = quantize(convert_hf_to_gguf(model, outtype="f32"), type=ftype)
    out, exact = tmp_path / "merged.gguf", tmp_path / "exact.gguf"
    merge(peftc_binary, base, lora, out, "--arithmetic", "ggml")
    merge(peftc_binary, base, lora, exact, "--arithmetic", "ggml", "--dtype", "f32")
    reference = reference_merge(base, lora, tmp_path)
    assert_ggml_equal(out, exact, base, reference, merged_names(lora), tmp_path)
    # PEFT's order (the default) is another merge: it differs from llama-export-lora's in some values.
    default = tmp_path / "default.gguf"
    merge(peftc_binary, base, lora, default, "--dtype", "f32")
    assert any(raw(a) != raw(b) for a, b in zip(read_gguf(default).tensors, read_gguf(exact).tensors))


def test_ggml_arithmetic_two_weighted_adapters(peftc_binary, tmp_path, tiny, second):
    """Two adapters with weights (llama-export-lora --lora-scaled A 0.7 --lora-scaled B -0.3: base + d_A, then
    + d_B) and the PEFT folder of A (its scale weight * alpha / rank taken in float, as for the GGUF)."""
    model, lora, adapter = tiny
    base = quantize(convert_hf_to_gguf(model, outtype="f32"), type="Q8_0")
    reference_merge(base, lora, tmp_path)  # writes tmp_path / "dequantized.gguf"
    dequantized = tmp_path / "dequantized.gguf"
    reference = export_lora(dequantized, [(lora, 0.7), (second, -0.3)], out_path=tmp_path / "two.gguf")
    out, exact = tmp_path / "merged.gguf", tmp_path / "exact.gguf"
    for path, extra in ((out, ()), (exact, ("--dtype", "f32"))):
        run_peftc(peftc_binary, "merge", "--base", base, "--adapter", f"{lora}:0.7", "--adapter", f"{second}:-0.3",
                  "--out", path, "--threads", "2", "--arithmetic", "ggml", *extra)
    assert_ggml_equal(out, exact, base, reference, merged_names(lora), tmp_path)

    reference = export_lora(dequantized, [(lora, 0.7)], out_path=tmp_path / "one.gguf")
    for path, extra in ((out, ()), (exact, ("--dtype", "f32"))):
        run_peftc(peftc_binary, "merge", "--base", base, "--adapter", f"{adapter}:0.7", "--out", path,
                  "--threads", "2", "--arithmetic", "ggml", *extra)
    assert_ggml_equal(out, exact, base, reference, merged_names(lora), tmp_path)


def test_ggml_arithmetic_refusals(peftc_binary, tmp_path, tiny):
    model, lora, _ = tiny
    base = convert_hf_to_gguf(model, outtype="f32")
    proc = run_peftc(peftc_binary, "merge", "--base", base, "--adapter", lora, "--out", tmp_path / "x.gguf",
                     "--arithmetic", "fast", expect=2)
    assert "--arithmetic" in proc.stderr
    # DoRA has no ggml order: refused naming the module and DoRA, nothing written.
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(2)
    dora = get_peft_model(LlamaForCausalLM.from_pretrained(str(model)),
                          LoraConfig(r=4, target_modules=["v_proj"], use_dora=True, init_lora_weights=False))
    dora.save_pretrained(str(tmp_path / "dora"))
    proc = run_peftc(peftc_binary, "merge", "--base", base, "--adapter", tmp_path / "dora", "--out",
                     tmp_path / "x.gguf", "--arithmetic", "ggml", expect=1)
    assert "UNSUPPORTED" in proc.stderr and "DoRA" in proc.stderr and "v_proj" in proc.stderr
    assert "plain LoRA only" in proc.stderr
    assert not (tmp_path / "x.gguf").exists()


def ggml_order(base: np.ndarray, terms) -> np.ndarray:
    """assert_reference_order's arithmetic (the one llama-export-lora's reference build is checked to follow,
    bit for bit) for PEFT factors: terms of (A [rank, in], B [out, rank], weight, alpha), added in turn."""
    cur = base.astype(np.float32)
    for a, b, weight, alpha in terms:
        total = np.zeros((b.shape[0], a.shape[1]), dtype=np.float64)
        for k in range(a.shape[0]):
            total += (b[:, k:k + 1] * a[k:k + 1, :]).astype(np.float64)  # float products, double sum
        scale = np.float32(weight) * np.float32(alpha) / np.float32(a.shape[0])
        cur = total.astype(np.float32) * scale + cur
    return cur


def test_ggml_arithmetic_safetensors_base(peftc_binary, tmp_path):
    """Without llama.cpp: --arithmetic ggml into the F32 fixture llama (a safetensors base) with two weighted
    adapters equals ggml_order bit for bit in every merged tensor; PEFT's default order differs from it."""
    from safetensors.numpy import load_file

    fixtures = pathlib.Path(os.environ.get("PEFT_TEST_DATA") or REPO / "tests" / "fixtures")
    model = fixtures / "models" / "llama"
    adapters = [(fixtures / "adapters" / "llama_lora", 0.7), (fixtures / "adapters" / "llama_lora_second", 0.45)]
    if not (model / "model.safetensors").exists():
        pytest.skip("fixtures not generated (tests/fixtures/generate.py)")
    args = []
    for folder, weight in adapters:
        args += ["--adapter", f"{folder}:{weight}"]
    run_peftc(peftc_binary, "merge", "--base", model, *args, "--out", tmp_path / "ggml", "--arithmetic", "ggml")
    run_peftc(peftc_binary, "merge", "--base", model, *args, "--out", tmp_path / "peft")
    base = load_file(str(model / "model.safetensors"))
    ours = load_file(str(tmp_path / "ggml" / "model.safetensors"))
    default = load_file(str(tmp_path / "peft" / "model.safetensors"))
    factors = []
    for folder, weight in adapters:
        alpha = json.loads((folder / "adapter_config.json").read_text())["lora_alpha"]
        factors.append((load_file(str(folder / "adapter_model.safetensors")), weight, alpha))
    checked = differs = 0
    for name, w in base.items():
        stem = "base_model.model." + name[:-len(".weight")]
        if stem + ".lora_A.weight" not in factors[0][0]:
            assert ours[name].tobytes() == w.tobytes(), name
            continue
        terms = [(f[stem + ".lora_A.weight"], f[stem + ".lora_B.weight"], weight, alpha) for f, weight, alpha in factors]
        want = ggml_order(w, terms)
        assert ours[name].dtype == np.float32 and ours[name].tobytes() == want.tobytes(), \
            f"{name}: {np.count_nonzero(ours[name].view(np.uint32) != want.view(np.uint32))} values differ"
        differs += default[name].tobytes() != want.tobytes()
        checked += 1
    assert checked == 14 and differs > 0, (checked, differs)


def test_quant_and_dtype_options(peftc_binary, tmp_path, tiny):
    model, lora, _ = tiny
    base = quantize(convert_hf_to_gguf(model, outtype="f32"), type="Q4_K_M")
    reference = reference_merge(base, lora, tmp_path)
    out, exact = tmp_path / "q8.gguf", tmp_path / "exact.gguf"
    merge(peftc_binary, base, lora, out, "--quant", "q8_0")
    merge(peftc_binary, base, lora, exact, "--quant", "F32")
    assert set(check_against_ggml(out, exact, base, reference, tmp_path, quant=8).values()) == {"Q8_0"}

    out = tmp_path / "f16.gguf"
    merge(peftc_binary, base, lora, out, "--dtype", "f16")
    got = {t.name: t for t in read_gguf(out).tensors}
    merged = 0
    for t in read_gguf(reference).tensors:
        if got[t.name].tensor_type.name != "F16":
            continue
        merged += 1
        ours = np.array(got[t.name].data).view(np.int16).astype(np.int32).ravel()
        theirs = np.array(t.data, dtype=np.float32).astype(np.float16).view(np.int16).astype(np.int32).ravel()
        assert np.abs(ours - theirs).max() <= 1, t.name
    assert merged == 2 * len(TARGETS)

    proc = run_peftc(peftc_binary, "merge", "--base", base, "--adapter", lora, "--out", tmp_path / "x.gguf",
                     "--quant", "Q8_0", "--dtype", "f16", expect=1)
    assert "INVALID_ARGUMENT" in proc.stderr
    proc = run_peftc(peftc_binary, "merge", "--base", base, "--adapter", lora, "--out", tmp_path / "x.gguf",
                     "--quant", "IQ2_XS", expect=1)
    assert "UNSUPPORTED" in proc.stderr and "IQ2_XS" in proc.stderr
    assert not (tmp_path / "x.gguf").exists()


def test_iq_target_refused_naming_it(peftc_binary, tmp_path, tiny):
    model, lora, _ = tiny
    base = convert_hf_to_gguf(model, outtype="f32")
    gguf = gguf_module()
    # An IQ4_XS attn_q (bytes do not matter: the merge refuses before reading them).
    tensors = []
    for t in read_gguf(base).tensors:
        if t.name == "blk.0.attn_q.weight":
            rows, cols = int(t.shape[1]), int(t.shape[0])
            tensors.append((t.name, np.zeros((rows, cols // 256 * 136), dtype=np.uint8),
                            gguf.GGMLQuantizationType.IQ4_XS))
        else:
            tensors.append((t.name, np.array(t.data), t.tensor_type))
    iq = rewrite_gguf(base, tmp_path / "iq.gguf", tensors=tensors)
    proc = run_peftc(peftc_binary, "merge", "--base", iq, "--adapter", lora, "--out", tmp_path / "out.gguf", expect=1)
    assert "UNSUPPORTED" in proc.stderr and "blk.0.attn_q.weight" in proc.stderr and "IQ4_XS" in proc.stderr
    assert "--quant" in proc.stderr
    merge(peftc_binary, iq, lora, tmp_path / "out.gguf", "--quant", "Q4_K")
    assert {t.name: t.tensor_type.name for t in read_gguf(tmp_path / "out.gguf").tensors}["blk.0.attn_q.weight"] == "Q4_K"


def test_report(peftc_binary, tmp_path, tiny, peft_c_lib):
    model, lora, adapter = tiny
    base = quantize(convert_hf_to_gguf(model, outtype="f32"), type="Q4_K_M")
    proc = merge(peftc_binary, base, lora, tmp_path / "out.gguf", "--report")
    lines = [line.split() for line in proc.stdout.splitlines() if line.startswith("  blk.")]
    assert len(lines) == 2 * len(TARGETS)
    for name, base_type, out_type, rms, biggest, base_rms, base_max in lines:
        assert base_type == out_type and out_type in ("Q4_K", "Q6_K"), name
        assert 0 < float(rms) <= float(biggest) and 0 <= float(base_rms) <= float(base_max), name

    # The C API: the PEFT folder adapter into the same base, with --quant F32 (nothing lost) and Q4_K.
    import ctypes

    lib = ctypes.CDLL(str(peft_c_lib))
    lib.peft_merge_result_report_json.restype = ctypes.c_char_p
    lib.peft_merge_result_report_json.argtypes = [ctypes.c_void_p]
    for quant, lossless in ((0, True), (12, False)):
        opts, result = ctypes.c_void_p(), ctypes.c_void_p()
        assert lib.peft_merge_options_new(ctypes.byref(opts)) is None or True
        for call, args in (("peft_merge_options_add_adapter_dir", (opts, str(adapter).encode(), ctypes.c_double(1.0))),
                           ("peft_merge_options_set_quant", (opts, ctypes.c_int32(quant))),
                           ("peft_merge_options_set_report", (opts, ctypes.c_int32(1)))):
            getattr(lib, call).restype = ctypes.c_void_p
            assert getattr(lib, call)(*args) is None, call
        lib.peft_merge_checkpoint.restype = ctypes.c_void_p
        err = lib.peft_merge_checkpoint(str(base).encode(), str(tmp_path / f"c{quant}.gguf").encode(), opts,
                                        ctypes.byref(result))
        assert err is None
        report = json.loads(lib.peft_merge_result_report_json(result))
        assert len(report) == 2 * len(TARGETS)
        for entry in report:
            assert entry["type"] == ("F32" if lossless else "Q4_K") and entry["values"] > 0
            if lossless:
                assert entry["rms"] == entry["max"] == entry["base_rms"] == entry["base_max"] == 0
            else:
                # Re-quantizing a Q4_K tensor's own values may give them back exactly: base figures may be 0.
                assert 0 < entry["rms"] <= entry["max"] and 0 <= entry["base_rms"] <= entry["base_max"]
        lib.peft_merge_result_free.argtypes = [ctypes.c_void_p]
        lib.peft_merge_options_free.argtypes = [ctypes.c_void_p]
        lib.peft_merge_result_free(result)
        lib.peft_merge_options_free(opts)


def test_llama_cpp_runs_the_merged_file(peftc_binary, tmp_path, tiny):
    model, lora, _ = tiny
    base = quantize(convert_hf_to_gguf(model, outtype="f32"), type="Q4_K_M")
    out = tmp_path / "merged.gguf"
    merge(peftc_binary, base, lora, out)
    simple = llama_cpp().tool("llama-simple")
    proc = subprocess.run([str(simple), "-m", str(out), "-n", "4", "hello"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "decoded 4 tokens" in proc.stderr + proc.stdout, (proc.stdout + proc.stderr)[-2000:]
