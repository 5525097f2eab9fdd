// Conversion of adapters to plain LoRA, as PEFT 0.21 does it:
//
// * convert_to_lora: any module whose weight change dW the library computes (adapter_delta.hpp;
//   today LoRA Linear and Conv1D modules) re-factored by truncated SVD to a fixed rank or an energy
//   fraction (PEFT's peft.tuners.lora.conversion.convert_to_lora and save_as_lora; lora_lowrank.hpp
//   has the rule and the config). The new config keeps the source's target_modules (a list is
//   extended by the module names), base_model_name_or_path, layers_to_transform and layers_pattern,
//   and is otherwise a fresh LoraConfig: scaling 1, no rank/alpha patterns but those of the energy
//   choice. Refused (UNSUPPORTED) as PEFT refuses them: lora_bias, DoRA, embedding and conv
//   modules, modules_to_save / full tensors and trainable tokens.
//
// * convert_initial_to_lora: a PiSSA / CorDA / OLoRA / LoRA-GA (or LoftQ) initialised adapter after
//   training, with the adapter saved right after initialisation, becomes a LoRA on the original
//   base, exactly as PeftModel.save_pretrained(path_initial_model_for_weight_conversion=...) does
//   (LoraModel.subtract_mutated_init): dW = B A - B0 A0, so A' = [A; A0] (rows) and
//   B' = [B, -B0] (columns); rank doubles. The config is the fine-tuned adapter's with
//   init_lora_weights true, r and rank_pattern values doubled, lora_alpha and alpha_pattern values
//   doubled (with use_rslora, lora_alpha times sqrt(2) and no patterns allowed, as PEFT refuses
//   them). PEFT keeps only lora_A/lora_B tensors here; an adapter with any other tensor (DoRA
//   magnitudes, lora_B.bias, embeddings, modules_to_save) is refused rather than silently
//   truncated. Tensors keep their dtype (an F32/BF16 mix is written F32, as torch.cat promotes).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "core/dtype.hpp"
#include "peft/adapter/adapter.hpp"
#include "peft/lowrank/lora_lowrank.hpp"

namespace peft {

// Errors: UNSUPPORTED naming a module that does not convert; the errors of write_lowrank_adapter.
std::vector<LowRankModule> convert_to_lora(const Adapter& adapter, const std::string& out_dir,
                                           const LowRankOptions& options);

// Both adapters are folders (or hub ids), opened as PEFT opens them for this (init_lora_weights
// taken as true; the strict loader refuses "pissa" and the like). Errors: those of opening an
// adapter; UNSUPPORTED for non-factor tensors or use_rslora with patterns; INVALID_ARGUMENT when the
// two adapters' modules differ; SHAPE_MISMATCH for factors whose shapes differ; write errors.
void convert_initial_to_lora(const std::string& tuned_dir, const std::string& initial_dir, const std::string& out_dir,
                             const std::optional<DType>& dtype);

}  // namespace peft
