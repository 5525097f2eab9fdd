"""Activated LoRA (aLoRA: PEFT's ``alora_invocation_tokens``, issue 33) against PEFT and llama.cpp.

An aLoRA adds its delta only to the tokens from the last occurrence of its invocation sequence on
(PEFT's ALoraLinearVariant with the offsets of ``calculate_alora_offsets``); PEFT refuses to merge it.
The adapter is made with PEFT in the test on the tiny llama fixture. Shown here:

* peft_c reads it (the invocation tokens through ``config_field``) and refuses, with UNSUPPORTED
  naming the activated LoRA, every job that would add it into a weight: ``peftc merge`` (safetensors
  and GGUF bases), a merge into a host buffer, a hot swap, ``peftc adapter combine`` and the
  conversion to plain LoRA.
* Served unmerged, by the rule the header documents for the host (``peft_lora_apply`` on the rows from
  the start of the last invocation sequence on, the other rows left alone), it gives PEFT's own
  forward layer by layer: F32 within 1e-5 of the output's scale, the rows before the invocation bit
  for bit the base layer's.
* Exported as a GGUF LoRA it carries ``adapter.alora.invocation_tokens`` (UINT32), as
  convert_lora_to_gguf.py writes it; llama.cpp's own loader (``llama_adapter_lora_init``, through the
  test driver ``llama_adapter_driver``) loads the file against the converted base and reads the same
  tokens; imported back, the adapter has them in its config and PEFT loads it and computes the same
  forward. A key of another element type is refused as llama.cpp refuses it.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from gguf_reference import (convert_hf_to_gguf, convert_lora_to_gguf, gguf_module, llama_cpp,  # noqa: E402
                            metadata, rewrite_gguf, run_peftc)

REPO = pathlib.Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "fixtures" / "models"
BASE = MODELS / "llama"
DRIVER = pathlib.Path(os.environ.get("PEFT_LLAMA_ADAPTER_DRIVER")
                      or REPO / "build" / "tests" / "interop" / "llama_adapter_driver")
# Three tokens of the tiny llama's vocabulary; the prompt below holds them twice, so that "the last
# occurrence" is what is tested.
INVOCATION = [5, 17, 9]
PROMPT = [1, 3, 5, 17, 9, 22, 30, 5, 17, 9, 41, 7, 12]
INVOCATION_START = 7  # the last occurrence
TARGETS = ["q_proj", "v_proj", "down_proj"]


def load_base():
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(BASE, dtype=torch.float32)


@pytest.fixture(scope="module")
def alora(tmp_path_factory) -> pathlib.Path:
    """A PEFT aLoRA on the tiny llama, with random (non-zero) factors."""
    from peft import LoraConfig, get_peft_model

    out = tmp_path_factory.mktemp("alora") / "adapter"
    torch.manual_seed(3)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False, lora_dropout=0.0,
                        alora_invocation_tokens=INVOCATION, task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        get_peft_model(load_base(), config).save_pretrained(str(out))
    assert json.loads((out / "adapter_config.json").read_text())["alora_invocation_tokens"] == INVOCATION
    return out


def peft_forward(adapter: pathlib.Path):
    """PEFT's forward of the prompt (it finds the invocation itself) with, for each adapted layer, its
    input, its base layer's output and its own output, rows = tokens; and the logits."""
    from peft import PeftModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = PeftModel.from_pretrained(load_base(), str(adapter)).eval()
    captured = {}

    def hook(name):
        def capture(module, args, output):
            x = args[0].detach().reshape(-1, args[0].shape[-1])
            captured[name] = (x.numpy().copy(), module.base_layer(args[0]).detach().reshape(len(x), -1).numpy().copy(),
                              output.detach().reshape(len(x), -1).numpy().copy())
        return capture

    handles = []
    for name, module in model.named_modules():
        if hasattr(module, "lora_A") and "default" in module.lora_A:
            handles.append(module.register_forward_hook(hook(name.removeprefix("base_model.model."))))
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT])).logits[0].numpy().copy()
    for handle in handles:
        handle.remove()
    return captured, logits


def test_read_and_every_merge_refused(alora, peftc_binary, peft_c, tmp_path):
    with peft_c.Adapter.open(alora, base_dir=BASE) as adapter:
        assert adapter.config_field("alora_invocation_tokens") == INVOCATION
        layer = next(m.name for m in adapter.modules if m.name.endswith("q_proj"))
        weight = np.zeros((64, 64), dtype=np.float32)
        with pytest.raises(peft_c.UnsupportedError, match="activated LoRA"):
            peft_c.merge_into(adapter, layer + ".weight", weight)
        with pytest.raises(peft_c.UnsupportedError, match="activated LoRA"):
            peft_c.combine_adapters([adapter], [1.0], tmp_path / "combined", method="linear")

    for args in (["merge", "--base", BASE, "--out", tmp_path / "merged", "--adapter", alora],
                 ["merge", "--base", convert_hf_to_gguf(BASE, outtype="f32"), "--out", tmp_path / "merged.gguf",
                  "--adapter", alora],
                 ["adapter", "convert", alora, tmp_path / "converted", "--to", "lora", "--rank", "2", "--base", BASE]):
        proc = run_peftc(peftc_binary, *args, expect=1)
        assert "UNSUPPORTED" in proc.stderr and "activated LoRA" in proc.stderr and "[5, 17, 9]" in proc.stderr, \
            proc.stderr
        assert not (tmp_path / "merged").exists() and not (tmp_path / "merged.gguf").exists()

    model = load_base()
    with peft_c.HostModel() as host, peft_c.Registry("F32", 1 << 30) as registry:
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.split(".")[-1] in TARGETS:
                host.add_weight(f"{name}.weight", module.weight.data)
        before = {n: p.clone() for n, p in model.named_parameters()}
        registry.register("alora", alora, base_dir=BASE)
        with registry.acquire("alora") as lease, pytest.raises(peft_c.UnsupportedError, match="activated LoRA"):
            host.swap(lease)
        assert host.current is None
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_unmerged_apply_from_the_invocation_on_is_peft_forward(alora, peft_c):
    captured, _ = peft_forward(alora)
    assert len(captured) == 2 * len(TARGETS)  # the tiny llama has two layers
    rows = np.full(len(PROMPT), -1, dtype=np.int32)
    rows[INVOCATION_START:] = 0  # the host's rule: the adapter from the start of the last invocation on
    worst = 0.0
    with peft_c.Registry("F32", 1 << 30) as registry:
        registry.register("alora", alora, base_dir=BASE)
        with registry.acquire("alora") as lease:
            for module, (x, base_out, peft_out) in captured.items():
                y = base_out.copy()
                peft_c.lora_apply(module, [lease], rows, x, y)
                before = slice(0, INVOCATION_START)
                assert np.array_equal(y[before].view(np.uint32), base_out[before].view(np.uint32)), module
                assert np.array_equal(peft_out[before].view(np.uint32), base_out[before].view(np.uint32)), module
                assert not np.array_equal(peft_out[INVOCATION_START:], base_out[INVOCATION_START:]), module
                rel = float(np.abs(y - peft_out).max() / np.abs(peft_out).max())
                worst = max(worst, rel)
                assert rel <= 1e-5, f"{module}: differs from PEFT's aLoRA forward by {rel:.3g} of its scale"
    print(f"aLoRA unmerged apply: {len(captured)} layers, worst relative difference to PEFT {worst:.3g}")


def llama_loads(model: pathlib.Path, adapter: pathlib.Path) -> dict:
    llama_cpp()  # skips without the reference build
    if not DRIVER.exists():
        pytest.skip(f"{DRIVER} not built (configure with the llama.cpp reference build's environment)")
    proc = subprocess.run([str(DRIVER), str(model), str(adapter)], capture_output=True, text=True)
    assert proc.returncode == 0, f"llama.cpp did not load {adapter}: {proc.stderr}"
    return json.loads(proc.stdout)


def test_gguf_export_loads_in_llama_cpp_and_imports_back(alora, peftc_binary, tmp_path):
    base_gguf = convert_hf_to_gguf(BASE, outtype="f32")
    ours = tmp_path / "alora.gguf"
    run_peftc(peftc_binary, "adapter", "export", alora, ours, "--format", "gguf", "--base", BASE)
    kv = metadata(ours)
    assert list(kv["adapter.alora.invocation_tokens"]) == INVOCATION
    field = gguf_module().GGUFReader(str(ours)).fields["adapter.alora.invocation_tokens"]
    assert field.types == [gguf_module().GGUFValueType.ARRAY, gguf_module().GGUFValueType.UINT32]
    reference = metadata(convert_lora_to_gguf(alora, BASE, outtype="f32"))
    assert list(reference["adapter.alora.invocation_tokens"]) == INVOCATION
    for key in ("general.type", "adapter.type", "adapter.lora.alpha", "adapter.alora.invocation_tokens"):
        assert kv[key] == reference[key], key

    loaded = llama_loads(base_gguf, ours)
    assert loaded["alora_invocation_tokens"] == INVOCATION
    assert float(loaded["alpha"]) == 8.0

    back = tmp_path / "imported"
    run_peftc(peftc_binary, "adapter", "export", ours, back, "--format", "peft", "--base", BASE)
    config = json.loads((back / "adapter_config.json").read_text())
    assert config["alora_invocation_tokens"] == INVOCATION
    _, want = peft_forward(alora)
    _, got = peft_forward(back)
    rel = float(np.abs(got - want).max() / np.abs(want).max())
    assert rel <= 1e-5, f"the imported aLoRA's PEFT forward differs by {rel:.3g}"

    # Another element type is refused, as llama.cpp refuses it ("invalid gguf element type").
    gguf = gguf_module()
    bad = rewrite_gguf(ours, tmp_path / "bad_i32.gguf",
                       {"adapter.alora.invocation_tokens": (list(INVOCATION),
                                                            gguf.GGUFValueType.ARRAY)})
    assert gguf.GGUFReader(str(bad)).fields["adapter.alora.invocation_tokens"].types[-1] != gguf.GGUFValueType.UINT32
    proc = run_peftc(peftc_binary, "adapter", "export", bad, tmp_path / "bad_import", "--format", "peft", "--base",
                     BASE, expect=1)
    assert "INVALID_CHECKPOINT" in proc.stderr and "adapter.alora.invocation_tokens" in proc.stderr, proc.stderr
