// Whole-model task arithmetic on GGUF files (model_combine.hpp's arithmetic, which mergekit cannot
// apply to GGUF): a base GGUF model and fine-tuned GGUF models of it with the same tensor names and
// shapes give one GGUF file with the base's metadata and tensor types. Each float tensor, of a plain
// type (F32, F16, BF16) or a block-quantized one, is read to f32 (ggml's to_float), combined as
//   out = W + combine_i(w_i, M_i - W)
// and stored back in the base's type (ggml_quantize_chunk's rounding, as the GGUF merge re-quantizes);
// a model's tensor may have another type than the base's. Integer tensors are copied. One tensor at a
// time, written through a temporary renamed over the output at the end: memory is that of
// model_combine for the largest tensor, plus its stored bytes.
//
// Errors as combine_models, and: UNSUPPORTED for a base or model split into parts (join it first with
// llama-gguf-split --merge) and for a float tensor of a type without a quantizer here (naming it);
// INVALID_ARGUMENT for a GGUF adapter given as the base or a model.
#pragma once

#include <span>
#include <string>

#include "peft/combine/tensor_combine.hpp"

namespace peft {

// `task`: the combination (merge::TaskSettings of the method). options.dtype and max_shard_size must be
// unset (INVALID_ARGUMENT: a GGUF output keeps each tensor's type and is one file).
CheckpointMergeResult combine_gguf_models(const std::string& base_path, std::span<const std::string> model_paths,
                                          std::span<const double> weights, const merge::TaskSettings& task,
                                          const std::string& out_path, const ModelCombineOptions& options);

}  // namespace peft
