// The base tensors a LoRA module on a stacked expert parameter (adapter/expert_modules.hpp)
// changes, and how: the fused tensor as transformers 5 holds it in memory ("<module>.<param>",
// [E, out, in], or [E, in, out] transposed; gpt-oss saves it so), or, as transformers 5.24's
// save_pretrained writes Qwen3-MoE and Mixtral, one tensor per expert and per part of the out
// dimension ("<checkpoint module>.<e>.<per_expert name>", [out / parts, in]; gate then up).
// A fused tensor is used whenever the base has one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "peft/adapter/adapter_module.hpp"
#include "peft/arch/arch_table.hpp"
#include "peft/base/base_model.hpp"
#include "checkpoint/checkpoint.hpp"

namespace peft {

struct ExpertSlot {
  size_t base_index = 0;  // the base tensor
  int64_t expert = -1;    // the expert whose delta rows it holds; -1: the fused tensor of all experts
  int64_t row_begin = 0;  // per expert: the first of its rows within the parameter's out dimension
  int64_t rows = 0;       // per expert: how many
};

// The factors' sizes: in and out of the parameter ([E, out, in] in memory when not transposed).
struct ExpertFactorShape {
  int64_t experts = 0, rank = 0, in = 0, out = 0;
};
ExpertFactorShape expert_factor_shape(const AdapterModule& m, const Checkpoint& adapter_weights);

// The slots of module `m` (m.expert set) in the base; appends what does not resolve or fit to
// `unresolved` / `mismatched` (and returns no slots then).
std::vector<ExpertSlot> expert_slots(const AdapterModule& m, const Checkpoint& adapter_weights, const BaseModel& base,
                                     const ArchTable* table, std::vector<std::string>& unresolved,
                                     std::vector<std::string>& mismatched);

}  // namespace peft
