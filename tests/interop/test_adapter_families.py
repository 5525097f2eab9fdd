"""Every built-in architecture table against tiny random models of its family made by transformers:

* every tensor name of the saved base checkpoint and every key of an "all-linear" LoRA adapter that PEFT
  saves for it translates to a native name and back to itself (HF -> native -> HF is the identity);
* `peftc adapter inspect --base` detects the family from the base's config.json, validates the adapter
  against the base, finds exactly the LoRA modules PEFT made, and reports GPT-2's Conv1D layers as conv1d.
"""
from __future__ import annotations

import json
import pathlib
import subprocess

import pytest

peft = pytest.importorskip("peft")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors import safe_open  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from peft.tuners.lora import LoraLayer  # noqa: E402

TINY = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
            vocab_size=64, max_position_embeddings=64, head_dim=8)
BERTISH = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, vocab_size=64,
               max_position_embeddings=64)
GPT2 = dict(n_embd=16, n_layer=2, n_head=2, vocab_size=64, n_positions=64)

# (family table, config class, model class, config kwargs)
MODELS = {
    "llama": ("llama", "LlamaConfig", "LlamaForCausalLM", TINY),
    "mistral": ("mistral", "MistralConfig", "MistralForCausalLM", TINY),
    "mixtral": ("mixtral", "MixtralConfig", "MixtralForCausalLM", dict(TINY, num_local_experts=2, num_experts_per_tok=1)),
    "qwen2": ("qwen2", "Qwen2Config", "Qwen2ForCausalLM", TINY),
    "qwen3": ("qwen2", "Qwen3Config", "Qwen3ForCausalLM", TINY),
    "gemma": ("gemma", "GemmaConfig", "GemmaForCausalLM", TINY),
    "gemma2": ("gemma", "Gemma2Config", "Gemma2ForCausalLM", TINY),
    "gemma3_text": ("gemma", "Gemma3TextConfig", "Gemma3ForCausalLM", TINY),
    "phi3": ("phi3", "Phi3Config", "Phi3ForCausalLM", dict(TINY, pad_token_id=0)),
    "gpt2": ("gpt2", "GPT2Config", "GPT2LMHeadModel", GPT2),
    "gpt2_seq_cls": ("gpt2", "GPT2Config", "GPT2ForSequenceClassification", dict(GPT2, pad_token_id=0)),
    "gpt_neox": ("gpt_neox", "GPTNeoXConfig", "GPTNeoXForCausalLM",
                 dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, vocab_size=64,
                      max_position_embeddings=64)),
    "falcon": ("falcon", "FalconConfig", "FalconForCausalLM",
               dict(hidden_size=16, num_hidden_layers=2, num_attention_heads=2, vocab_size=64)),
    "bloom": ("bloom", "BloomConfig", "BloomForCausalLM", dict(hidden_size=16, n_layer=2, n_head=2, vocab_size=64)),
    "bert": ("bert", "BertConfig", "BertForSequenceClassification", BERTISH),
    "bert_mlm": ("bert", "BertConfig", "BertForMaskedLM", BERTISH),
    "roberta": ("roberta", "RobertaConfig", "RobertaForSequenceClassification", BERTISH),
    "distilbert": ("distilbert", "DistilBertConfig", "DistilBertForSequenceClassification",
                   dict(dim=16, hidden_dim=32, n_layers=2, n_heads=2, vocab_size=64, max_position_embeddings=64)),
    "t5": ("t5", "T5Config", "T5ForConditionalGeneration",
           dict(d_model=16, d_ff=32, d_kv=8, num_layers=2, num_heads=2, vocab_size=64)),
    "t5_gated": ("t5", "T5Config", "T5ForConditionalGeneration",
                 dict(d_model=16, d_ff=32, d_kv=8, num_layers=2, num_heads=2, vocab_size=64,
                      feed_forward_proj="gated-gelu", tie_word_embeddings=False)),
    "vit": ("vit", "ViTConfig", "ViTForImageClassification",
            dict(hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2, image_size=8,
                 patch_size=4, num_labels=3)),
}
SEQ_CLS = {"bert", "roberta", "distilbert", "gpt2_seq_cls"}
# "all-linear" except where PEFT 0.21 itself cannot use it: on Mixtral it adds target_parameters for the
# fused experts (refused by peft_c), and on DistilBERT SEQ_CLS it puts LoRA on pre_classifier and then
# fails to wrap it for modules_to_save ("classifier" is a suffix of "pre_classifier").
TARGETS = {
    "mixtral": ["q_proj", "k_proj", "v_proj", "o_proj"],
    "distilbert": ["q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"],
}


def keys_of(path: pathlib.Path) -> list[str]:
    with safe_open(str(path), framework="np") as f:
        return list(f.keys())


def translate(peftc, family, keys, *flags):
    run = subprocess.run([str(peftc), "translate", "--arch", family, *flags, "--", *keys],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = run.stdout.splitlines()
    assert len(out) == len(keys)
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """name -> (base folder, adapter folder, PEFT's LoRA module names); built once per module."""
    cache = {}

    def build(name):
        if name in cache:
            return cache[name]
        _, config_cls, model_cls, kwargs = MODELS[name]
        torch.manual_seed(0)
        model = getattr(transformers, model_cls)(getattr(transformers, config_cls)(**kwargs))
        root = tmp_path_factory.mktemp(name)
        model.save_pretrained(root / "base")
        task = "SEQ_CLS" if name in SEQ_CLS else None
        targets = TARGETS.get(name, "all-linear")
        peft_model = get_peft_model(model, LoraConfig(target_modules=targets, task_type=task,
                                                      init_lora_weights=False))
        peft_model.save_pretrained(root / "adapter")
        lora = {n.removeprefix("base_model.model.") for n, m in peft_model.named_modules()
                if isinstance(m, LoraLayer) and "default" in m.r}
        cache[name] = (root / "base", root / "adapter", lora)
        return cache[name]

    return build


@pytest.mark.parametrize("name", sorted(MODELS))
def test_round_trip_of_every_key(peftc_binary, made, name):
    family = MODELS[name][0]
    base, adapter, _ = made(name)
    base_keys = keys_of(base / "model.safetensors")
    adapter_keys = keys_of(adapter / "adapter_model.safetensors")
    native = translate(peftc_binary, family, base_keys)
    assert all("." not in n.split("/")[-2] for n in native if "/" in n)
    assert translate(peftc_binary, family, native, "--reverse") == base_keys
    prefixed = [k for k in adapter_keys if k.startswith("base_model.model.")]
    bare = [k for k in adapter_keys if not k.startswith("base_model.model.")]
    if prefixed:
        assert translate(peftc_binary, family, translate(peftc_binary, family, prefixed),
                         "--reverse", "--peft-prefix") == prefixed
    if bare:
        assert translate(peftc_binary, family, translate(peftc_binary, family, bare), "--reverse") == bare


@pytest.mark.parametrize("name", sorted(MODELS))
def test_inspect_with_base(peftc_binary, made, name):
    family = MODELS[name][0]
    base, adapter, lora = made(name)
    run = subprocess.run([str(peftc_binary), "adapter", "inspect", str(adapter), "--base", str(base), "--json"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["family"] == family
    assert report["validation"]["ok"]
    modules = {m["module"]: m for m in report["modules"] if m["kind"] in ("linear", "conv1d", "embedding", "conv2d")}
    assert set(modules) == lora
    conv1d = {n for n, m in modules.items() if m["kind"] == "conv1d"}
    if family == "gpt2":
        assert conv1d == {n for n in lora if n.split(".")[-1] in ("c_attn", "c_proj", "c_fc")}
    else:
        assert not conv1d
