"""Merges into GGUF bases with tied embeddings, against PEFT's own forward run by llama.cpp.

llama.cpp's converter writes no `output.weight` for a model with `tie_word_embeddings: true`, and
llama.cpp then computes the output from `token_embd.weight`. For a tiny random tied Llama converted by
convert_hf_to_gguf.py and PEFT adapters on `lm_head`, `embed_tokens`, both, with ensure_weight_tying
and a `modules_to_save` copy:

* `peftc merge --base BASE.gguf` (tied embeddings policy "untie", the default), run by llama.cpp (the
  test driver llama_cvec_driver, f32 KV cache), gives PEFT's unmerged forward logits within
  1e-5 of their largest value; where one side changes alone `output.weight` is added (the original
  embedding's bytes when only the input changes) and a note says so; an ensure_weight_tying adapter
  stays tied (no `output.weight`);
* `--tied-embeddings shared` gives the logits of PEFT's merge_and_unload model, in the one shared tensor;
* a Gemma 2 GGUF, whose output llama.cpp always takes from `token_embd`, refuses an untying merge
  (UNSUPPORTED naming the reason and the way out) and takes a shared one;
* `peftc adapter export --format gguf` against a tied base (the GGUF model, or its folder): llama.cpp
  applies a `token_embd` LoRA to the output too and finds no `output.weight` for an `lm_head` one, so an
  adapter changing one side is refused (UNSUPPORTED, saying to merge instead), and an ensure_weight_tying
  adapter is written as its `token_embd` pair alone, which llama-export-lora merges into the model that
  llama.cpp runs to PEFT's forward;
* with `--split-into BASE_OUT` the one-sided embedding change is merged into the copy of the base
  (which it unties) and the rest exported: llama-export-lora applying the GGUF LoRA to BASE_OUT (as GGUF)
  runs in llama.cpp to PEFT's forward, for a GGUF base and for the model folder.

Skipped (with the reason) when PEFT_LLAMA_CPP_BIN is not set or the driver is not built; scripts/test.sh
sets both.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import numpy as np
import pytest

from gguf_reference import convert_hf_to_gguf, export_lora, run_peftc, tensors  # noqa: E402

torch = pytest.importorskip("torch")

from merge_support import load_model  # noqa: E402
from test_tied_embeddings import CASES, make_adapter, make_base, peft_forward  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
DRIVER = pathlib.Path(os.environ.get("PEFT_LLAMA_CVEC_DRIVER")
                      or REPO / "build" / "tests" / "interop" / "llama_cvec_driver")
TOKENS = [1, 3, 5, 17, 9, 22, 30, 5, 60, 41]
GGUF_CASES = ["lm_head", "embed_tokens", "both", "ensure_weight_tying", "save_lm_head"]
UNSUPPORTED = 1  # peftc's exit code for a coded error


def gguf_logits(model: pathlib.Path) -> np.ndarray:
    if not DRIVER.exists():
        pytest.skip(f"{DRIVER} not built (configure with the llama.cpp reference build's environment)")
    proc = subprocess.run([str(DRIVER), str(model), ",".join(map(str, TOKENS))], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return np.array(json.loads(proc.stdout)["plain_logits"], dtype=np.float64)


def reference_logits(model) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor([TOKENS])).logits[0].double().numpy()


@pytest.fixture(scope="module")
def tied_llama(tmp_path_factory) -> tuple[pathlib.Path, pathlib.Path]:
    pytest.importorskip("transformers")
    folder = make_base("llama", tmp_path_factory.mktemp("gguf_tied_llama"))
    gguf = convert_hf_to_gguf(folder, tmp_path_factory.mktemp("gguf") / "base.gguf")
    assert "output.weight" not in tensors(gguf), "the converter wrote an output tensor for a tied model"
    return folder, gguf


def assert_close(ours: np.ndarray, ref: np.ndarray, what: str) -> None:
    error = float(np.abs(ours - ref).max() / np.abs(ref).max())
    assert error <= 1e-5, f"{what}: llama.cpp's logits differ from the reference by {error:.3g} of their largest value"


@pytest.mark.parametrize("case", GGUF_CASES)
def test_untied_gguf_merge_equals_peft_forward(case, tied_llama, peftc_binary, tmp_path):
    folder, gguf = tied_llama
    config, stays_tied = CASES[case]
    adapter = tmp_path / "adapter"
    make_adapter(folder, adapter, config)
    out = tmp_path / "merged.gguf"
    proc = run_peftc(peftc_binary, "merge", "--base", gguf, "--adapter", adapter, "--out", out)

    ref = peft_forward(folder, adapter, {"input_ids": torch.tensor([TOKENS])})[0].double().numpy()
    assert_close(gguf_logits(out), ref, case)
    # The base's own logits are far from the adapter's: the comparison can fail.
    assert float(np.abs(gguf_logits(gguf) - ref).max()) > 1e-3 * float(np.abs(ref).max())

    written = tensors(out)
    assert ("output.weight" in written) is not stays_tied
    if stays_tied:
        assert "which stays tied" in proc.stdout
    else:
        assert "output.weight\" was added holding the original embedding" in proc.stdout
    if case == "embed_tokens":  # the added output is the base's embedding, byte for byte
        base = tensors(gguf)["token_embd.weight"]
        assert written["output.weight"][0] == base[0]
        assert np.array_equal(np.asarray(written["output.weight"][2]), np.asarray(base[2]))


@pytest.mark.parametrize("case", ["lm_head", "embed_tokens", "both"])
def test_shared_gguf_merge_equals_merge_and_unload(case, tied_llama, peftc_binary, tmp_path):
    from peft import PeftModel

    folder, gguf = tied_llama
    adapter = tmp_path / "adapter"
    make_adapter(folder, adapter, CASES[case][0])
    out = tmp_path / "merged.gguf"
    proc = run_peftc(peftc_binary, "merge", "--base", gguf, "--adapter", adapter, "--out", out,
                     "--tied-embeddings", "shared")
    assert "output.weight" not in tensors(out)
    assert "tied embeddings policy \"shared\"" in proc.stdout
    merged = PeftModel.from_pretrained(load_model(folder), str(adapter)).merge_and_unload().eval()
    assert_close(gguf_logits(out), reference_logits(merged), case)


def test_gemma2_gguf_cannot_untie(peftc_binary, tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(3)
    config = transformers.Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                       max_position_embeddings=64, tie_word_embeddings=True)
    folder = tmp_path / "gemma2"
    transformers.Gemma2ForCausalLM(config).save_pretrained(str(folder))
    gguf = convert_hf_to_gguf(folder, tmp_path / "gemma2.gguf")
    assert "output.weight" not in tensors(gguf)
    adapter = tmp_path / "adapter"
    make_adapter(folder, adapter, CASES["lm_head"][0])
    proc = run_peftc(peftc_binary, "merge", "--base", gguf, "--adapter", adapter, "--out", tmp_path / "m.gguf",
                     expect=UNSUPPORTED)
    assert "UNSUPPORTED" in proc.stderr
    assert "reads no \"output.weight\"" in proc.stderr and "tied embeddings policy \"shared\"" in proc.stderr
    assert not (tmp_path / "m.gguf").exists()
    run_peftc(peftc_binary, "merge", "--base", gguf, "--adapter", adapter, "--out", tmp_path / "s.gguf",
              "--tied-embeddings", "shared")
    assert "output.weight" not in tensors(tmp_path / "s.gguf")


@pytest.mark.parametrize("case", ["lm_head", "embed_tokens", "both"])
def test_gguf_lora_export_refuses_one_sided_changes(case, tied_llama, peftc_binary, tmp_path):
    folder, gguf = tied_llama
    adapter = tmp_path / "adapter"
    make_adapter(folder, adapter, CASES[case][0])
    for base in (gguf, folder):
        out = tmp_path / "adapter.gguf"
        proc = run_peftc(peftc_binary, "adapter", "export", adapter, out, "--format", "gguf", "--base", base,
                         expect=UNSUPPORTED)
        assert "UNSUPPORTED" in proc.stderr and "ties its output embedding" in proc.stderr, proc.stderr
        assert "Merge it instead" in proc.stderr
        assert not out.exists()


def test_gguf_lora_export_of_tied_lora_equals_peft_forward(tied_llama, peftc_binary, tmp_path):
    folder, gguf = tied_llama
    adapter = tmp_path / "adapter"
    # Without the embeddings' saved base weights, which a GGUF LoRA cannot hold.
    make_adapter(folder, adapter, CASES["ensure_weight_tying"][0], save_embedding_layers=False)
    lora = tmp_path / "adapter.gguf"
    run_peftc(peftc_binary, "adapter", "export", adapter, lora, "--format", "gguf", "--base", gguf)
    names = set(tensors(lora))
    assert {"token_embd.weight.lora_a", "token_embd.weight.lora_b"} <= names
    assert not any(name.startswith("output.") for name in names)
    merged = export_lora(gguf, [(lora, 1.0)], tmp_path / "merged.gguf")
    ref = peft_forward(folder, adapter, {"input_ids": torch.tensor([TOKENS])})[0].double().numpy()
    assert_close(gguf_logits(merged), ref, "ensure_weight_tying exported")


@pytest.mark.parametrize("case", ["lm_head", "embed_tokens"])
def test_split_export_merges_one_sided_changes_into_the_base(case, tied_llama, peftc_binary, tmp_path):
    folder, gguf = tied_llama
    adapter = tmp_path / "adapter"
    make_adapter(folder, adapter, CASES[case][0])
    ref = peft_forward(folder, adapter, {"input_ids": torch.tensor([TOKENS])})[0].double().numpy()
    embedding = {"lm_head": "output.weight", "embed_tokens": "token_embd.weight"}[case]
    for base in (gguf, folder):
        lora = tmp_path / f"{base.name}.adapter.gguf"
        base_out = tmp_path / (f"{base.name}.merged.gguf" if base == gguf else f"{base.name}.merged")
        run_peftc(peftc_binary, "adapter", "export", adapter, lora, "--format", "gguf", "--base", base,
                  "--split-into", base_out)
        names = set(tensors(lora))
        assert names and not any(name.startswith(embedding) for name in names), names
        merged_base = base_out if base == gguf else convert_hf_to_gguf(base_out, tmp_path / "converted.gguf")
        assert "output.weight" in tensors(merged_base)  # untied
        merged = export_lora(merged_base, [(lora, 1.0)], tmp_path / f"{base.name}.final.gguf")
        assert_close(gguf_logits(merged), ref, f"{case}, split export against {base.name}")
