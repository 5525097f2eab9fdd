// Writes a PEFT LoRA adapter as a GGUF LoRA adapter that llama.cpp loads (llama-cli --lora,
// llama-export-lora), applying exactly PEFT's scale to every module:
//
//   KV: general.architecture (the base's GGUF architecture), general.type = "adapter",
//       adapter.type = "lora", adapter.lora.alpha (f32)
//   tensors: "<GGUF base tensor>.lora_a" = A (r, in) and ".lora_b" = B (out, r) as PyTorch holds
//   them (ne reversed); for token_embd, lora_a = A^T, as llama.cpp's convert_lora_to_gguf.py writes it.
//
// llama.cpp scales each pair by alpha / r_i, with the file's one alpha and the pair's own rank. PEFT's
// scale s_i (alpha/r or alpha/sqrt(r) with rsLoRA, after rank_pattern and alpha_pattern) is kept
// exactly by writing the config's lora_alpha and multiplying B by s_i x r_i / alpha where that is not
// 1 (in f64, rounded once to f32). Names and row orders come from the architecture table (its "gguf"
// names and "gguf_rows": B of a RoPE-permuted weight is permuted the same way).
//
// What GGUF LoRA cannot hold is refused with PEFT_ERR_UNSUPPORTED listing every module and why:
// DoRA magnitudes, lora_B.bias, whole replacement tensors (modules_to_save, saved base weights or
// biases), trainable tokens and layer kinds other than linear and embedding (gguf_lora_problem).
// In an adapter on a vision-language model, so are the modules outside its language model (its vision
// tower and projector), which a GGUF model does not hold (language_model_path).
// gguf_split_export.hpp merges those modules into a copy of the base instead.
// Modules with no GGUF tensor (no GGUF name, or absent from a GGUF base) are PEFT_ERR_UNRESOLVED_KEY.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "peft/adapter/adapter.hpp"

namespace peft {

struct GgufAdapterExportOptions {
  // The base: a Hugging Face model folder or hub id (config.json: model_type, head counts), or a
  // GGUF model file (general.architecture, head counts, and its tensors to check names against).
  // Empty: the adapter's base_model_name_or_path.
  std::string base;
  // ggml type of the factors: 0 F32 (default), 1 F16, 30 BF16, or 8 Q8_0 (a tensor whose rows are
  // not a multiple of 32 is written F16 instead, as llama.cpp's converter does).
  uint32_t ggml_type = 0;
  // Modules (AdapterModule::name) left out of the file: the split export merges them into the base.
  std::set<std::string> skip;
};

// Why a GGUF LoRA cannot hold `module`, or nullopt when it can.
std::optional<std::string> gguf_lora_problem(const AdapterModule& module);

// The base an export is for: options.base, else the adapter's base_model_name_or_path
// (INVALID_ARGUMENT when neither is given).
std::string gguf_export_base_name(const Adapter& adapter, const GgufAdapterExportOptions& options);

// Every module export_gguf_adapter refuses as PEFT_ERR_UNSUPPORTED (and the split export merges
// into a copy of the base instead): those gguf_lora_problem names; on a base with tied embeddings,
// the embedding LoRA modules that change one side alone (none for an ensure_weight_tying adapter);
// and in an adapter on a vision-language model, the modules outside its language model
// (language_model_path, peft/arch/gguf_experts.hpp).
std::set<std::string> gguf_lora_unsupported_modules(const Adapter& adapter, const GgufAdapterExportOptions& options);

void export_gguf_adapter(const Adapter& adapter, const std::string& out_path, const GgufAdapterExportOptions& options);

}  // namespace peft
