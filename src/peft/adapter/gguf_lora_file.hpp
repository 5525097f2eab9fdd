// A GGUF LoRA adapter file, as llama.cpp's convert_lora_to_gguf.py and peft_c's GGUF export write it
// and llama.cpp reads it (src/llama-adapter.cpp, tools/export-lora): metadata general.type
// "adapter", adapter.type "lora", adapter.lora.alpha (f32; absent reads as 0, for which llama.cpp
// scales by 1), general.architecture and, for an activated LoRA, adapter.alora.invocation_tokens (a
// UINT32 array of token ids); for each base weight it changes, the pair of tensors
// "<base tensor>.lora_a" / "<base tensor>.lora_b", named and row-ordered as in the base GGUF.
//
// Opening checks the metadata only; the pairs are listed as found (complete or not), and what they
// mean for a base is for the reader to decide (the GGUF merge: merge/gguf_lora_input).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.hpp"

namespace peft {

// The factors of one base tensor: tensor indices into the file (nullopt when missing).
struct GgufLoraPair {
  std::string target;  // the base tensor's name, "blk.0.attn_q.weight"
  std::optional<size_t> a, b;
};

struct GgufLoraFile {
  std::string path;
  std::shared_ptr<const Checkpoint> file;
  std::string architecture;         // general.architecture
  float alpha = 0.0f;               // adapter.lora.alpha as llama.cpp reads it (f32)
  std::vector<uint32_t> alora_invocation_tokens;  // adapter.alora.invocation_tokens; empty: not aLoRA
  std::vector<GgufLoraPair> pairs;  // sorted by target
  std::vector<std::string> others;  // tensors named neither "*.lora_a" nor "*.lora_b"
};

// Opens `path` and checks its metadata: INVALID_ARGUMENT when it is not a GGUF file or its
// general.type is not "adapter" (a model file, say); UNSUPPORTED when adapter.type is not "lora";
// INVALID_CHECKPOINT when general.architecture is not a string, adapter.lora.alpha not a finite float
// or adapter.alora.invocation_tokens not an array of UINT32 token ids below 2^31 (llama.cpp's llama_token);
// the errors of opening a GGUF file.
std::shared_ptr<const GgufLoraFile> open_gguf_lora(const std::string& path);
// The same checks on a file already open (Checkpoint::open_memory, for the fuzzer); `path` names it
// in messages.
std::shared_ptr<const GgufLoraFile> open_gguf_lora(std::shared_ptr<const Checkpoint> file, const std::string& path);

// Whether a factor of this ggml type can be read as f32 by read_gguf_lora_factor: F32, F16, BF16, Q8_0.
bool gguf_lora_factor_readable(const TensorInfo& info);

// Tensor `index` of `file` as f32 values: F32/F16/BF16 converted, Q8_0 dequantized (core/quant/q8_0).
// UNSUPPORTED for any other type.
std::vector<float> read_gguf_lora_factor(const Checkpoint& file, size_t index);

}  // namespace peft
