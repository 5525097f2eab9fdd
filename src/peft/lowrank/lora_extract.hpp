// LoRA extraction: a PEFT LoRA adapter from a fully fine-tuned checkpoint, dW = W_tuned - W_base
// per module, factored by truncated SVD (lora_lowrank.hpp), so that base + B A approximates the
// fine-tuned model.
//
// Inputs: two model folders (a single file, a sharded folder with its index, or a hub id resolved
// offline in the Hugging Face cache, as the merge takes them), of the same architecture and tensor
// names. Modules: by default the base's Linear and Conv1D layers that PEFT's "all-linear" names
// (the architecture table decides, lm_head excluded), or the modules `LowRankOptions::modules`
// selects as PEFT's target_modules would (exact names or suffixes); of those, the ones whose weight
// differs between the checkpoints. dW is formed in f32 from the two weights converted to f32 (one
// tensor pair per worker thread in memory). GPT-2's Conv1D weights ([in, out]) give factors that
// PEFT applies with fan_in_fan_out, which the config sets.
//
// The config: base_model_name_or_path = `base` as given, bias "none", init_lora_weights true,
// inference_mode true, lora_dropout 0, peft_type "LORA", task_type null, use_dora / use_rslora
// false, and r, lora_alpha, rank_pattern, alpha_pattern, target_modules as lora_lowrank.hpp says.
#pragma once

#include <string>
#include <vector>

#include "peft/lowrank/lora_lowrank.hpp"

namespace peft {

// Errors: NOT_FOUND / IO / format codes opening either checkpoint; UNRESOLVED_KEY listing the
// modules whose weight the tuned checkpoint lacks; SHAPE_MISMATCH naming a weight whose shapes
// differ; INVALID_ARGUMENT when no architecture table knows the base and no modules are named,
// when the modules named select nothing, or when no selected weight changed; UNSUPPORTED for a
// selected module that is not Linear or Conv1D (embeddings, convolutions); the errors of
// write_lowrank_adapter.
std::vector<LowRankModule> extract_lora(const std::string& base, const std::string& tuned, const std::string& out_dir,
                                        const LowRankOptions& options);

}  // namespace peft
