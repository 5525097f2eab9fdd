// Reads a GGUF LoRA adapter (llama.cpp's convert_lora_to_gguf.py output, or export_gguf_adapter's)
// and writes it as a PEFT LoRA adapter folder that PEFT loads and merges to the same weights that
// llama.cpp applies:
//
//   general.type must be "adapter" (else INVALID_ARGUMENT) and adapter.type "lora" (else
//   UNSUPPORTED); adapter.lora.alpha (f32, 0 when absent); general.architecture chooses the
//   architecture table (builtin_table_for_gguf).
//   Every tensor must be "<GGUF module>.weight.lora_a" or ".lora_b", in complete pairs; anything
//   else (norm or bias deltas, which a PEFT LoRA cannot hold) is UNSUPPORTED, listing them all.
//   A GGUF module the table does not name is UNRESOLVED_KEY, listing them all.
//   Factors of any ggml type that converts to F32, and Q8_0 (dequantized), are written as F32.
//   token_embd's lora_a holds A^T: it becomes PEFT's lora_embedding_A (transposed back) and
//   lora_embedding_B. B of a RoPE-permuted weight (rope_q/rope_k) gets PyTorch's row order back,
//   which needs the base's head counts: `base` (a Hugging Face folder or hub id, or a GGUF model
//   file) is required and becomes base_model_name_or_path.
//
// Scale: llama.cpp applies alpha / r_i to pair i (1 when alpha is 0). The config gets r = the most
// common rank (the smallest of the most common), rank_pattern for the modules of another rank, and
// lora_alpha = alpha, so that PEFT's alpha / r_i is the same; for alpha 0, lora_alpha = r and
// alpha_pattern gives each module of another rank its own rank as alpha: PEFT's scale is then 1.
#pragma once

#include <string>

namespace peft {

void import_gguf_adapter(const std::string& gguf_path, const std::string& out_dir, const std::string& base);

}  // namespace peft
