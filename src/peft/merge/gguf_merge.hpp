// Merging adapters into a GGUF base file, streaming:
//
//   base.gguf + adapters (+ weights) -> out.gguf: the same metadata, tensors, types and order
//
// Each adapter module is found in the base by its GGUF name, from the architecture table that
// lists the base's general.architecture (data/arch, "gguf" names; docs/gguf.md). Weights the
// converter stored with LLaMA's RoPE row order ("gguf_rows") are brought to PyTorch's row order,
// merged, and put back, so the result is exactly the GGUF of the merged PyTorch weight. A merged
// tensor is computed in f32 from the base's values (block-quantized ones dequantized as ggml does)
// with every adapter's delta added (as llama-export-lora does), then stored once in its output type
// (gguf_requant.hpp): its own type by default (F32, F16 or BF16 rounded to nearest even; a
// block-quantized type quantized again with ggml's reference quantizer), or options.quant / options.dtype
// for tensors of two or more dimensions. All other tensors are copied byte for byte. One merged tensor
// is in memory at a time; options.report fills result.store_report.
//
// An adapter may also be a GGUF LoRA file (MergeInput::gguf_lora): its pairs name the base's tensors
// directly, their rows already in GGUF's order, and are merged as llama-export-lora merges them
// (gguf_lora_input.hpp), in the given order among the PEFT adapters.
// Whole adapter tensors (modules_to_save copies, saved base weights and biases) replace the GGUF
// tensor of the same parameter (converted to its type, rows put in GGUF's order), before any LoRA
// term; a lora_B.bias is added (scaled like its module) to the module's "<name>.bias" tensor. Only
// the modules a MergeInput selects are merged (MergeInput::modules).
//
// Refused before anything is written, each listed: modules GGUF cannot place (no GGUF name for the
// architecture, or a tensor the base lacks, a bias included: PEFT_ERR_UNRESOLVED_KEY), trainable
// tokens (merged into safetensors checkpoints only) and targets whose base type cannot be dequantized
// or whose output type cannot be quantized here, or whose rows do not fill the output type's blocks
// (PEFT_ERR_UNSUPPORTED), and two adapters replacing the same tensor (PEFT_ERR_INVALID_ARGUMENT). A
// replacement of another shape is PEFT_ERR_SHAPE_MISMATCH. The output is written atomically and
// must not be the base file.
//
// A split base (gguf/gguf_split.hpp; any part names it) is written as the same parts, named after
// `out_path` (gguf_split_output_prefix), each with its base part's metadata and tensors, all parts or
// none (GgufWriter::commit_together); with options.join_split, as one file `out_path` joined as
// `llama-gguf-split --merge` joins parts (gguf_joined_metadata).
#pragma once

#include <string>

#include "peft/merge/checkpoint_merge.hpp"

namespace peft {

// options.max_shard_size must be unset, and options.dtype and options.quant not both set
// (INVALID_ARGUMENT). result.files holds the output files' names.
CheckpointMergeResult merge_into_gguf(const std::string& base_path, const std::string& out_path,
                                      const CheckpointMergeOptions& options);

}  // namespace peft
