#!/usr/bin/env python3
"""Writes the seed corpora of the quantized-state and GGUF LoRA fuzzers (plain Python, no packages):

  corpus/gguf_lora/  GGUF LoRA adapters (the layout of llama.cpp's convert_lora_to_gguf.py and of
                     peft_c's GGUF export: general.type "adapter", adapter.type "lora",
                     adapter.lora.alpha, "<base tensor>.lora_a"/".lora_b"), each file also holding the
                     base tensors its pairs name, which the fuzzer uses as the base; and one file per
                     metadata or shape rule broken.
  corpus/bnb_state/  inputs of bnb_state_fuzzer.cpp (its header comment gives the format): bitsandbytes
                     4-bit states as transformers saves them (plain and double-quantized, NF4 and FP4),
                     int8 weights, config.json variants, and FP8 block-scale weights.

It rewrites the seeds it generates and keeps other files (fuzzer findings added by hand).
  python3 tests/fuzz/make_seeds.py
"""
from __future__ import annotations

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "fixtures", "generator"))
from malformed_gguf import (ARRAY, F32, SIZES, STRING, U32, T_F16, T_F32, T_Q4_K, T_Q8_0, Tensor, gguf,  # noqa: E402
                            kv, kv_str, s, u32, u64)

BF16 = 30  # ggml type
SIZES[BF16] = (1, 2)


def kv_f32(key: str, value: float) -> bytes:
    return kv(key, F32, struct.pack("<f", value))


def adapter_kvs(alpha: bytes | None = None, arch: str = "llama", gtype: str = "adapter", atype: str = "lora"):
    out = [kv_str("general.architecture", arch), kv_str("general.type", gtype), kv_str("adapter.type", atype)]
    out.append(kv_f32("adapter.lora.alpha", 16.0) if alpha is None else alpha)
    return out


# A base of two linear weights and an embedding (ggml order: ne[0] is the innermost dimension).
BASE = [Tensor("blk.0.attn_q.weight", [8, 6]), Tensor("token_embd.weight", [6, 10])]
PAIR_Q = [Tensor("blk.0.attn_q.weight.lora_a", [8, 2]), Tensor("blk.0.attn_q.weight.lora_b", [2, 6])]


def gguf_lora_seeds():
    yield "f32_pair", gguf(adapter_kvs(), BASE + PAIR_Q)
    yield "f16_pair_no_alpha", gguf(adapter_kvs()[:3], BASE[:1] + [
        Tensor("blk.0.attn_q.weight.lora_a", [8, 2], T_F16), Tensor("blk.0.attn_q.weight.lora_b", [2, 6], T_F16)])
    yield "bf16_pair", gguf(adapter_kvs(), BASE[:1] + [
        Tensor("blk.0.attn_q.weight.lora_a", [8, 2], BF16), Tensor("blk.0.attn_q.weight.lora_b", [2, 6], BF16)])
    yield "q8_0_pair", gguf(adapter_kvs(), [Tensor("blk.0.ffn_up.weight", [32, 4]),
                                            Tensor("blk.0.ffn_up.weight.lora_a", [32, 2], T_Q8_0),
                                            Tensor("blk.0.ffn_up.weight.lora_b", [2, 4])])
    # token_embd: lora_a is A^T [num, r] (ne [r, num]), lora_b [dim, r] (ne [r, dim]).
    yield "embedding_pair", gguf(adapter_kvs(), BASE[1:] + [
        Tensor("token_embd.weight.lora_a", [2, 10]), Tensor("token_embd.weight.lora_b", [2, 6])])
    # A stacked pair on 3-D experts [n, out, in]: lora_a [n, r, in], lora_b [n, out, r].
    yield "stacked_experts", gguf(adapter_kvs(), [
        Tensor("blk.0.ffn_up_exps.weight", [4, 3, 2]), Tensor("blk.0.ffn_up_exps.weight.lora_a", [4, 2, 2]),
        Tensor("blk.0.ffn_up_exps.weight.lora_b", [2, 3, 2])])
    yield "two_pairs", gguf(adapter_kvs(), BASE + PAIR_Q + [
        Tensor("token_embd.weight.lora_a", [2, 10]), Tensor("token_embd.weight.lora_b", [2, 6])])
    yield "alpha_nan", gguf(adapter_kvs(kv_f32("adapter.lora.alpha", float("nan"))), BASE + PAIR_Q)
    yield "alpha_inf", gguf(adapter_kvs(kv_f32("adapter.lora.alpha", float("inf"))), BASE + PAIR_Q)
    yield "alpha_u32", gguf(adapter_kvs(kv("adapter.lora.alpha", U32, u32(16))), BASE + PAIR_Q)
    yield "alpha_zero", gguf(adapter_kvs(kv_f32("adapter.lora.alpha", 0.0)), BASE + PAIR_Q)
    yield "adapter_type_control_vector", gguf(adapter_kvs(atype="control_vector"), BASE + PAIR_Q)
    yield "general_type_model", gguf(adapter_kvs(gtype="model"), BASE + PAIR_Q)
    yield "architecture_array", gguf([kv("general.architecture", ARRAY, u32(STRING) + u64(1) + s("llama"))] +
                                     adapter_kvs()[1:], BASE + PAIR_Q)
    yield "lone_lora_a", gguf(adapter_kvs(), BASE + PAIR_Q[:1])
    yield "q4_k_factor", gguf(adapter_kvs(), [Tensor("blk.0.ffn_up.weight", [256, 2]),
                                              Tensor("blk.0.ffn_up.weight.lora_a", [256, 2], T_Q4_K),
                                              Tensor("blk.0.ffn_up.weight.lora_b", [2, 2])])
    yield "rank_mismatch", gguf(adapter_kvs(), BASE[:1] + [
        Tensor("blk.0.attn_q.weight.lora_a", [8, 3]), Tensor("blk.0.attn_q.weight.lora_b", [2, 6])])
    yield "factor_1d", gguf(adapter_kvs(), BASE[:1] + [
        Tensor("blk.0.attn_q.weight.lora_a", [16]), Tensor("blk.0.attn_q.weight.lora_b", [2, 6])])
    yield "no_base_tensor", gguf(adapter_kvs(), PAIR_Q)
    yield "empty_adapter", gguf(adapter_kvs(), [])
    yield "suffix_only_names", gguf(adapter_kvs(), [Tensor(".lora_a", [2, 2]), Tensor(".lora_b", [2, 2])])


# bnb_state_fuzzer inputs: 8 control bytes, then NUL-separated text fields.
NF4_FP4, NESTED, REAL_MAP, FLIP_ABSMAX, INT8, CONFIG, NO_ABSMAX = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40
NO_PERTURB = 16 << 3  # byte 2: delta 0


def bnb(flags: int, state, config=None, pool: bytes = b"", perturb: int = NO_PERTURB, int8: int = 0x44) -> bytes:
    text = state if isinstance(state, str) else json.dumps(state)
    conf = "" if config is None else (config if isinstance(config, str) else json.dumps(config))
    return bytes([0, flags, perturb, int8, 0, 0, 0, 0]) + text.encode() + b"\0" + conf.encode() + b"\0" + pool


def floats(*values: float) -> bytes:
    return b"".join(struct.pack("<f", v) for v in values)


PLAIN = {"quant_type": "nf4", "blocksize": 64, "dtype": "bfloat16", "shape": [8, 16]}
NESTED_STATE = {"quant_type": "nf4", "blocksize": 64, "dtype": "float32", "shape": [8, 16],
                "nested_blocksize": 256, "nested_dtype": "float32", "nested_offset": 0.03125}
POOL = bytes(range(1, 200)) + floats(0.5, 1.0, 0.25, 2.0)


def fp8(ndims: int, dims: list[int], block_rows: int, block_cols: int, config=None, pool: bytes = b"") -> bytes:
    flags = (ndims - 2) | (0x04 if config is not None else 0)
    dims = [0] * (4 - len(dims)) + dims
    conf = "" if config is None else json.dumps(config)
    return bytes([1, flags] + dims + [block_rows - 1, block_cols - 1]) + conf.encode() + b"\0" + pool


FP8_CONFIG = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [2, 4], "activation_scheme": "dynamic"}}


def bnb_state_seeds():
    yield "nf4_plain", bnb(REAL_MAP, PLAIN, pool=floats(0.5, 1.5) + bytes(range(64)))
    yield "nf4_plain_pool_map", bnb(0, PLAIN, pool=POOL)
    yield "fp4_plain", bnb(NF4_FP4 | REAL_MAP, dict(PLAIN, quant_type="fp4"), pool=POOL)
    yield "nf4_nested", bnb(NESTED | REAL_MAP, NESTED_STATE, pool=POOL)
    yield "fp4_nested_odd", bnb(NF4_FP4 | NESTED | REAL_MAP, dict(NESTED_STATE, quant_type="fp4", shape=[3, 7],
                                                                   blocksize=4, nested_blocksize=2), pool=POOL)
    yield "nf4_blocksize_odd_shape", bnb(REAL_MAP, dict(PLAIN, shape=[5, 3], blocksize=7), pool=POOL)
    yield "nf4_absmax_inf", bnb(REAL_MAP, dict(PLAIN, shape=[2, 2]), pool=floats(float("inf")))
    yield "nf4_absmax_nan", bnb(REAL_MAP, dict(PLAIN, shape=[2, 2]), pool=floats(float("nan")))
    yield "nf4_type_mismatch", bnb(NF4_FP4 | REAL_MAP, PLAIN, pool=POOL)
    yield "nf4_blocksize_zero", bnb(REAL_MAP, dict(PLAIN, blocksize=0))
    yield "nf4_blocksize_huge", bnb(REAL_MAP, dict(PLAIN, blocksize=2 ** 64 - 1), pool=POOL)
    yield "nf4_shape_negative", bnb(REAL_MAP, dict(PLAIN, shape=[-1, 4]))
    yield "nf4_shape_overflow", bnb(REAL_MAP, dict(PLAIN, shape=[2 ** 40, 2 ** 40]))
    yield "nf4_no_blocksize", bnb(REAL_MAP, {"quant_type": "nf4", "shape": [4, 4]})
    yield "nf4_state_not_object", bnb(REAL_MAP, "[1, 2, 3]")
    yield "nf4_state_not_json", bnb(REAL_MAP, "{\"quant_type\": nf4")
    yield "nf4_nested_offset_string", bnb(NESTED | REAL_MAP, dict(NESTED_STATE, nested_offset="x"))
    yield "nf4_nested_no_tensors", bnb(REAL_MAP, NESTED_STATE, pool=POOL)
    yield "nf4_absmax_flipped", bnb(REAL_MAP | FLIP_ABSMAX, PLAIN, pool=POOL)
    yield "nf4_no_absmax", bnb(REAL_MAP | NO_ABSMAX, PLAIN)
    yield "nf4_packed_short", bnb(REAL_MAP, PLAIN, perturb=0 | (15 << 3))
    yield "nf4_absmax_long", bnb(REAL_MAP, PLAIN, perturb=1 | (17 << 3))
    yield "int8", bnb(INT8 | REAL_MAP, PLAIN, pool=POOL, int8=0x53)
    yield "int8_scb_short", bnb(INT8 | REAL_MAP, PLAIN, pool=POOL, int8=0x53, perturb=5 | (15 << 3))
    yield "config_other_method", bnb(CONFIG | REAL_MAP, PLAIN, {"quantization_config": {"quant_method": "gptq"}})
    yield "config_quant_storage", bnb(CONFIG | REAL_MAP, PLAIN, {"quantization_config": {
        "quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_storage": "bfloat16"}})
    yield "config_no_quantization", bnb(CONFIG | REAL_MAP, PLAIN, {"model_type": "llama"})
    yield "fp8_2d", fp8(2, [6, 10], 2, 4, pool=POOL)
    yield "fp8_3d_partial_blocks", fp8(3, [2, 5, 7], 3, 3, pool=POOL)
    yield "fp8_4d", fp8(4, [2, 3, 4, 4], 128, 128, pool=POOL)
    yield "fp8_block_huge", fp8(2, [9, 9], 256, 256, pool=POOL)
    yield "fp8_config", fp8(2, [6, 10], 1, 1, FP8_CONFIG, pool=POOL)
    yield "fp8_config_bad_block", fp8(2, [6, 10], 1, 1, {"quantization_config": {
        "quant_method": "fp8", "weight_block_size": [0, 128]}})
    yield "fp8_config_per_tensor", fp8(2, [6, 10], 1, 1, {"quantization_config": {
        "quant_method": "fp8", "weight_block_size": None}})
    yield "fp8_scales_nan", fp8(2, [4, 4], 2, 2, pool=bytes([0x38] * 16) + floats(float("nan"), 1.0, float("inf"), 0.0))


def write(target: str, seeds, suffix: str) -> None:
    folder = os.path.join(HERE, "corpus", target)
    os.makedirs(folder, exist_ok=True)
    for name, data in seeds:
        with open(os.path.join(folder, name + suffix), "wb") as f:
            f.write(data)


def main() -> None:
    write("gguf_lora", gguf_lora_seeds(), ".gguf")
    write("bnb_state", bnb_state_seeds(), ".bin")


if __name__ == "__main__":
    main()
