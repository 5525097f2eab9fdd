"""Makes (once) the data of the merge benchmarks (merge_vs_peft.py, merge_vs_device.py and the GGUF
ones) and prints where it is:

* a LLaMA-shaped bf16 base model with random weights: hidden 2048, 10 layers (or `layers`), 32 heads,
  intermediate 5632, vocabulary 32000, untied lm_head (about 645 M parameters, 1.3 GB; 150 layers make
  7.8 G parameters, 15.7 GB, the size of an 8B model), saved in shards of at most 500 MB with
  model.safetensors.index.json, as save_pretrained(max_shard_size="500MB") lays them out, plus
  config.json and generation_config.json;
* a rank-16 LoRA adapter (lora_alpha 32, f32 as PEFT saves it) on every linear layer of every decoder
  layer (q/k/v/o_proj, gate/up/down_proj), with random non-zero A and B.

Cached under ${XDG_CACHE_HOME:-~/.cache}/peft_c/bench/merge-<version>[-<layers>-layers]; a marker file is written
last, so an interrupted run is redone. Nothing is downloaded.

usage: python bench/merge_bench_data.py [ignored...]   (prints the folder)
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import sys

VERSION = "v2"
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


def cache_dir(layers: int = LAYERS) -> pathlib.Path:
    root = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    return root / "peft_c" / "bench" / (f"merge-{VERSION}" if layers == LAYERS else f"merge-{VERSION}-{layers}-layers")


SHARD_BYTES = 500 * 10**6  # save_pretrained(max_shard_size="500MB")


def base_tensors(layers: int) -> list[tuple[str, tuple[int, ...]]]:
    """The base's tensors in the order transformers saves them: name and shape."""
    names = [("model.embed_tokens.weight", (VOCAB, HIDDEN))]
    for i in range(layers):
        prefix = f"model.layers.{i}."
        names += [(prefix + name + ".weight", shape) for name, shape in LINEAR.items()]
        names += [(prefix + "input_layernorm.weight", (HIDDEN,)), (prefix + "post_attention_layernorm.weight", (HIDDEN,))]
    return names + [("model.norm.weight", (HIDDEN,)), ("lm_head.weight", (VOCAB, HIDDEN))]


def make_base(folder: pathlib.Path, layers: int) -> None:
    """Writes the shards one at a time (a 150-layer base is 15.7 GB: it never is in memory at once),
    filled greedily up to SHARD_BYTES as huggingface_hub's sharding does, with their index."""
    import torch
    from safetensors.torch import save_file
    from transformers import GenerationConfig, LlamaConfig

    shards: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in base_tensors(layers):
        nbytes = 2 * int(torch.Size(shape).numel())
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append((name, shape))
        size += nbytes
    g = torch.Generator().manual_seed(0)
    weight_map, total = {}, 0
    for n, shard in enumerate(shards, 1):
        file = f"model-{n:05d}-of-{len(shards):05d}.safetensors"
        state = {name: (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16) if len(shape) == 2
                 else torch.ones(shape, dtype=torch.bfloat16) for name, shape in shard}
        save_file(state, str(folder / file), metadata={"format": "pt"})
        weight_map.update({name: file for name in state})
        total += sum(t.numel() * 2 for t in state.values())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    LlamaConfig(hidden_size=HIDDEN, num_hidden_layers=layers, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                intermediate_size=INTERMEDIATE, vocab_size=VOCAB, max_position_embeddings=2048,
                tie_word_embeddings=False, dtype="bfloat16", architectures=["LlamaForCausalLM"]
                ).save_pretrained(str(folder))
    GenerationConfig(bos_token_id=1, eos_token_id=2).save_pretrained(str(folder))


def make_adapter(folder: pathlib.Path, base: pathlib.Path, layers: int) -> None:
    import torch
    from peft import LoraConfig
    from safetensors.torch import save_file

    LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=sorted({n.split(".")[-1] for n in LINEAR}),
               task_type="CAUSAL_LM", base_model_name_or_path=str(base)).save_pretrained(str(folder))
    g = torch.Generator().manual_seed(1)
    tensors = {}
    for i in range(layers):
        for name, (out, inp) in LINEAR.items():
            key = f"base_model.model.model.layers.{i}.{name}"
            tensors[key + ".lora_A.weight"] = torch.randn(RANK, inp, generator=g) / inp ** 0.5
            tensors[key + ".lora_B.weight"] = torch.randn(out, RANK, generator=g) * 0.01
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})


def ensure(layers: int = LAYERS) -> pathlib.Path:
    """The data's folder (base/ and adapter/), made first if it is not complete."""
    root = cache_dir(layers)
    marker = root / ".complete"
    if marker.exists():
        return root
    if root.exists():
        shutil.rmtree(root)
    (root / "base").mkdir(parents=True)
    (root / "adapter").mkdir()
    print(f"making the merge benchmark data in {root} (once)", file=sys.stderr)
    make_base(root / "base", layers)
    make_adapter(root / "adapter", root / "base", layers)
    marker.write_text(json.dumps({"hidden": HIDDEN, "layers": layers, "intermediate": INTERMEDIATE,
                                  "vocab": VOCAB, "rank": RANK}) + "\n")
    return root


if __name__ == "__main__":
    print(ensure())
