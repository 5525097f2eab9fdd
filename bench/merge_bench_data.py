"""Makes (once) the data of bench/merge_vs_peft.py and prints where it is:

* a LLaMA-shaped bf16 base model with random weights: hidden 2048, 10 layers, 32 heads, intermediate
  5632, vocabulary 32000, untied lm_head (about 645 M parameters, 1.3 GB), saved in three shards of
  at most 500 MB with model.safetensors.index.json, as save_pretrained(max_shard_size="500MB") lays
  them out, plus config.json and generation_config.json;
* a rank-16 LoRA adapter (lora_alpha 32, f32 as PEFT saves it) on every linear layer of every decoder
  layer (q/k/v/o_proj, gate/up/down_proj), with random non-zero A and B.

Cached under ${XDG_CACHE_HOME:-~/.cache}/peft_c/bench/merge-<version>; a marker file is written
last, so an interrupted run is redone. Nothing is downloaded.

usage: python bench/merge_bench_data.py [ignored...]   (prints the folder)
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

VERSION = "v1"
HIDDEN, LAYERS, HEADS, INTERMEDIATE, VOCAB, RANK, ALPHA = 2048, 10, 32, 5632, 32000, 16, 32
LINEAR = {
    "self_attn.q_proj": (HIDDEN, HIDDEN),
    "self_attn.k_proj": (HIDDEN, HIDDEN),
    "self_attn.v_proj": (HIDDEN, HIDDEN),
    "self_attn.o_proj": (HIDDEN, HIDDEN),
    "mlp.gate_proj": (INTERMEDIATE, HIDDEN),
    "mlp.up_proj": (INTERMEDIATE, HIDDEN),
    "mlp.down_proj": (HIDDEN, INTERMEDIATE),
}


def cache_dir() -> pathlib.Path:
    root = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return root / "peft_c" / "bench" / f"merge-{VERSION}"


def make_base(folder: pathlib.Path) -> None:
    import torch
    from huggingface_hub import save_torch_state_dict
    from transformers import GenerationConfig, LlamaConfig

    config = LlamaConfig(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                         num_key_value_heads=HEADS, intermediate_size=INTERMEDIATE, vocab_size=VOCAB,
                         max_position_embeddings=2048, tie_word_embeddings=False, dtype="bfloat16",
                         architectures=["LlamaForCausalLM"])
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return (torch.randn(*shape, generator=g, dtype=torch.float32) * 0.02).to(torch.bfloat16)

    state = {"model.embed_tokens.weight": randn(VOCAB, HIDDEN), "lm_head.weight": randn(VOCAB, HIDDEN),
             "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16)}
    for i in range(LAYERS):
        prefix = f"model.layers.{i}."
        for name, (out, inp) in LINEAR.items():
            state[prefix + name + ".weight"] = randn(out, inp)
        state[prefix + "input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        state[prefix + "post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    save_torch_state_dict(state, str(folder), max_shard_size="500MB", metadata={"format": "pt"})
    config.save_pretrained(str(folder))
    GenerationConfig(bos_token_id=1, eos_token_id=2).save_pretrained(str(folder))


def make_adapter(folder: pathlib.Path, base: pathlib.Path) -> None:
    import torch
    from peft import LoraConfig
    from safetensors.torch import save_file

    LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=sorted({n.split(".")[-1] for n in LINEAR}),
               task_type="CAUSAL_LM", base_model_name_or_path=str(base)).save_pretrained(str(folder))
    g = torch.Generator().manual_seed(1)
    tensors = {}
    for i in range(LAYERS):
        for name, (out, inp) in LINEAR.items():
            key = f"base_model.model.model.layers.{i}.{name}"
            tensors[key + ".lora_A.weight"] = torch.randn(RANK, inp, generator=g) / inp ** 0.5
            tensors[key + ".lora_B.weight"] = torch.randn(out, RANK, generator=g) * 0.01
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})


def ensure() -> pathlib.Path:
    root = cache_dir()
    marker = root / ".complete"
    if marker.exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    (root / "base").mkdir(parents=True)
    (root / "adapter").mkdir()
    print(f"making the merge benchmark data in {root} (once)", file=sys.stderr)
    make_base(root / "base")
    make_adapter(root / "adapter", root / "base")
    marker.write_text(json.dumps({"hidden": HIDDEN, "layers": LAYERS, "intermediate": INTERMEDIATE,
                                  "vocab": VOCAB, "rank": RANK}) + "\n")
    return root


if __name__ == "__main__":
    print(ensure())
