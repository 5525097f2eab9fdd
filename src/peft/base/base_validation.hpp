// Checking an adapter against its base model (a folder with config.json and safetensors weights).
//
// Every LoRA module must resolve to a base weight ("<module>.weight", also tried without / with the
// architecture's base_model_prefix, as transformers loads a headless checkpoint) whose shape fits:
//   Linear      base [out, in]          lora_A [r, in]         lora_B [out, r]
//   Conv1D      base [in, out]          lora_A [r, in]         lora_B [out, r]   (GPT-2)
//   Embedding   base [num, dim]         lora_embedding_A [r, num]   lora_embedding_B [dim, r]
//   Conv2d      base [out, in, kh, kw]  lora_A [r, in, kh, kw] lora_B [out, r, 1, 1]
// DoRA magnitudes are [out] ([dim] for embeddings, [1, out, 1, 1] for Conv2d); lora_B.bias is [out]
// and needs a base bias. Linear vs Conv1D is decided by the shapes; a square weight, which fits both,
// by the architecture table's kind for the module (Conv1D for GPT-2's c_attn, c_proj, c_fc). Full
// replacement tensors must exist in the base with the same shape; trainable-token rows must fit
// the embedding. A module on a stacked expert parameter (AdapterModule::expert) is checked by
// base/expert_base.hpp instead. Every problem is collected, and the error lists them all.
#pragma once

#include <string>
#include <vector>

#include "peft/adapter/adapter_config.hpp"
#include "peft/adapter/adapter_module.hpp"
#include "peft/base/base_model.hpp"
#include "peft/arch/arch_table.hpp"
#include "checkpoint/checkpoint.hpp"

namespace peft {

struct ValidationResult {
  std::vector<std::string> unresolved;  // adapter tensors with no base tensor
  std::vector<std::string> mismatched;  // shapes that do not fit
  std::vector<std::string> notes;
  bool ok() const { return unresolved.empty() && mismatched.empty(); }
};

// Resolves every module against the base: sets kinds (Linear / Conv1D) and base tensor names, and
// collects every problem. `adapter_weights` is the adapter's checkpoint (for tensor shapes).
ValidationResult check_against_base(std::vector<AdapterModule>& modules, const Checkpoint& adapter_weights,
                                    const LoraConfig& config, const BaseModel& base, const ArchTable* table);

// Throws PEFT_ERR_UNRESOLVED_KEY (if anything is unresolved) or PEFT_ERR_SHAPE_MISMATCH with every
// problem listed; does nothing when the result is ok.
void throw_if_failed(const ValidationResult& result, const std::string& adapter_dir, const std::string& base_dir);

}  // namespace peft
