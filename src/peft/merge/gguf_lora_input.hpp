// A GGUF LoRA adapter (peft/adapter/gguf_lora_file.hpp) as an input of a merge into a GGUF base
// (gguf_merge.hpp), merged as llama.cpp's llama-export-lora merges it:
//
//   W += s * B·A,  s = weight * alpha / rank (f32 arithmetic), or s = weight when alpha is 0,
//
// with rank = the columns of lora_b (ggml's ne[0]). A pair on a stacked 3-D tensor (Mixtral's
// ffn_*_exps, as convert_lora_to_gguf.py stacks the experts' pairs) is 3-D too, one pair per slice. Names match the base's tensors directly and the
// rows are already in GGUF's order: nothing is translated or reordered. A pair on a tensor whose name
// starts with "token_embd" holds the transposed pair llama.cpp uses for embeddings: lora_a is A^T
// (num_embeddings x r) and lora_b is B (embedding_dim x r), the delta A^T·B^T. Factors of F32, F16,
// BF16 and Q8_0 (dequantized) are read as f32, each pair's own type.
//
// Checked before anything is written, every problem listed at once, each line with its code; the
// error has the code of the first kind found in this order:
//   INVALID_ARGUMENT    the adapter's general.architecture is not the base's
//   INVALID_CHECKPOINT  a pair without its lora_a or lora_b, factors that are not both 2-D or both 3-D;
//                       no pair at all
//   UNRESOLVED_KEY      a pair whose base tensor the base does not hold
//   SHAPE_MISMATCH      factors that do not fit the base tensor (or each other)
//   UNSUPPORTED         tensors that are not LoRA factors; factors of another type (the base tensor's
//                       type is checked by gguf_merge)
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "peft/adapter/gguf_lora_file.hpp"
#include "peft/buffer_merge/buffer_merge.hpp"
#include "checkpoint/checkpoint.hpp"

namespace peft {

// One pair merged into base tensor `tensor` (an index into the base): factors in f32, owned by
// module.keep_alive; module.scaling is s above, to be applied with weight 1.
struct GgufLoraTerm {
  size_t tensor = 0;
  uint64_t slice = 0;  // a stacked pair's slice of the tensor (its outermost index); 0 otherwise
  BufferMergeModule module;
};

// The terms of `lora` with `weight` for the GGUF base `base` of GGUF architecture `base_architecture`,
// in the order of the adapter's pairs. Throws as described above.
std::vector<GgufLoraTerm> gguf_lora_terms(const GgufLoraFile& lora, double weight, const Checkpoint& base,
                                          const std::string& base_architecture);

}  // namespace peft
